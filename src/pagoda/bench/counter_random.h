// Counter-based pseudo-random numbers for synthetic data: value i of a stream is a pure function of
// (stream, i). Random access is the point: threads fill disjoint ranges of one tensor without
// sharing a generator, a trace's hash id becomes the same block of tokens wherever it appears, and
// bench/hf_generate.py regenerates pagoda's synthetic prompts in numpy (same formula) without
// reading them from pagoda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pagoda::bench {

// splitmix64's output function: a bijection of 64 bits with good avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr uint64_t counter_random(uint64_t stream, uint64_t index) { return mix64(mix64(stream) + index); }

// count token ids in [0, vocab) from stream: ids[i] = counter_random(stream, i) % vocab.
inline std::vector<int32_t> synthetic_tokens(uint64_t stream, int64_t count, int32_t vocab) {
  std::vector<int32_t> ids(size_t(count > 0 ? count : 0));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(counter_random(stream, i) % uint64_t(vocab));
  return ids;
}

// The stream of offline request r of a benchmark seeded with seed (bench/hf_generate.py uses the
// same): seeds and requests never collide below 2^32 requests.
constexpr uint64_t offline_request_stream(uint64_t seed, uint64_t request) { return (seed << 32) + request; }

}  // namespace pagoda::bench
