// The architectures `pagoda make-model` writes: the exact shapes of public models (their weights
// replaced by random ones; decode speed does not depend on weight values) and a tiny model for
// tests, with the Hugging Face config.json that describes each.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/dtype.h"
#include "pagoda/model/config.h"

namespace pagoda::bench {

// "llama2-7b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b", "tiny", "tiny-qwen2".
const std::vector<std::string>& model_preset_names();

// The shape of a preset. Throws Error(kInvalidArgument) naming the presets for an unknown name.
ModelConfig model_preset(std::string_view name);

// config.json for `config` stored in dtype (f16 or bf16): what transformers (LlamaForCausalLM,
// Qwen2ForCausalLM) and ModelConfig::from_hf_json both read back to the same shape.
nlohmann::json hf_config_json(const ModelConfig& config, DType dtype, int32_t eos_token_id);

}  // namespace pagoda::bench
