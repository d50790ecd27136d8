// Writes a Hugging Face checkpoint with random weights (pagoda make-model): config.json,
// safetensors, and a small byte-level tokenizer, so that pagoda and transformers load the same
// folder. The weights stream to disk in large chunks; the model is never held in memory.
#pragma once

#include <cstdint>
#include <string>

#include "pagoda/core/dtype.h"
#include "pagoda/model/config.h"

namespace pagoda::bench {

// The tokenizer written beside the weights: the 256 byte tokens (ids 0..255), 26 merges of a space
// with a lowercase letter (ids 256..281: pagoda refuses a byte-level BPE without merges), and an
// end-of-text token. Enough to run any prompt; the model's vocabulary rows past it are padding.
inline constexpr int32_t kWrittenEosId = 282;
inline constexpr int32_t kWrittenTokenizerSize = 283;

// Standard deviation of every weight matrix and bias (uniform values, the range that gives this
// std): small enough that activations stay finite through 48 layers with norm weights of 1.
inline constexpr float kWeightStd = 0.02f;
// The config.json field that marks a folder make-model wrote (and may write again).
inline constexpr const char* kMadeByKey = "pagoda_make_model";

struct RandomCheckpointOptions {
  DType dtype = DType::kF16;  // f16 or bf16
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 5'000'000'000;  // larger checkpoints are sharded, as transformers does
};

// Writes into dir (created when missing): config.json, model.safetensors or
// model-0000i-of-0000n.safetensors shards with model.safetensors.index.json, tokenizer.json,
// tokenizer_config.json and generation_config.json. The same config, options and seed give the
// same bytes; each tensor's values depend on its name and the seed only, so the first layers of a
// --layers 2 model equal those of the full one. Returns the bytes of weights written. Throws
// Error(kInternal) when a file cannot be written.
uint64_t write_random_checkpoint(const ModelConfig& config, const std::string& dir,
                             const RandomCheckpointOptions& options);

}  // namespace pagoda::bench
