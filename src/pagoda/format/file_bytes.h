// What the GGUF and safetensors readers share: the bytes they parse in place, with the name their
// errors give, and the checked element count of a tensor's shape. A reader either maps a file
// (tensors are views into the mapping, which the reader keeps alive) or parses caller-owned bytes
// (a fuzzer's input, kept alive by the caller).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "pagoda/core/mapped_file.h"

namespace pagoda {

struct FileBytes {
  std::shared_ptr<MappedFile> file;  // null for caller-owned bytes
  std::string origin;                // the path, or the caller's name for the bytes
  std::span<const uint8_t> bytes;

  // Throws Error(kNotFound) when the file cannot be opened, kInternal when it cannot be mapped.
  static FileBytes map(const std::string& path);
  static FileBytes borrow(std::span<const uint8_t> bytes, std::string_view origin);
};

// Multiplies numel by one more dimension of a shape; false when the dimension or the product
// leaves int64 (a corrupt header), leaving numel unspecified.
bool multiply_dim(uint64_t& numel, uint64_t dim);

// The element count of a shape whose product the parser checked with multiply_dim.
int64_t shape_numel(std::span<const int64_t> dims);

}  // namespace pagoda
