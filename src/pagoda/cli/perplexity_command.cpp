// pagoda perplexity: perplexity of a model over a text, as llama.cpp's perplexity tool measures
// it (consecutive windows of the context size, the first half of each window as context, the
// second half scored), and against a saved base run the KL divergence and top-1 agreement of the
// next-token distributions: what a KV cache format costs in accuracy.
//
// The first half of a window is prefilled in one step; the second half is decoded one token per
// step, each step's logits scoring the next token, so every scored token reads the cache as
// generation does (int2's V tail included).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/perplexity.h"
#include "pagoda/cli/flags.h"
#include "pagoda/core/error.h"

namespace pagoda::cli {

void register_perplexity(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    std::string file, kl_base, save_base, json;
    int window = 512;
    int chunks = 0;
    int top_k = 32;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("perplexity", "perplexity over a text, and KL divergence against a base run");
  add_model_flags(*cmd, flags->model);
  cmd->add_option("-f,--file", flags->file, "the text")->required();
  cmd->add_option("-c,--ctx-size", flags->window, "tokens per window; the second half is scored (default 512)");
  cmd->add_option("--chunks", flags->chunks, "score at most this many windows (default: all the text holds)");
  cmd->add_option("--kl-base", flags->kl_base, "a base run saved by --save-base: report KL divergence and top-1 agreement");
  cmd->add_option("--save-base", flags->save_base, "save this run's next-token distributions (top --top-k) as a base");
  cmd->add_option("--top-k", flags->top_k, "tokens per position saved by --save-base (default 32)");
  cmd->add_option("--json", flags->json, "also write the results to this JSON file");
  cmd->callback([flags] {
    const Flags& f = *flags;
    if (f.window < 4 || f.window % 2 != 0) fail(ErrorKind::kInvalidArgument, "--ctx-size must be an even number >= 4");
    if (f.chunks < 0) fail(ErrorKind::kInvalidArgument, "--chunks must be >= 0");
    if (f.top_k < 1 || f.top_k > 4096) fail(ErrorKind::kInvalidArgument, "--top-k must be in [1, 4096]");
    std::ifstream in(f.file, std::ios::binary);
    if (!in) fail(ErrorKind::kInvalidArgument, "-f: cannot read '{}'", f.file);
    std::stringstream text;
    text << in.rdbuf();
    PerplexityBase base;
    if (!f.kl_base.empty()) base = load_perplexity_base(f.kl_base);  // a bad file fails before the model loads

    Session session(f.model);
    StepModel& model = *session.model;
    const ModelConfig& c = model.config();
    if (f.window > c.max_context)
      fail(ErrorKind::kInvalidArgument, "--ctx-size {} exceeds the model's context of {} tokens", f.window, c.max_context);
    const std::vector<int32_t> tokens = session.tokenizer.encode(text.str(), false);
    int64_t windows = int64_t(tokens.size()) / f.window;
    if (windows == 0)
      fail(ErrorKind::kInvalidArgument, "'{}' has {} tokens, fewer than one window of {}", f.file, tokens.size(), f.window);
    if (f.chunks > 0) windows = std::min<int64_t>(windows, f.chunks);
    const int32_t half = f.window / 2;
    const int64_t scored = windows * (f.window - half);
    // A base of more windows serves a shorter run: its first windows are this run's.
    if (!f.kl_base.empty() && (base.window != f.window || int64_t(base.targets.size()) < scored))
      fail(ErrorKind::kInvalidArgument, "--kl-base scored {} tokens in windows of {}; this run scores {} in windows of {}",
           base.targets.size(), base.window, scored, f.window);

    const int32_t vocab = std::min(session.tokenizer.vocab_size(), int32_t(c.vocab_size));
    const int32_t block_size = session.engine_options.block_size;
    const int32_t num_blocks = (f.window + block_size - 1) / block_size;
    model.allocate_kv_cache(num_blocks, block_size);
    std::vector<int32_t> block_ids(static_cast<size_t>(num_blocks));
    std::iota(block_ids.begin(), block_ids.end(), 0);

    double nll = 0, kl = 0;
    int64_t position = 0, agree = 0;
    PerplexityBase saved{.window = f.window};
    const auto start = std::chrono::steady_clock::now();
    auto score = [&](std::span<const float> logits, int32_t target) {
      const std::vector<double> logprobs = log_softmax(logits.first(size_t(vocab)));
      nll -= logprobs[size_t(target)];
      if (!f.kl_base.empty()) {
        const TopTokens& b = base.positions[size_t(position)];
        if (base.targets[size_t(position)] != target)
          fail(ErrorKind::kInvalidArgument, "--kl-base scored another text: its token {} is {}, here {}", position,
               base.targets[size_t(position)], target);
        for (int32_t id : b.ids)
          if (id < 0 || id >= vocab) fail(ErrorKind::kInvalidArgument, "--kl-base names token {} outside the vocabulary", id);
        kl += top_k_kl(b, logprobs);
        agree += top_tokens(logprobs, 1).ids[0] == b.ids[0];
      }
      if (!f.save_base.empty()) {
        saved.targets.push_back(target);
        saved.positions.push_back(top_tokens(logprobs, f.top_k));
      }
      ++position;
    };
    for (int64_t w = 0; w < windows; ++w) {
      const std::span<const int32_t> window = std::span(tokens).subspan(size_t(w * f.window), size_t(f.window));
      const SequenceChunk context{.tokens = window.first(size_t(half)), .start_pos = 0, .block_ids = block_ids,
                                  .want_logits = true};
      score(model.forward({&context, 1}), window[size_t(half)]);
      for (int32_t j = half; j + 1 < f.window; ++j) {
        const SequenceChunk step{.tokens = window.subspan(size_t(j), 1), .start_pos = j, .block_ids = block_ids,
                                 .want_logits = true};
        score(model.forward({&step, 1}), window[size_t(j) + 1]);
      }
      std::fprintf(stderr, "[%lld/%lld] perplexity %.4f\n", static_cast<long long>(w + 1),
                   static_cast<long long>(windows), std::exp(nll / double(position)));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double ppl = std::exp(nll / double(position));
    std::printf("perplexity %.4f over %lld tokens (%lld windows of %d, second halves scored), kv %s, %.1f s\n", ppl,
                static_cast<long long>(position), static_cast<long long>(windows), f.window,
                f.model.kv_cache_dtype.c_str(), seconds);
    nlohmann::json result{{"file", f.file},
                          {"window", f.window},
                          {"windows", windows},
                          {"scored_tokens", position},
                          {"kv_cache_dtype", f.model.kv_cache_dtype},
                          {"kv_partition", f.model.kv_partition},
                          {"kv_rotation", f.model.kv_rotation},
                          {"kv_key_dtype", f.model.kv_key_dtype},
                          {"kv_sink_tokens", f.model.kv_sink_tokens},
                          {"kv_rounding", f.model.kv_rounding},
                          // Per token, all layers and kv heads; an int2 cache's tail and sinks excluded.
                          {"kv_bytes_per_token", double(model.kv_block_bytes(block_size)) / block_size},
                          {"perplexity", ppl},
                          {"seconds", seconds}};
    if (!f.kl_base.empty()) {
      const double mean_kl = kl / double(position), agreement = double(agree) / double(position);
      std::printf("mean KL divergence from the base %.6f, top-1 agreement %.4f\n", mean_kl, agreement);
      result["mean_kl"] = mean_kl;
      result["top1_agreement"] = agreement;
    }
    if (!f.save_base.empty()) save_perplexity_base(f.save_base, saved);
    if (!f.json.empty()) {
      std::ofstream out(f.json);
      out << result.dump(2) << '\n';
      if (!out) fail(ErrorKind::kInvalidArgument, "--json: cannot write '{}'", f.json);
    }
  });
}

}  // namespace pagoda::cli
