#include "pagoda/model/config.h"

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/format/gguf.h"

namespace pagoda {
namespace {

bool is_supported_architecture(const std::string& arch) {
  return arch == "llama" || arch == "mistral" || arch == "qwen2";
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& file) {
  ModelConfig c;
  c.architecture = file.get_string("general.architecture");
  if (!is_supported_architecture(c.architecture))
    fail(ErrorKind::kUnsupported,
         "'{}': architecture '{}' is not supported (pagoda runs llama, mistral, qwen2)",
         file.origin(), c.architecture);
  const std::string a = c.architecture + ".";
  auto int_or = [&](const std::string& key, int64_t fallback) {
    const GgufValue* v = file.find(key);
    return v ? v->as_int() : fallback;
  };
  c.hidden_size = int(file.get_int(a + "embedding_length"));
  c.intermediate_size = int(file.get_int(a + "feed_forward_length"));
  c.num_layers = int(file.get_int(a + "block_count"));
  c.num_q_heads = int(file.get_int(a + "attention.head_count"));
  c.num_kv_heads = int(int_or(a + "attention.head_count_kv", c.num_q_heads));
  c.head_dim = int(int_or(a + "attention.key_length", c.num_q_heads ? c.hidden_size / c.num_q_heads : 0));
  c.max_context = int(file.get_int(a + "context_length"));
  c.rms_norm_eps = float(file.get_float(a + "attention.layer_norm_rms_epsilon"));
  if (const GgufValue* v = file.find(a + "rope.freq_base")) c.rope_theta = float(v->as_float());
  if (const GgufValue* v = file.find(a + "vocab_size")) {
    c.vocab_size = int(v->as_int());
  } else {
    const GgufValue& tokens = file.at("tokenizer.ggml.tokens");
    c.vocab_size = int(tokens.as_array().size());
  }
  // Llama 3.1 GGUFs carry the scaled frequencies as a rope_freqs tensor (read by the loader);
  // the scaling parameters themselves are not in the metadata.
  c.tie_word_embeddings = file.find_tensor("output.weight") == nullptr;
  c.qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.validate(file.origin());
  return c;
}

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, const std::string& origin) {
  auto get_int = [&](const char* key) -> int {
    if (!j.contains(key) || !j[key].is_number_integer())
      fail(ErrorKind::kCorrupt, "'{}': missing or non-integer \"{}\"", origin, key);
    return j[key].get<int>();
  };
  ModelConfig c;
  // json::value() throws json::type_error when a key is present with another type ("rope_theta":
  // null, "rms_norm_eps": "1e-5"): that is a corrupt config, not a crash.
  try {
    std::string model_type = j.value("model_type", std::string());
    c.architecture = model_type;
    if (!is_supported_architecture(c.architecture))
      fail(ErrorKind::kUnsupported,
           "'{}': model_type '{}' is not supported (pagoda runs llama, mistral, qwen2)", origin,
           model_type);
    c.vocab_size = get_int("vocab_size");
    c.hidden_size = get_int("hidden_size");
    c.intermediate_size = get_int("intermediate_size");
    c.num_layers = get_int("num_hidden_layers");
    c.num_q_heads = get_int("num_attention_heads");
    c.num_kv_heads = j.contains("num_key_value_heads") ? get_int("num_key_value_heads") : c.num_q_heads;
    c.head_dim = (j.contains("head_dim") && j["head_dim"].is_number_integer())
                     ? j["head_dim"].get<int>()
                     : (c.num_q_heads ? c.hidden_size / c.num_q_heads : 0);
    c.max_context = get_int("max_position_embeddings");
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6f);
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    c.qkv_bias = c.architecture == "qwen2" || j.value("attention_bias", false);
    // transformers >= 5 writes the RoPE settings as one "rope_parameters" object, rope_theta
    // included; earlier versions wrote a top-level "rope_theta" and an optional "rope_scaling".
    const nlohmann::json* rope = nullptr;
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      rope = &j["rope_parameters"];
    } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      rope = &j["rope_scaling"];
    }
    c.rope_theta = (rope && rope->contains("rope_theta")) ? (*rope)["rope_theta"].get<float>()
                                                          : j.value("rope_theta", 10000.f);
    if (rope) {
      const auto& s = *rope;
      const std::string type = s.value("rope_type", s.value("type", std::string()));
      if (type == "llama3") {
        c.rope_scaling.enabled = true;
        c.rope_scaling.factor = s.value("factor", 8.f);
        c.rope_scaling.low_freq_factor = s.value("low_freq_factor", 1.f);
        c.rope_scaling.high_freq_factor = s.value("high_freq_factor", 4.f);
        c.rope_scaling.original_max_position = s.value("original_max_position_embeddings", 8192);
      } else if (!type.empty() && type != "default") {
        fail(ErrorKind::kUnsupported, "'{}': rope_scaling type '{}' is not supported (llama3 is)",
             origin, type);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kCorrupt, "'{}': a field has the wrong type: {}", origin, e.what());
  }
  c.validate(origin);
  return c;
}

void ModelConfig::validate(const std::string& origin) const {
  auto positive = [&](int v, const char* name) {
    if (v <= 0 || v > (1 << 24)) fail(ErrorKind::kCorrupt, "'{}': {} = {} is out of range", origin, name, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_layers");
  positive(num_q_heads, "num_q_heads");
  positive(num_kv_heads, "num_kv_heads");
  positive(head_dim, "head_dim");
  positive(max_context, "max_context");
  if (num_q_heads % num_kv_heads != 0)
    fail(ErrorKind::kCorrupt, "'{}': {} query heads are not a multiple of {} KV heads", origin,
         num_q_heads, num_kv_heads);
  if (head_dim % 2 != 0) fail(ErrorKind::kCorrupt, "'{}': head_dim {} is odd", origin, head_dim);
  if (!(rms_norm_eps > 0.f) || !(rope_theta > 0.f))
    fail(ErrorKind::kCorrupt, "'{}': rms_norm_eps and rope_theta must be positive", origin);
}

}  // namespace pagoda
