// pagoda generate: complete a prompt, streaming the text, then report prefill and decode speed.
#include <cstdio>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/generation.h"
#include "pagoda/cli/flags.h"

namespace pagoda::cli {

void register_generate(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    SamplingParams sampling{.max_tokens = 128};
    std::string prompt;
    bool no_bos = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("generate", "complete a prompt, streaming the text");
  add_model_flags(*cmd, flags->model);
  add_sampling_flags(*cmd, flags->sampling);
  cmd->add_option("-p,--prompt", flags->prompt, "the text to complete")->required();
  cmd->add_flag("--no-bos", flags->no_bos, "do not add the BOS token even if the model wants one");
  cmd->callback([flags] {
    validate(flags->sampling);
    Session session(flags->model);
    Engine engine(*session.model, session.tokenizer, session.engine_options);
    Request request{.prompt = session.tokenizer.encode(flags->prompt,
                                                       !flags->no_bos && session.tokenizer.add_bos_by_default()),
                    .params = flags->sampling};
    std::fputs(flags->prompt.c_str(), stdout);
    const GenerationResult result = run_request(engine, std::move(request), [](const std::string& text) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    print_speed(result);
  });
}

}  // namespace pagoda::cli
