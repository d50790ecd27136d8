#include "pagoda/format/file_bytes.h"

#include <limits>

namespace pagoda {

FileBytes FileBytes::map(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  const std::span<const uint8_t> bytes = file->bytes();
  return {.file = std::move(file), .origin = path, .bytes = bytes};
}

FileBytes FileBytes::borrow(std::span<const uint8_t> bytes, std::string_view origin) {
  return {.file = nullptr, .origin = std::string(origin), .bytes = bytes};
}

bool multiply_dim(uint64_t& numel, uint64_t dim) {
  constexpr uint64_t kMax = uint64_t(std::numeric_limits<int64_t>::max());
  return dim <= kMax && !__builtin_mul_overflow(numel, dim, &numel) && numel <= kMax;
}

int64_t shape_numel(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

}  // namespace pagoda
