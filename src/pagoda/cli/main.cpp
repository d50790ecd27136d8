// pagoda: the command-line entry point. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "pagoda/cli/commands.h"
#include "pagoda/core/error.h"

namespace {

// OpenMP (CPU attention and the model loader use it) keeps its idle threads spinning after each
// region; on a shared machine those polls take the cores the CPU backend's own pool and other
// processes need (docs/experiments/cpu-quantized-matmul.md). libgomp reads its wait policy once,
// before main, so the one way to choose it here is to start again with it set. A policy the user
// set stays; if the exec fails, pagoda runs on with libgomp's default.
void prefer_passive_openmp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_openmp_waits(argv);
  CLI::App app{"pagoda: fast LLM inference for Llama-family models"};
  app.require_subcommand(1);
  pagoda::cli::register_generate(app);
  pagoda::cli::register_chat(app);
  pagoda::cli::register_bench(app);
  pagoda::cli::register_serve(app);
  pagoda::cli::register_make_model(app);
  pagoda::cli::register_perplexity(app);
  pagoda::cli::register_quantize(app);
  // CLI11 would only say "a subcommand is required"; name the word it did not know.
  const auto known = app.get_subcommands([&](const CLI::App* sub) { return argc > 1 && sub->get_name() == argv[1]; });
  if (argc > 1 && argv[1][0] != '-' && known.empty()) {
    std::fprintf(stderr, "pagoda: error: unknown command '%s' (commands: generate, chat, serve, bench, make-model, perplexity, quantize; see --help)\n", argv[1]);
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const pagoda::Error& e) {
    std::fprintf(stderr, "pagoda: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // a bug or the system (bad_alloc): still one line, no abort
    std::fprintf(stderr, "pagoda: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
