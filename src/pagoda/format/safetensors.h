// Hugging Face safetensors reader: one file (SafetensorsFile) or a model folder, single-file or
// sharded through model.safetensors.index.json (SafetensorsModel). Files are mapped; tensors are
// views into the mappings. The JSON header is validated against the file (offsets inside the
// data section, byte sizes matching shape and dtype), so a corrupt file throws Error(kCorrupt).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagoda/core/dtype.h"
#include "pagoda/format/file_bytes.h"

namespace pagoda {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;     // row-major: shape.back() is the fastest-varying
  const uint8_t* data = nullptr;  // view into the file's bytes
  uint64_t nbytes = 0;

  int64_t numel() const { return shape_numel(shape); }
};

class SafetensorsFile {
 public:
  // Maps and parses a file. Throws kNotFound (cannot open), kCorrupt, or kUnsupported (a dtype
  // other than F32, F16, BF16, I32, I64, U8).
  static SafetensorsFile open(const std::string& path);
  // Parses bytes owned by the caller (kept alive by the caller), e.g. a fuzzer's input.
  static SafetensorsFile parse(std::span<const uint8_t> bytes,
                               std::string_view origin = "<memory>");

  const std::string& origin() const { return source_.origin; }
  // Tensors in the header's order, and lookup by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;  // null when absent
  // The optional "__metadata__" string map, in the header's order.
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }

 private:
  explicit SafetensorsFile(FileBytes source);  // parses source.bytes
  void parse_bytes(std::span<const uint8_t> bytes);

  FileBytes source_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

// A model's weights across one or more safetensors files.
class SafetensorsModel {
 public:
  // path: a folder holding model.safetensors.index.json (sharded) or model.safetensors, or a
  // single .safetensors file. Every tensor the index names must be in the shard it names, and a
  // tensor name may appear in one shard only.
  static SafetensorsModel open(const std::string& path);
  // Move-only: the index points into the shards it owns.
  SafetensorsModel(SafetensorsModel&&) = default;
  SafetensorsModel& operator=(SafetensorsModel&&) = default;
  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  const SafetensorsTensor* find(std::string_view name) const;  // null when absent
  const SafetensorsTensor& at(std::string_view name) const;    // throws kNotFound
  // All tensors of all shards, sorted by name.
  const std::vector<const SafetensorsTensor*>& tensors() const { return sorted_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

 private:
  SafetensorsModel() = default;
  void index_tensors();

  std::string origin_;
  std::vector<SafetensorsFile> shards_;
  std::unordered_map<std::string_view, const SafetensorsTensor*> index_;  // keys view names
  std::vector<const SafetensorsTensor*> sorted_;
};

}  // namespace pagoda
