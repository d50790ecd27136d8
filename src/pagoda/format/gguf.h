// GGUF v2/v3 reader. The file is mapped; tensor data are views into the mapping. Everything read
// from the file (counts, string lengths, types, dimensions, offsets) is validated against its
// size before use, so a truncated, corrupt or hostile file throws Error(kCorrupt) naming the
// problem and its byte offset instead of reading out of bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "pagoda/format/file_bytes.h"
#include "pagoda/format/ggml_type.h"

namespace pagoda {

enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// A metadata value. Arrays may nest (an array of arrays); their elements share one type.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;

  // Typed access; each throws Error(kCorrupt) when the value is not of a compatible type
  // (integers of any width and signedness convert when in range).
  int64_t as_int() const;
  double as_float() const;  // any integer or float type
  bool as_bool() const;
  const std::string& as_string() const;
  const std::vector<GgufValue>& as_array() const;
  GgufValueType array_type() const;  // element type of an array (kU8 for an empty one)
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the fastest-varying (row length)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // absolute byte offset in the file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // view into the file's bytes

  int64_t numel() const { return shape_numel(dims); }
};

class GgufFile {
 public:
  // Maps and parses a file. Throws kNotFound (cannot open) or kCorrupt.
  static GgufFile open(const std::string& path);
  // Parses bytes owned by the caller (kept alive by the caller), e.g. a fuzzer's input.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string_view origin = "<memory>");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& origin() const { return source_.origin; }

  // Metadata in file order, and lookup by key.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  // Lookups that throw Error(kNotFound) "missing metadata key 'K' in FILE" when absent.
  const GgufValue& at(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // null when absent

 private:
  explicit GgufFile(FileBytes source);  // parses source.bytes
  void parse_bytes(std::span<const uint8_t> bytes);

  FileBytes source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace pagoda
