// A loaded model ready to serve: its checkpoint, tokenizer, backend (CPU or CUDA) and the engine
// options its flags ask for. Every command that runs a model (generate, chat, serve, the engine
// benchmarks) starts from one.
#pragma once

#include <memory>
#include <string>

#include "pagoda/backend/backend.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model.h"
#include "pagoda/model/step_model.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda {

// The values of the flags that choose and load a model (cli/flags.h declares them).
struct ModelFlags {
  std::string path;  // empty: the default model
  std::string backend = "auto";  // cpu, cuda, or auto: cuda when built with it and a GPU is present
  std::string weight_dtype = "auto";  // file, f16, bf16, f32, or auto: f16, but bf16 for a bf16 checkpoint
  std::string attention = "auto";     // auto, paged or prefix (LoadOptions::Attention)
  std::string kv_cache_dtype = "auto";  // auto, f16, bf16, fp8 or int2 (LoadOptions::kv_dtype, kv_quant)
  int kv_partition = 64;                // int2's partition Π: 32, 64 or 128
  std::string kv_rotation = "auto";     // auto (hadamard under int2 and fp8), none or hadamard
  std::string kv_key_dtype = "auto";    // int2's keys: auto (fp8), int2 or fp8
  int kv_sink_tokens = -1;              // int2: first tokens kept in f16; -1: auto (1)
  std::string kv_rounding = "auto";     // int2: auto (nearest), nearest or stochastic
  bool enforce_eager = false;         // the GPU launches every op at every step: no CUDA graphs
  int threads = 0;   // 0: all cores
  int tensor_parallel = 1;  // ranks the model is split over (model/tensor_parallel_model.h)
  int kv_memory_mb = 1024;
  int max_batch = 16;
  int step_tokens = 512;
};

// The backend --backend names; on the GPU, dtype is the type of weights, activations and KV, and
// graphs whether decode steps are replayed as CUDA graphs.
std::unique_ptr<Backend> make_backend(const std::string& name, DType dtype, bool graphs = true);

struct Session {
  // Throws Error(kInvalidArgument) for a flag out of range, and what loading the checkpoint throws.
  explicit Session(const ModelFlags& flags);

  Checkpoint checkpoint;
  Tokenizer tokenizer;
  std::unique_ptr<Backend> owned_backend;  // the model's backend, when it is not split
  // The model's backend; rank 0's when split over ranks (TensorParallelModel owns theirs).
  Backend* backend = nullptr;
  // A Model, or a TensorParallelModel (--tensor-parallel > 1).
  std::unique_ptr<StepModel> model;
  EngineOptions engine_options;
};

}  // namespace pagoda
