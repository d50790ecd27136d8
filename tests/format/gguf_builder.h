// Builds GGUF files in memory for the reader's tests: valid files of any shape, and the raw
// pieces to assemble invalid ones.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/format/gguf.h"

namespace pagoda::testing {

// Little-endian encoder.
struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& pod(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes& str(std::string_view s) {
    pod<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& append(const Bytes& o) {
    b.insert(b.end(), o.b.begin(), o.b.end());
    return *this;
  }
};

// An array value's encoding (after its type tag): element type, count, then the elements.
inline Bytes array_value(GgufValueType element_type, uint64_t count, const Bytes& elements) {
  Bytes v;
  v.pod<uint32_t>(uint32_t(element_type)).pod<uint64_t>(count).append(elements);
  return v;
}

struct GgufBuilder {
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
  };

  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only: add "general.alignment" with kv() to declare another
  uint64_t kv_count = 0;
  Bytes kv_bytes;
  std::vector<Tensor> tensors;

  // value: the value's encoding without its type tag.
  GgufBuilder& kv(std::string_view key, GgufValueType type, const Bytes& value) {
    kv_bytes.str(key).pod<uint32_t>(uint32_t(type)).append(value);
    ++kv_count;
    return *this;
  }
  template <typename T>
  GgufBuilder& kv_pod(std::string_view key, GgufValueType type, T value) {
    return kv(key, type, Bytes().pod<T>(value));
  }
  GgufBuilder& kv_string(std::string_view key, std::string_view value) {
    return kv(key, GgufValueType::kString, Bytes().str(value));
  }
  GgufBuilder& tensor(std::string name, std::vector<uint64_t> dims, GgmlType type,
                      std::vector<uint8_t> data) {
    tensors.push_back({std::move(name), std::move(dims), uint32_t(type), std::move(data)});
    return *this;
  }

  // Data offsets pack each tensor at the next multiple of the alignment.
  std::vector<uint64_t> offsets() const {
    std::vector<uint64_t> out;
    uint64_t at = 0;
    for (const Tensor& t : tensors) {
      out.push_back(at);
      at = (at + t.data.size() + alignment - 1) / alignment * alignment;
    }
    return out;
  }

  Bytes header() const {
    Bytes h;
    h.pod<uint32_t>(0x46554747)
        .pod<uint32_t>(version)
        .pod<uint64_t>(tensors.size())
        .pod<uint64_t>(kv_count);
    h.append(kv_bytes);
    const std::vector<uint64_t> offs = offsets();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      h.str(t.name).pod<uint32_t>(uint32_t(t.dims.size()));
      for (uint64_t d : t.dims) h.pod<uint64_t>(d);
      h.pod<uint32_t>(t.type).pod<uint64_t>(offs[i]);
    }
    return h;
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out = header().b;
    if (tensors.empty()) return out;
    const uint64_t data_start = (out.size() + alignment - 1) / alignment * alignment;
    const std::vector<uint64_t> offs = offsets();
    out.resize(data_start + offs.back() + tensors.back().data.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::copy(tensors[i].data.begin(), tensors[i].data.end(), out.begin() + data_start + offs[i]);
    }
    return out;
  }
};

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace pagoda::testing
