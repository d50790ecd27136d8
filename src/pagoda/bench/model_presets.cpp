#include "pagoda/bench/model_presets.h"

#include <string>

#include "pagoda/core/error.h"

namespace pagoda::bench {
namespace {

struct Preset {
  const char* name;
  ModelConfig config;
};

ModelConfig llama(int hidden, int layers, int q_heads, int kv_heads, int intermediate, int vocab, int context,
                  float theta, float eps) {
  return ModelConfig{.architecture = "llama",
                     .vocab_size = vocab,
                     .hidden_size = hidden,
                     .intermediate_size = intermediate,
                     .num_layers = layers,
                     .num_q_heads = q_heads,
                     .num_kv_heads = kv_heads,
                     .head_dim = hidden / q_heads,
                     .max_context = context,
                     .rms_norm_eps = eps,
                     .rope_theta = theta};
}

ModelConfig qwen2(int hidden, int layers, int q_heads, int kv_heads, int intermediate) {
  ModelConfig c = llama(hidden, layers, q_heads, kv_heads, intermediate, 152064, 32768, 1e6f, 1e-6f);
  c.architecture = "qwen2";
  c.qkv_bias = true;
  return c;
}

ModelConfig tiny_qwen2() {
  ModelConfig c = qwen2(64, 2, 4, 2, 128);
  c.vocab_size = 320;
  c.max_context = 4096;
  return c;
}

// The published config.json of each model (Llama-3-8B and -70B are 3.0: no RoPE scaling). tiny and
// tiny-qwen2 are for tests: small legal shapes that still have grouped-query attention (and, for
// Qwen2, the q/k/v biases), more vocabulary rows than the tokenizer written beside them (padding
// rows, as real models have), and a context long enough for the CLI tests' replays.
const Preset kPresets[] = {
    {"llama2-7b", llama(4096, 32, 32, 32, 11008, 32000, 4096, 1e4f, 1e-5f)},
    {"llama3-8b", llama(4096, 32, 32, 8, 14336, 128256, 8192, 5e5f, 1e-5f)},
    {"llama2-70b", llama(8192, 80, 64, 8, 28672, 32000, 4096, 1e4f, 1e-5f)},
    {"llama3-70b", llama(8192, 80, 64, 8, 28672, 128256, 8192, 5e5f, 1e-5f)},
    {"qwen2.5-7b", qwen2(3584, 28, 28, 4, 18944)},
    {"qwen2.5-14b", qwen2(5120, 48, 40, 8, 13824)},
    {"tiny", llama(64, 2, 4, 2, 128, 320, 4096, 1e4f, 1e-5f)},
    {"tiny-qwen2", tiny_qwen2()},
};

// A float as the shortest decimal that reads back to it (1e-05, not 9.999999747378752e-06).
double shortest_decimal(float value) { return std::stod(fmt::format("{}", value)); }

}  // namespace

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Preset& p : kPresets) v.emplace_back(p.name);
    return v;
  }();
  return names;
}

ModelConfig model_preset(std::string_view name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.config;
  fail(ErrorKind::kInvalidArgument, "--arch '{}' is not one of {}", name, fmt::join(model_preset_names(), ", "));
}

nlohmann::json hf_config_json(const ModelConfig& c, DType dtype, int32_t eos_token_id) {
  const bool qwen = c.architecture == "qwen2";
  nlohmann::json j = {
      {"architectures", {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", c.architecture},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_q_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_context},
      {"rms_norm_eps", shortest_decimal(c.rms_norm_eps)},
      // Both spellings: transformers < 5 reads rope_theta and torch_dtype, 5 rope_parameters and dtype.
      {"rope_theta", shortest_decimal(c.rope_theta)},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", shortest_decimal(c.rope_theta)}}},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", dtype == DType::kBF16 ? "bfloat16" : "float16"},
      {"dtype", dtype == DType::kBF16 ? "bfloat16" : "float16"},
      {"bos_token_id", nullptr},
      {"eos_token_id", eos_token_id},
      {"use_cache", true},
  };
  if (qwen) {
    // Qwen2 always has q/k/v biases; sliding-window attention is off in Qwen2.5's configs.
    j["use_sliding_window"] = false;
    j["sliding_window"] = c.max_context;
    j["max_window_layers"] = c.num_layers;
    j["attention_dropout"] = 0.0;
  } else {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = false;
  }
  return j;
}

}  // namespace pagoda::bench
