// pagoda: the command-line entry point. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "pagoda/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"pagoda: fast LLM inference for Llama-family models"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const pagoda::Error& e) {
    std::fprintf(stderr, "pagoda: %s\n", e.what());
    return 1;
  }
  return 0;
}
