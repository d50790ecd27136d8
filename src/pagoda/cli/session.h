// What every subcommand that runs a model shares: the flags that choose and load it, the sampling
// flags, and the loaded model with its tokenizer.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "pagoda/backend/backend.h"
#include "pagoda/engine/engine.h"
#include "pagoda/engine/sampling_params.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model.h"
#include "pagoda/tokenizer/chat_template.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {

struct ModelFlags {
  std::string path;  // empty: the default model
  std::string backend = "auto";  // cpu, cuda, or auto: cuda when built with it and a GPU is present
  std::string weight_dtype = "auto";  // f16, bf16, f32, or auto: see add_model_flags
  std::string attention = "auto";     // auto, paged or prefix (LoadOptions::Attention)
  std::string kv_cache_dtype = "auto";  // auto, f16, bf16, fp8 or int2 (LoadOptions::kv_dtype, kv_quant)
  int kv_partition = 64;                // int2's partition Π: 32, 64 or 128
  std::string kv_rotation = "auto";     // auto (hadamard under int2), none or hadamard
  bool enforce_eager = false;         // the GPU launches every op at every step: no CUDA graphs
  int threads = 0;   // 0: all cores
  int kv_memory_mb = 1024;
  int max_batch = 16;
  int step_tokens = 512;
};

void add_model_flags(CLI::App& app, ModelFlags& flags);
// Sampling flags with llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05);
// -n binds to params.max_tokens, whose current value is the command's default.
void add_sampling_flags(CLI::App& app, SamplingParams& params);

// The backend --backend names; on the GPU, dtype is the type of weights, activations and KV, and
// graphs whether decode steps are replayed as CUDA graphs.
std::unique_ptr<Backend> make_backend(const std::string& name, DType dtype, bool graphs = true);

// The chat format named by --chat-template, else the one the model's template implements; throws
// Error(kUnsupported) when the model's template is not one pagoda recognises.
ChatTemplate choose_chat_template(const std::string& name, const Tokenizer& tokenizer);

struct Session {
  explicit Session(const ModelFlags& flags);

  std::unique_ptr<Backend> backend;
  Checkpoint checkpoint;
  Tokenizer tokenizer;
  std::unique_ptr<Model> model;
  EngineOptions engine_options;
};

}  // namespace pagoda::cli
