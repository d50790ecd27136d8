#include "pagoda/model/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/core/progress.h"
#include "pagoda/format/dequantize.h"
#include "pagoda/format/gguf.h"
#include "pagoda/format/gguf_writer.h"
#include "pagoda/format/quantize.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/rope.h"
#include "pagoda/tokenizer/pre_tokenizer.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Values converted at a time: 16 M (64 MB of f32), enough rows to keep every core busy.
constexpr int64_t kChunkValues = int64_t(1) << 24;

// One tensor to write: its rows come from a stored tensor (dequantized), optionally reordered
// (Llama's q/k rows interleaved per head), or from values computed here.
struct ExportTensor {
  std::string name;            // GGUF name
  std::vector<int64_t> dims;   // ggml order: dims[0] is the row length
  GgmlType source_type = GgmlType::kF32;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  int interleave_head_dim = 0;  // > 0: row g of a head is row (g % 2) * hd / 2 + g / 2 of the source
  bool interleave_elements = false;  // a 1-D tensor (a bias): the same reorder of its elements
  std::vector<float> values;   // when data is null

  int64_t cols() const { return dims[0]; }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
    return r;
  }
};

int64_t interleaved_source(int64_t g, int head_dim) {
  const int64_t head = g / head_dim, within = g % head_dim;
  return head * head_dim + (within % 2) * (head_dim / 2) + within / 2;
}

// Row r of the tensor as f32 (row 0 of a 1-D tensor is the whole of it).
void read_row(const ExportTensor& t, int64_t r, float* dst, std::vector<float>& scratch) {
  if (t.data == nullptr) {
    std::copy_n(t.values.data() + r * t.cols(), t.cols(), dst);
  } else if (t.interleave_elements) {
    scratch.resize(size_t(t.cols()));
    dequantize_row(t.source_type, t.data, scratch.data(), t.cols());
    for (int64_t i = 0; i < t.cols(); ++i) dst[i] = scratch[size_t(interleaved_source(i, t.interleave_head_dim))];
  } else {
    const int64_t source = t.interleave_head_dim > 0 ? interleaved_source(r, t.interleave_head_dim) : r;
    dequantize_row(t.source_type, t.data + size_t(source) * t.row_bytes, dst, t.cols());
  }
}

uint32_t llama_file_type(GgmlType target) {
  switch (target) {  // llama.cpp's LLAMA_FTYPE_* ("mostly" the type)
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ4_1: return 3;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kQ5_0: return 8;
    case GgmlType::kQ5_1: return 9;
    case GgmlType::kQ4_K: return 14;  // Q4_K_S: q4_k with a q6_k output
    case GgmlType::kQ5_K: return 16;  // Q5_K_S
    case GgmlType::kQ6_K: return 18;
    case GgmlType::kBF16: return 32;
    default: fail(ErrorKind::kInternal, "no llama.cpp file type for {}", ggml_type_traits(uint32_t(target)).name);
  }
}

// Converts and writes every tensor; the metadata is already set on the writer.
GgufExportResult write_tensors(GgufWriter& writer, const std::vector<ExportTensor>& tensors, GgmlType target) {
  GgufExportResult result;
  std::vector<GgmlType> types;
  for (const ExportTensor& t : tensors) {
    if (t.data != nullptr && !ggml_type_traits(uint32_t(t.source_type)).can_dequantize)
      fail(ErrorKind::kUnsupported, "tensor '{}' has type {}, which pagoda cannot read",
           t.name, ggml_type_traits(uint32_t(t.source_type)).name);
    types.push_back(export_tensor_type(t.name, int(t.dims.size()), target));
    result.bytes_out += writer.add_tensor(t.name, t.dims, types.back());
    result.bytes_in += t.data != nullptr ? t.row_bytes * size_t(t.interleave_elements ? 1 : t.rows())
                                         : t.values.size() * sizeof(float);
  }
  writer.write_header();
  ProgressBar progress("quantizing", int64_t(result.bytes_out));
  std::vector<float> values;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ExportTensor& t = tensors[i];
    const GgmlTypeTraits traits = ggml_type_traits(uint32_t(types[i]));
    const size_t out_row_bytes = size_t(t.cols() / traits.block_size * traits.block_bytes);
    const int64_t chunk_rows = std::max<int64_t>(1, kChunkValues / t.cols());
    for (int64_t first = 0; first < t.rows(); first += chunk_rows) {
      const int64_t count = std::min(chunk_rows, t.rows() - first);
      values.resize(size_t(count * t.cols()));
      out.resize(size_t(count) * out_row_bytes);
      bool finite = true;
#pragma omp parallel reduction(&& : finite)
      {
        std::vector<float> scratch;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < count; ++r) {
          float* row = values.data() + r * t.cols();
          read_row(t, first + r, row, scratch);
          bool row_finite = true;
          for (int64_t c = 0; c < t.cols(); ++c) row_finite = row_finite && std::isfinite(row[c]);
          finite = finite && row_finite;
          if (row_finite) quantize_row(types[i], row, out.data() + size_t(r) * out_row_bytes, t.cols());
        }
      }
      if (!finite) fail(ErrorKind::kCorrupt, "tensor '{}' holds a value that is not finite", t.name);
      writer.write_data(out);
      progress.advance(int64_t(out.size()));
    }
    ++result.tensors;
  }
  progress.finish();
  writer.finish();
  return result;
}

// ---- from GGUF ----

GgufExportResult export_from_gguf(const std::string& in, const std::string& out, GgmlType target) {
  const GgufFile file = GgufFile::open(in);
  GgufWriter writer(out);
  for (const auto& [key, value] : file.metadata()) {
    if (key == "general.alignment" || key == "general.file_type" || key == "general.quantization_version") continue;
    writer.set(key, value);
  }
  writer.set("general.file_type", gguf_u32(llama_file_type(target)));
  writer.set("general.quantization_version", gguf_u32(2));
  std::vector<ExportTensor> tensors;
  for (const GgufTensorInfo& info : file.tensors()) {
    const GgmlTypeTraits traits = ggml_type_traits(uint32_t(info.type));
    ExportTensor t{.name = info.name, .dims = info.dims, .source_type = info.type, .data = info.data};
    if (info.dims.empty()) fail(ErrorKind::kCorrupt, "'{}': tensor '{}' has no dimensions", in, info.name);
    if (traits.block_size > 0) t.row_bytes = size_t(info.dims[0] / traits.block_size * traits.block_bytes);
    tensors.push_back(std::move(t));
  }
  return write_tensors(writer, tensors, target);
}

// ---- from a Hugging Face folder ----

json read_json_file(const fs::path& path) {
  std::ifstream stream(path);
  if (!stream) fail(ErrorKind::kNotFound, "cannot open '{}'", path.string());
  try {
    return json::parse(stream);
  } catch (const json::exception& e) {
    fail(ErrorKind::kCorrupt, "'{}' is not valid JSON: {}", path.string(), e.what());
  }
}

// The regex splits of a byte-level pre-tokenizer, in order, or kUnsupported.
void pre_tokenizer_patterns(const json& node, std::vector<std::string>& patterns, const std::string& where) {
  if (node.is_null()) return;
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.value("pretokenizers", json::array())) pre_tokenizer_patterns(child, patterns, where);
  } else if (type == "ByteLevel") {
    if (node.value("add_prefix_space", false))
      fail(ErrorKind::kUnsupported, "{}: a ByteLevel pre-tokenizer that adds a prefix space has no GGUF name", where);
    if (node.value("use_regex", true)) patterns.emplace_back(kGpt2Pattern);
  } else if (type == "Split" && node.contains("pattern") && node["pattern"].contains("Regex") &&
             node.value("behavior", "") == "Isolated" && !node.value("invert", false)) {
    patterns.push_back(node["pattern"]["Regex"].get<std::string>());
  } else if (type == "Digits" && node.value("individual_digits", false)) {
    patterns.emplace_back(R"(\p{N})");
  } else {
    fail(ErrorKind::kUnsupported, "{}: pre-tokenizer '{}' has no GGUF equivalent pagoda writes", where, type);
  }
}

std::optional<std::string> special_token_text(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// tokenizer.ggml.* for a byte-level BPE tokenizer.json, padded to the model's vocabulary with
// unused "[PAD<id>]" tokens (llama.cpp wants one token per embedding row).
void set_tokenizer_metadata(GgufWriter& writer, const fs::path& dir, const ModelConfig& config) {
  const fs::path path = dir / "tokenizer.json";
  const std::string where = path.string();
  const json root = read_json_file(path);
  const json tokenizer_config = fs::exists(dir / "tokenizer_config.json") ? read_json_file(dir / "tokenizer_config.json")
                                                                          : json::object();
  try {
    const json& model = root.at("model");
    if (model.value("type", "BPE") != "BPE" || model.value("byte_fallback", false))
      fail(ErrorKind::kUnsupported, "{}: pagoda writes byte-level BPE tokenizers to GGUF, not this one", where);
    std::vector<std::string> patterns;
    pre_tokenizer_patterns(root.value("pre_tokenizer", json()), patterns, where);
    if (patterns.empty()) fail(ErrorKind::kUnsupported, "{}: not a byte-level BPE tokenizer", where);
    const std::string_view pre = PreTokenizer::gguf_name_of(patterns);
    if (pre.empty()) fail(ErrorKind::kUnsupported, "{}: its pre-tokenizer's regexes have no tokenizer.ggml.pre name", where);

    std::vector<std::string> tokens(size_t(config.vocab_size));
    std::vector<int32_t> kinds(size_t(config.vocab_size), 5);  // unused
    std::vector<bool> named(size_t(config.vocab_size), false);
    const auto place = [&](int64_t id, const std::string& piece, int32_t kind) {
      if (id < 0 || id >= config.vocab_size)
        fail(ErrorKind::kCorrupt, "{}: token '{}' has id {}, outside the model's {} embeddings", where, piece, id,
             config.vocab_size);
      tokens[size_t(id)] = piece;
      kinds[size_t(id)] = kind;
      named[size_t(id)] = true;
    };
    for (const auto& [piece, id] : model.at("vocab").items()) place(id.get<int64_t>(), piece, 1);
    for (const json& added : root.value("added_tokens", json::array()))
      place(added.at("id").get<int64_t>(), added.at("content").get<std::string>(), added.value("special", false) ? 3 : 4);
    for (size_t id = 0; id < tokens.size(); ++id)
      if (!named[id]) tokens[id] = "[PAD" + std::to_string(id) + "]";

    std::vector<std::string> merges;
    for (const json& m : model.value("merges", json::array()))
      merges.push_back(m.is_string() ? m.get<std::string>() : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());

    const auto id_of = [&](const std::string& piece) -> std::optional<int32_t> {
      for (size_t id = 0; id < tokens.size(); ++id)
        if (named[id] && tokens[id] == piece) return int32_t(id);
      return std::nullopt;
    };
    for (const auto& [key, gguf_key] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                                        std::pair{"eos_token", "tokenizer.ggml.eos_token_id"}}) {
      if (const auto text = special_token_text(tokenizer_config, key))
        if (const auto id = id_of(*text)) writer.set(gguf_key, gguf_u32(uint32_t(*id)));
    }
    writer.set("tokenizer.ggml.model", gguf_string("gpt2"));
    writer.set("tokenizer.ggml.pre", gguf_string(std::string(pre)));
    writer.set("tokenizer.ggml.tokens", gguf_string_array(std::move(tokens)));
    writer.set("tokenizer.ggml.token_type", gguf_i32_array(kinds));
    writer.set("tokenizer.ggml.merges", gguf_string_array(std::move(merges)));
    writer.set("tokenizer.ggml.add_bos_token", gguf_bool(tokenizer_config.value("add_bos_token", false)));
    if (tokenizer_config.contains("chat_template") && tokenizer_config["chat_template"].is_string())
      writer.set("tokenizer.chat_template", gguf_string(tokenizer_config["chat_template"].get<std::string>()));
  } catch (const json::exception& e) {
    fail(ErrorKind::kCorrupt, "{}: a field is missing or has the wrong type: {}", where, e.what());
  }
}

void set_model_metadata(GgufWriter& writer, const ModelConfig& c, const std::string& name, GgmlType target) {
  const std::string a = c.architecture + ".";
  writer.set("general.architecture", gguf_string(c.architecture));
  writer.set("general.name", gguf_string(name));
  writer.set(a + "vocab_size", gguf_u32(uint32_t(c.vocab_size)));
  writer.set(a + "context_length", gguf_u32(uint32_t(c.max_context)));
  writer.set(a + "embedding_length", gguf_u32(uint32_t(c.hidden_size)));
  writer.set(a + "block_count", gguf_u32(uint32_t(c.num_layers)));
  writer.set(a + "feed_forward_length", gguf_u32(uint32_t(c.intermediate_size)));
  writer.set(a + "attention.head_count", gguf_u32(uint32_t(c.num_q_heads)));
  writer.set(a + "attention.head_count_kv", gguf_u32(uint32_t(c.num_kv_heads)));
  writer.set(a + "attention.key_length", gguf_u32(uint32_t(c.head_dim)));
  writer.set(a + "attention.value_length", gguf_u32(uint32_t(c.head_dim)));
  writer.set(a + "rope.dimension_count", gguf_u32(uint32_t(c.head_dim)));
  writer.set(a + "rope.freq_base", gguf_f32(c.rope_theta));
  writer.set(a + "attention.layer_norm_rms_epsilon", gguf_f32(c.rms_norm_eps));
  writer.set("general.file_type", gguf_u32(llama_file_type(target)));
  writer.set("general.quantization_version", gguf_u32(2));
}

GgufExportResult export_from_hf(const std::string& in, const std::string& out, GgmlType target) {
  const Checkpoint checkpoint = Checkpoint::open(in);
  const ModelConfig& c = checkpoint.config();
  const fs::path dir = fs::is_directory(in) ? fs::path(in) : fs::path(in).parent_path();
  GgufWriter writer(out);
  set_model_metadata(writer, c, fs::absolute(dir).filename().string(), target);
  set_tokenizer_metadata(writer, dir, c);

  const bool interleave = c.architecture == "llama" || c.architecture == "mistral";
  std::vector<ExportTensor> tensors;
  const auto add = [&](const std::string& hf, const std::string& gguf, bool qk) {
    const StoredTensor& s = checkpoint.get(hf);
    ExportTensor t{.name = gguf, .source_type = s.type, .data = s.data, .row_bytes = s.row_bytes};
    // Checkpoint views 1-D tensors as one row; norms and biases are the model's 1-D tensors.
    const bool one_d = hf.ends_with(".bias") || hf.ends_with("norm.weight");
    t.dims = one_d ? std::vector<int64_t>{s.cols} : std::vector<int64_t>{s.cols, s.rows};
    if (qk && interleave) {
      t.interleave_head_dim = c.head_dim;
      t.interleave_elements = t.dims.size() == 1;
    }
    tensors.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", "token_embd.weight", false);
  if (c.rope_scaling.enabled) {  // Llama 3.1: the scaled frequencies as divisors, as llama.cpp stores them
    ModelConfig plain = c;
    plain.rope_scaling.enabled = false;
    const std::vector<float> base = rope_inv_freq(plain), scaled = rope_inv_freq(c);
    ExportTensor t{.name = "rope_freqs.weight", .dims = {int64_t(base.size())}};
    for (size_t i = 0; i < base.size(); ++i) t.values.push_back(base[i] / scaled[i]);
    tensors.push_back(std::move(t));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    add(hf + "input_layernorm.weight", g + "attn_norm.weight", false);
    add(hf + "self_attn.q_proj.weight", g + "attn_q.weight", true);
    add(hf + "self_attn.k_proj.weight", g + "attn_k.weight", true);
    add(hf + "self_attn.v_proj.weight", g + "attn_v.weight", false);
    if (c.qkv_bias) {
      add(hf + "self_attn.q_proj.bias", g + "attn_q.bias", true);
      add(hf + "self_attn.k_proj.bias", g + "attn_k.bias", true);
      add(hf + "self_attn.v_proj.bias", g + "attn_v.bias", false);
    }
    add(hf + "self_attn.o_proj.weight", g + "attn_output.weight", false);
    add(hf + "post_attention_layernorm.weight", g + "ffn_norm.weight", false);
    add(hf + "mlp.gate_proj.weight", g + "ffn_gate.weight", false);
    add(hf + "mlp.up_proj.weight", g + "ffn_up.weight", false);
    add(hf + "mlp.down_proj.weight", g + "ffn_down.weight", false);
  }
  add("model.norm.weight", "output_norm.weight", false);
  if (!c.tie_word_embeddings && checkpoint.find("lm_head.weight") != nullptr) add("lm_head.weight", "output.weight", false);
  return write_tensors(writer, tensors, target);
}

}  // namespace

GgmlType export_tensor_type(const std::string& gguf_name, int dims, GgmlType target) {
  if (dims < 2) return GgmlType::kF32;
  if (gguf_name == "output.weight" && (target == GgmlType::kQ4_K || target == GgmlType::kQ5_K)) return GgmlType::kQ6_K;
  return target;
}

GgufExportResult export_gguf(const std::string& in, const std::string& out, GgmlType target) {
  if (!can_quantize(target))
    fail(ErrorKind::kInvalidArgument, "cannot write weights as {}", ggml_type_traits(uint32_t(target)).name);
  std::error_code ec;
  if (fs::exists(out, ec) && fs::exists(in, ec) && fs::equivalent(in, out, ec))
    fail(ErrorKind::kInvalidArgument, "'{}': the output would overwrite the input", out);
  try {
    if (fs::is_regular_file(in) && in.ends_with(".gguf")) return export_from_gguf(in, out, target);
    return export_from_hf(in, out, target);
  } catch (...) {
    fs::remove(out, ec);  // no half-written file left behind
    throw;
  }
}

}  // namespace pagoda
