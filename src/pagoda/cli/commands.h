// The pagoda subcommands; each registers itself on the top-level app.
#pragma once

#include <CLI/CLI.hpp>

namespace pagoda::cli {

void register_generate(CLI::App& app);
void register_chat(CLI::App& app);
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);
void register_make_model(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_quantize(CLI::App& app);

}  // namespace pagoda::cli
