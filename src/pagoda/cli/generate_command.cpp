// pagoda generate: complete a prompt, streaming the text, then report prefill and decode speed.
#include <cstdio>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/generation.h"
#include "pagoda/cli/flags.h"
#include "pagoda/core/error.h"

namespace pagoda::cli {

void register_generate(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    SamplingParams sampling{.max_tokens = 128};
    std::string prompt;
    bool no_bos = false;
    std::string early_stopping = "false";
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("generate", "complete a prompt, streaming the text");
  add_model_flags(*cmd, flags->model);
  add_sampling_flags(*cmd, flags->sampling);
  cmd->add_option("-p,--prompt", flags->prompt, "the text to complete")->required();
  cmd->add_flag("--no-bos", flags->no_bos, "do not add the BOS token even if the model wants one");
  cmd->add_option("--beam-width", flags->sampling.beam_width,
                  "beam search with this many beams, 1-64 (deterministic: temperature 0 unless given)");
  cmd->add_option("--length-penalty", flags->sampling.length_penalty,
                  "beam search: hypothesis score = log-prob / length^X (default 1)");
  cmd->add_option("--early-stopping", flags->early_stopping, "beam search: true, false (default) or never");
  cmd->add_option("--num-return", flags->sampling.num_return, "beam search: hypotheses to print, 1..beam width");
  cmd->callback([flags, cmd] {
    if (flags->sampling.beam_width > 0) {
      if (cmd->count("--temperature") == 0) flags->sampling.temperature = 0.f;
      const std::string& e = flags->early_stopping;
      if (e != "true" && e != "false" && e != "never")
        fail(ErrorKind::kInvalidArgument, "--early-stopping must be true, false or never, got '{}'", e);
      flags->sampling.early_stopping = e == "true"    ? EarlyStopping::kTrue
                                       : e == "never" ? EarlyStopping::kNever
                                                      : EarlyStopping::kFalse;
    } else if (cmd->count("--length-penalty") + cmd->count("--early-stopping") + cmd->count("--num-return") > 0) {
      fail(ErrorKind::kInvalidArgument, "--length-penalty, --early-stopping and --num-return need --beam-width");
    }
    validate(flags->sampling);
    Session session(flags->model);
    Engine engine(*session.model, session.tokenizer, session.engine_options);
    Request request{.prompt = session.tokenizer.encode(flags->prompt,
                                                       !flags->no_bos && session.tokenizer.add_bos_by_default()),
                    .params = flags->sampling};
    const bool beam = flags->sampling.beam_width > 0;
    if (!beam) std::fputs(flags->prompt.c_str(), stdout);
    const GenerationResult result = run_request(engine, std::move(request), [](const std::string& text) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    });
    if (!beam) std::fputc('\n', stdout);
    // A beam search has no text to stream: its hypotheses come at the end, best first.
    for (size_t i = 0; i < result.beams.size(); ++i) {
      const BeamOutput& beam = result.beams[i];
      std::printf("%s[beam %zu: score %.4f, cumulative log-prob %.4f, %zu tokens, finish %s]\n%s%s\n",
                  i == 0 ? "" : "\n", i + 1, double(beam.score), double(beam.cumulative_logprob), beam.tokens.size(),
                  finish_reason_name(beam.finish), flags->prompt.c_str(), beam.text.c_str());
    }
    std::fflush(stdout);
    if (!beam) {
      print_speed(result);
    } else {  // one event at the end: no first-token time to split prefill from decode
      const double seconds = result.prefill_seconds + result.decode_seconds;
      std::fprintf(stderr, "\n[beam search: %d prompt tokens, %d tokens generated over all beams, %.2f s, %.1f tok/s]\n",
                   result.prompt_tokens, result.generated_tokens, seconds,
                   seconds > 0 ? result.generated_tokens / seconds : 0.0);
    }
  });
}

}  // namespace pagoda::cli
