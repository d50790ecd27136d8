#include "pagoda/model/shard.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

// The SwiGLU width is split in units of this many columns: 256 (a k-quant block) or 32 (the
// other GGUF blocks) where every rank still gets at least one unit.
int ffn_unit(int width, int world_size) {
  for (int unit : {256, 32})
    if (width % unit == 0 && width / unit >= world_size) return unit;
  return 1;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int world_size) {
  if (world_size < 1 || world_size > 64)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel must be in [1, 64], not {}", world_size);
  if (world_size > c.num_q_heads)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel {}: the model has {} q heads, fewer than the ranks",
         world_size, c.num_q_heads);
  if (world_size > c.intermediate_size || world_size > c.vocab_size)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel {}: the model is too narrow to split that many ways",
         world_size);
}

ShardLayout shard_layout(const ModelConfig& c, TensorShard shard) {
  const int n = shard.world_size, r = shard.rank;
  const int kv = c.num_kv_heads, group = c.num_q_heads / c.num_kv_heads;
  ShardLayout s;
  if (n <= kv) {  // whole GQA groups per rank
    s.kv_head_begin = kv * r / n;
    s.num_kv_heads = kv * (r + 1) / n - s.kv_head_begin;
    s.q_head_begin = s.kv_head_begin * group;
    s.num_q_heads = s.num_kv_heads * group;
  } else {  // several ranks per group: rank r is in group r * kv / n, and splits its q heads
    const int g = r * kv / n;
    const int first = (g * n + kv - 1) / kv, count = ((g + 1) * n + kv - 1) / kv - first, p = r - first;
    s.kv_head_begin = g;
    s.num_kv_heads = 1;
    s.q_head_begin = g * group + group * p / count;
    s.num_q_heads = g * group + group * (p + 1) / count - s.q_head_begin;
  }
  const int unit = ffn_unit(c.intermediate_size, n), units = c.intermediate_size / unit;
  s.ffn_begin = units * r / n * unit;
  s.ffn_size = units * (r + 1) / n * unit - s.ffn_begin;
  s.vocab_rows = (c.vocab_size + n - 1) / n;
  s.vocab_begin = r * s.vocab_rows;
  s.vocab_stored = std::max(0, std::min(s.vocab_rows, c.vocab_size - s.vocab_begin));
  return s;
}

ModelConfig shard_config(const ModelConfig& config, const ShardLayout& layout) {
  ModelConfig c = config;
  c.num_q_heads = layout.num_q_heads;
  c.num_kv_heads = layout.num_kv_heads;
  c.intermediate_size = layout.ffn_size;
  c.vocab_size = layout.vocab_rows;
  return c;
}

}  // namespace pagoda
