// What the model tests share: reading reference logits, running token ids through a Model on a
// fresh paged sequence, and comparing logits as a fraction of the reference's range.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>
#include <span>
#include <vector>

#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/model/model.h"

namespace pagoda::testing {

// A fixture of raw little-endian f32 values (as tools/ writes them).
inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("missing fixture " + path);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  return v;
}


// Feeds `ids` to a fresh sequence in chunks of `chunk` tokens (1: token-by-token decode; a
// chunk that covers everything: one prefill) and returns the logits after each chunk. The
// model's KV cache must hold num_blocks blocks of block_size tokens.
inline std::vector<std::vector<float>> run_chunks(StepModel& model, const std::vector<int32_t>& ids, size_t chunk,
                                                  int32_t num_blocks, int32_t block_size) {
  kv::BlockPool pool(num_blocks, block_size);
  kv::BlockTable table;
  std::vector<std::vector<float>> out;
  for (size_t begin = 0; begin < ids.size(); begin += chunk) {
    const size_t n = std::min(chunk, ids.size() - begin);
    kv::append_tokens(table, int32_t(n), pool);
    const SequenceChunk c{.tokens = std::span(ids).subspan(begin, n),
                          .start_pos = int32_t(begin),
                          .block_ids = table.block_ids,
                          .want_logits = true};
    const auto logits = model.forward({&c, 1});
    out.emplace_back(logits.begin(), logits.end());
  }
  return out;
}

inline int32_t argmax(std::span<const float> v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// The greedy continuation of `prompt`, `tokens` long: prefilled at once, then decoded token by
// token on a fresh paged sequence. The model's KV cache must hold num_blocks blocks of block_size.
inline std::vector<int32_t> greedy(Model& model, const std::vector<int32_t>& prompt, size_t tokens,
                                   int32_t num_blocks, int32_t block_size) {
  kv::BlockPool pool(num_blocks, block_size);
  kv::BlockTable table;
  std::vector<int32_t> ids = prompt, out;
  size_t done = 0;
  while (out.size() < tokens) {
    const size_t n = ids.size() - done;
    kv::append_tokens(table, int32_t(n), pool);
    const SequenceChunk c{.tokens = std::span(ids).subspan(done, n),
                          .start_pos = int32_t(done),
                          .block_ids = table.block_ids,
                          .want_logits = true};
    const int32_t next = argmax(model.forward({&c, 1}));
    done = ids.size();
    ids.push_back(next);
    out.push_back(next);
  }
  return out;
}

// max |a - b| over max(b) - min(b): tolerances are fractions of the reference's logit range.
inline double relative_max_diff(std::span<const float> a, std::span<const float> b) {
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;  // a NaN on either side: as far off as can be
    diff = std::max(diff, d);
  }
  const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
  return diff / double(*hi - *lo);
}

}  // namespace pagoda::testing
