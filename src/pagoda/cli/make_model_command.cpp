// pagoda make-model: a Hugging Face checkpoint with random weights and the exact shape of a public
// model (bench/model_presets.h), for benchmarks at real sizes without downloading anything; pagoda and
// transformers both load it (bench/hf_generate.py runs the latter on it).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "pagoda/cli/commands.h"
#include "pagoda/bench/model_presets.h"
#include "pagoda/bench/model_writer.h"
#include "pagoda/core/error.h"

namespace pagoda::cli {

void register_make_model(CLI::App& app) {
  struct Flags {
    std::string arch;
    int layers = 0;  // 0: the architecture's
    std::string dtype = "fp16";
    uint64_t seed = 0;
    std::string out;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("make-model", "write a checkpoint with random weights and a real model's shape");
  cmd->add_option("--arch", flags->arch, "llama2-7b, llama3-8b, llama2-70b, llama3-70b, qwen2.5-7b, qwen2.5-14b, or tiny / tiny-qwen2 for tests");
  cmd->add_option("--layers", flags->layers, "transformer layers (default: the architecture's)");
  cmd->add_option("--dtype", flags->dtype, "weight type: fp16 (default) or bf16");
  cmd->add_option("--seed", flags->seed, "seed of the weights (default 0)");
  cmd->add_option("--out", flags->out, "folder to write (created when missing)");
  cmd->callback([flags, cmd] {
    if (flags->arch.empty())
      fail(ErrorKind::kInvalidArgument, "make-model needs --arch ({})", fmt::join(bench::model_preset_names(), ", "));
    if (flags->out.empty()) fail(ErrorKind::kInvalidArgument, "make-model needs --out DIR");
    ModelConfig config = bench::model_preset(flags->arch);
    if (cmd->count("--layers") > 0) {
      if (flags->layers < 1 || flags->layers > 1024)
        fail(ErrorKind::kInvalidArgument, "--layers must be in [1, 1024], not {}", flags->layers);
      config.num_layers = flags->layers;
    }
    if (flags->dtype != "fp16" && flags->dtype != "bf16")
      fail(ErrorKind::kInvalidArgument, "--dtype must be fp16 or bf16, not '{}'", flags->dtype);
    const DType dtype = flags->dtype == "bf16" ? DType::kBF16 : DType::kF16;

    const auto start = std::chrono::steady_clock::now();
    const uint64_t bytes = bench::write_random_checkpoint(config, flags->out, {.dtype = dtype, .seed = flags->seed});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s: %s shape, %d layers, %s, seed %llu, %.2f GB of weights in %.1f s (%.2f GB/s)\n",
                flags->out.c_str(), flags->arch.c_str(), config.num_layers, flags->dtype.c_str(),
                static_cast<unsigned long long>(flags->seed), double(bytes) / 1e9, seconds, double(bytes) / 1e9 / seconds);
  });
}

}  // namespace pagoda::cli
