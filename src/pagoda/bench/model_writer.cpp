#include "pagoda/bench/model_writer.h"

#include <immintrin.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/counter_random.h"
#include "pagoda/bench/model_presets.h"
#include "pagoda/core/error.h"
#include "pagoda/core/fnv1a.h"
#include "pagoda/core/half.h"
#include "pagoda/core/progress.h"
#include "pagoda/tokenizer/byte_unicode.h"

namespace pagoda::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Elements generated and written at a time: 64 MiB of f16, large enough that writes run at disk
// speed, small enough that two buffers (one filling while the other is written) cost nothing.
constexpr int64_t kChunkElements = int64_t(1) << 25;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool ones = false;  // a norm weight: 1.0 everywhere, so each layer's RMSNorm leaves the scale at 1

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Every tensor LlamaForCausalLM / Qwen2ForCausalLM has, in the order transformers saves them.
std::vector<TensorSpec> tensor_specs(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, q = c.q_dim(), kv = c.kv_dim();
  const int64_t ffn = c.intermediate_size;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {vocab, hidden}});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {hidden}, true});
    t.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
    t.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
    t.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    if (c.qkv_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {q}});
      t.push_back({p + "self_attn.k_proj.bias", {kv}});
      t.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    t.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    t.push_back({p + "post_attention_layernorm.weight", {hidden}, true});
    t.push_back({p + "mlp.gate_proj.weight", {ffn, hidden}});
    t.push_back({p + "mlp.up_proj.weight", {ffn, hidden}});
    t.push_back({p + "mlp.down_proj.weight", {hidden, ffn}});
  }
  t.push_back({"model.norm.weight", {hidden}, true});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {vocab, hidden}});
  return t;
}

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into the specs, in file order
  uint64_t bytes = 0;
};

// Consecutive tensors fill a shard until the next would pass max_bytes (a tensor larger than that
// gets a shard of its own). One shard is model.safetensors; more are named as transformers does.
std::vector<Shard> plan_shards(const std::vector<TensorSpec>& specs, size_t element_bytes, uint64_t max_bytes) {
  std::vector<Shard> shards(1);
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t bytes = uint64_t(specs[i].numel()) * element_bytes;
    if (!shards.back().tensors.empty() && shards.back().bytes + bytes > max_bytes) shards.emplace_back();
    shards.back().tensors.push_back(i);
    shards.back().bytes += bytes;
  }
  for (size_t s = 0; s < shards.size(); ++s)
    shards[s].file = shards.size() == 1 ? "model.safetensors"
                                        : fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, shards.size());
  return shards;
}

// The safetensors header: tensor entries with their offsets in the data section, padded with
// spaces to a multiple of 8 bytes so the data stays aligned (as the safetensors library does).
std::string safetensors_header(const std::vector<TensorSpec>& specs, const Shard& shard, DType dtype) {
  json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t offset = 0;
  for (size_t i : shard.tensors) {
    const uint64_t bytes = uint64_t(specs[i].numel()) * dtype_size(dtype);
    header[specs[i].name] = {{"dtype", dtype == DType::kBF16 ? "BF16" : "F16"},
                             {"shape", specs[i].shape},
                             {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Elements [first, first + count) of a tensor. Random values are uniform in [-r, r) with
// r = sqrt(3) x kWeightStd, a function of (seed, tensor name, index) only.
void fill_chunk(const TensorSpec& spec, uint64_t seed, int64_t first, int64_t count, DType dtype, uint16_t* out) {
  // F16C's conversion (the build targets x86-64-v3) rounds to nearest even as f32_to_f16 does, at
  // 4x its speed: with it, generating 16 GB takes a fraction of the time writing it does.
  const auto to_bits = [dtype](float x) {
    return dtype == DType::kBF16 ? f32_to_bf16(x) : uint16_t(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
  };
  if (spec.ones) {
    std::fill_n(out, count, to_bits(1.f));
    return;
  }
  const uint64_t stream = mix64(seed) ^ fnv1a(spec.name.data(), spec.name.size());
  const float range = std::sqrt(3.f) * kWeightStd;
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < count; ++k) {
    const uint64_t r = counter_random(stream, uint64_t(first + k));
    const float uniform = float(r >> 40) * 0x1p-23f - 1.f;  // 24 random bits -> [-1, 1)
    out[k] = to_bits(uniform * range);
  }
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

void write_bytes(FILE* file, const void* data, size_t bytes, const fs::path& path) {
  if (std::fwrite(data, 1, bytes, file) != bytes)
    fail(ErrorKind::kInternal, "cannot write '{}': {}", path.string(), std::strerror(errno));
}

void write_shard(const std::vector<TensorSpec>& specs, const Shard& shard, const fs::path& path,
                 const RandomCheckpointOptions& options, ProgressBar& progress) {
  std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  if (!file) fail(ErrorKind::kInternal, "cannot create '{}': {}", path.string(), std::strerror(errno));
  const std::string header = safetensors_header(specs, shard, options.dtype);
  const uint64_t header_size = header.size();  // little-endian on every machine pagoda runs on
  write_bytes(file.get(), &header_size, sizeof header_size, path);
  write_bytes(file.get(), header.data(), header.size(), path);

  // Double buffering: the next chunk is generated (on every core) while the last one is written.
  std::vector<uint16_t> buffers[2];
  std::future<void> pending;
  int current = 0;
  for (size_t i : shard.tensors) {
    const TensorSpec& spec = specs[i];
    for (int64_t first = 0; first < spec.numel(); first += kChunkElements) {
      const int64_t count = std::min(kChunkElements, spec.numel() - first);
      std::vector<uint16_t>& buffer = buffers[current];
      buffer.resize(size_t(count));
      fill_chunk(spec, options.seed, first, count, options.dtype, buffer.data());
      if (pending.valid()) pending.get();
      pending = std::async(std::launch::async, [&buffer, &file, &path] {
        write_bytes(file.get(), buffer.data(), buffer.size() * sizeof(uint16_t), path);
      });
      progress.advance(count * int64_t(sizeof(uint16_t)));
      current ^= 1;
    }
  }
  if (pending.valid()) pending.get();
  if (std::fclose(file.release()) != 0)
    fail(ErrorKind::kInternal, "cannot write '{}': {}", path.string(), std::strerror(errno));
}

// A byte-level BPE tokenizer: every byte is a token, so any text encodes, plus the merges of a
// space with each lowercase letter and a special end-of-text token (model_writer.h). Both pagoda
// (tokenizer_json.cpp) and Hugging Face tokenizers load it.
json tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_unicode_text(std::string(1, char(b)))] = b;
  json merges = json::array();
  const std::string space = bytes_to_unicode_text(" ");
  for (char letter = 'a'; letter <= 'z'; ++letter) {
    merges.push_back(space + " " + letter);
    vocab[space + letter] = 256 + (letter - 'a');
  }
  json eos = {{"id", kWrittenEosId},   {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
              {"rstrip", false},       {"normalized", false},        {"special", true}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json model = {{"type", "BPE"},          {"dropout", nullptr},           {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},       {"vocab", vocab},
                {"merges", merges}};
  static_assert(kWrittenEosId == 256 + 26);
  json j = json::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array({eos});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = nullptr;
  j["decoder"] = byte_level;
  j["model"] = model;
  return j;
}

}  // namespace

namespace {

bool written_by_make_model(const fs::path& dir) {
  std::ifstream in(dir / "config.json");
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.contains(kMadeByKey);
}

}  // namespace

uint64_t write_random_checkpoint(const ModelConfig& config, const std::string& dir,
                             const RandomCheckpointOptions& options) {
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16)
    fail(ErrorKind::kInvalidArgument, "make-model writes f16 or bf16 weights, not {}", dtype_name(options.dtype));
  const fs::path out(dir);
  std::error_code ec;
  // Rewriting replaces config, tokenizer and every model*.safetensors: only in a folder that is
  // new, empty, or written by make-model before (its config.json says so), never over a real model.
  if (fs::is_directory(out, ec) && !fs::is_empty(out, ec) && !written_by_make_model(out))
    fail(ErrorKind::kInvalidArgument, "'{}' holds files make-model did not write; choose a new or empty folder", dir);
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) fail(ErrorKind::kInternal, "cannot create the folder '{}'", dir);

  const std::vector<TensorSpec> specs = tensor_specs(config);
  const std::vector<Shard> shards = plan_shards(specs, dtype_size(options.dtype), options.max_shard_bytes);
  uint64_t total_bytes = 0;
  for (const Shard& s : shards) total_bytes += s.bytes;

  // A folder written before with more shards keeps no stale index or shards to confuse a loader.
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors.index.json" || (name.starts_with("model") && name.ends_with(".safetensors")))
      fs::remove(entry.path(), ec);
  }

  nlohmann::json hf_config = hf_config_json(config, options.dtype, kWrittenEosId);
  hf_config[kMadeByKey] = "pagoda make-model: random weights";
  write_json_file((out / "config.json").string(), hf_config);
  write_json_file((out / "tokenizer.json").string(), tokenizer_json());
  write_json_file((out / "tokenizer_config.json").string(),
                  {{"tokenizer_class", "PreTrainedTokenizerFast"},
                   {"bos_token", nullptr},
                   {"eos_token", "<|endoftext|>"},
                   {"add_bos_token", false},
                   {"model_max_length", config.max_context},
                   {"clean_up_tokenization_spaces", false}});
  write_json_file((out / "generation_config.json").string(),
                  {{"eos_token_id", kWrittenEosId}, {"pad_token_id", kWrittenEosId}, {"do_sample", false}});

  ProgressBar progress(fmt::format("writing {:.1f} GB", double(total_bytes) / 1e9), int64_t(total_bytes));
  for (const Shard& shard : shards) write_shard(specs, shard, out / shard.file, options, progress);
  progress.finish();

  if (shards.size() > 1) {
    json weight_map = json::object();
    for (const Shard& shard : shards)
      for (size_t i : shard.tensors) weight_map[specs[i].name] = shard.file;
    write_json_file((out / "model.safetensors.index.json").string(),
                    {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}});
  }
  return total_bytes;
}

}  // namespace pagoda::bench
