// FNV-1a, 64-bit: a small, well-spread hash of bytes, for keys that are compared in full anyway
// (prefix-cache children) or that only need to differ (random-stream names).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagoda {

inline uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace pagoda
