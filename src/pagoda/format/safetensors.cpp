#include "pagoda/format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

using nlohmann::json;

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  return std::nullopt;
}

// Parses JSON without letting an nlohmann exception escape: a parse error is a corrupt file.
json parse_json(const char* begin, const char* end, std::string_view what,
                const std::string& origin) {
  json j = json::parse(begin, end, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(ErrorKind::kCorrupt, "corrupt {} '{}': not valid JSON", what, origin);
  return j;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) { return SafetensorsFile(FileBytes::map(path)); }

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string_view origin) {
  return SafetensorsFile(FileBytes::borrow(bytes, origin));
}

SafetensorsFile::SafetensorsFile(FileBytes source) : source_(std::move(source)) { parse_bytes(source_.bytes); }

void SafetensorsFile::parse_bytes(std::span<const uint8_t> bytes) {
  auto corrupt = [&]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fail(ErrorKind::kCorrupt, "corrupt safetensors file '{}': {}", source_.origin,
         fmt::format(format, std::forward<Args>(args)...));
  };

  // Layout: u64 little-endian header length N, N bytes of JSON, then the data section, which
  // the header's data_offsets index from its start.
  if (bytes.size() < 8)
    corrupt("file of {} bytes is shorter than the 8-byte header length", bytes.size());
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8) {
    corrupt("header length {} at offset 0 runs past end of file (size {})", header_len,
            bytes.size());
  }
  const char* header = reinterpret_cast<const char*>(bytes.data() + 8);
  const json root = parse_json(header, header + header_len, "safetensors file", source_.origin);
  if (!root.is_object()) corrupt("header is not a JSON object");
  const uint8_t* data = bytes.data() + 8 + header_len;
  const uint64_t data_size = bytes.size() - 8 - header_len;

  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) corrupt("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) corrupt("__metadata__ value of '{}' is not a string", key);
        metadata_.emplace_back(key, value.get<std::string>());
      }
      continue;
    }
    if (!entry.is_object()) corrupt("entry of tensor '{}' is not an object", name);
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string())
      corrupt("tensor '{}' has no dtype string", name);
    if (shape_it == entry.end() || !shape_it->is_array())
      corrupt("tensor '{}' has no shape array", name);
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      corrupt("tensor '{}' data_offsets is not a pair of non-negative integers", name);
    }

    SafetensorsTensor t;
    t.name = name;
    const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
    const std::optional<DType> dtype = dtype_from_name(dtype_name);
    if (!dtype) {
      fail(ErrorKind::kUnsupported,
           "safetensors file '{}': tensor '{}' has dtype {}, which pagoda "
           "does not support (F32, F16, BF16, I32, I64, U8)",
           source_.origin, name, dtype_name);
    }
    t.dtype = *dtype;
    uint64_t numel = 1;
    for (const json& dim : *shape_it) {
      if (!dim.is_number_unsigned())
        corrupt("tensor '{}' shape holds a non-integer or negative value", name);
      const uint64_t d = dim.get<uint64_t>();
      if (!multiply_dim(numel, d)) {
        corrupt("tensor '{}' shape overflows 64 bits", name);
      }
      t.shape.push_back(int64_t(d));
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      corrupt("tensor '{}' data_offsets [{}, {}] lie outside the data section of {} bytes", name,
              begin, end, data_size);
    }
    uint64_t expected;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &expected) ||
        expected != end - begin) {
      corrupt("tensor '{}' holds {} bytes but its shape and dtype {} need {}", name, end - begin,
              dtype_name, numel * dtype_size(t.dtype));
    }
    t.data = data + begin;
    t.nbytes = end - begin;
    // Duplicate names never reach here: the JSON parser keeps the last of duplicate keys.
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsModel SafetensorsModel::open(const std::string& path) {
  namespace fs = std::filesystem;
  SafetensorsModel m;
  m.origin_ = path;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    m.shards_.push_back(SafetensorsFile::open(path));
    m.index_tensors();
    return m;
  }

  const fs::path dir(path);
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!fs::exists(index_path, ec)) {
    const fs::path single = dir / "model.safetensors";
    if (!fs::exists(single, ec)) {
      fail(ErrorKind::kNotFound,
           "'{}' holds neither model.safetensors nor "
           "model.safetensors.index.json",
           path);
    }
    m.shards_.push_back(SafetensorsFile::open(single.string()));
    m.index_tensors();
    return m;
  }

  const MappedFile index_file(index_path.string());
  const char* text = reinterpret_cast<const char*>(index_file.data());
  const json index =
      parse_json(text, text + index_file.size(), "safetensors index", index_file.path());
  auto corrupt = [&]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fail(ErrorKind::kCorrupt, "corrupt safetensors index '{}': {}", index_file.path(),
         fmt::format(format, std::forward<Args>(args)...));
  };
  const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (weight_map == index.end() || !weight_map->is_object()) corrupt("no weight_map object");

  std::map<std::string, size_t> shard_of_name;  // sorted: shards open in a stable order
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string()) corrupt("weight_map entry of '{}' is not a string", tensor);
    const std::string& name = shard.get_ref<const std::string&>();
    // Shards sit beside the index; a path would let an index point anywhere on disk.
    if (name.empty() || name.find('/') != std::string::npos ||
        name.find('\\') != std::string::npos || name == "." || name == "..") {
      corrupt("shard '{}' of tensor '{}' is not a plain file name", name, tensor);
    }
    shard_of_name.emplace(name, 0);
  }
  for (auto& [name, shard] : shard_of_name) {
    shard = m.shards_.size();
    m.shards_.push_back(SafetensorsFile::open((dir / name).string()));
  }
  m.index_tensors();  // also rejects a tensor held by two shards

  for (const auto& [tensor, shard] : weight_map->items()) {
    const std::string& name = shard.get_ref<const std::string&>();
    if (!m.shards_[shard_of_name.at(name)].find(tensor)) {
      corrupt("tensor '{}' is not in its shard '{}'", tensor, name);
    }
  }
  return m;
}

void SafetensorsModel::index_tensors() {
  for (const SafetensorsFile& shard : shards_) {
    for (const SafetensorsTensor& t : shard.tensors()) {
      if (!index_.emplace(t.name, &t).second) {
        fail(ErrorKind::kCorrupt,
             "safetensors model '{}': tensor '{}' appears in more than one "
             "shard (again in '{}')",
             origin_, t.name, shard.origin());
      }
      sorted_.push_back(&t);
    }
  }
  std::sort(
      sorted_.begin(), sorted_.end(),
      [](const SafetensorsTensor* a, const SafetensorsTensor* b) { return a->name < b->name; });
}

const SafetensorsTensor* SafetensorsModel::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const SafetensorsTensor& SafetensorsModel::at(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  if (!t) fail(ErrorKind::kNotFound, "no tensor '{}' in safetensors model '{}'", name, origin_);
  return *t;
}

}  // namespace pagoda
