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
// `bench attention`, registered on the `bench` subcommand by register_bench.
void register_bench_attention(CLI::App& bench);
void register_bench_prefix(CLI::App& bench);
// `bench throughput`, likewise.
void register_bench_throughput(CLI::App& bench);

}  // namespace pagoda::cli
