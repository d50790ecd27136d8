// Communicator: the collectives that tensor parallelism needs between the ranks of one model.
//
// A model split over N ranks (docs/design.md, "Tensor parallelism") runs one thread per rank in
// one process: each rank owns a Backend (one GPU, or a share of the CPU's cores), its shard of the
// weights and of the KV heads, and one Communicator. Every rank issues the same collectives in
// the same order with the same shapes; a rank that stops calling makes the others fail with a
// clear error after a timeout, never hang.
//
// On a GPU the collectives are enqueued on the rank's backend stream (so a CUDA graph captures
// them, and they order with the ops around them); on the CPU they complete before returning.
#pragma once

#include <string>

#include "pagoda/core/tensor.h"

namespace pagoda::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // x = the sum of every rank's x, in place, in x's dtype (f32, f16 or bf16); x is contiguous.
  virtual void all_reduce_sum(Tensor x) = 0;
  // out [n, world_size * m] = the ranks' x [n, m] side by side in rank order: columns [r * m,
  // (r + 1) * m) of out are rank r's x. x and out are 2-D, contiguous, of one dtype, on every
  // rank. (The vocabulary-split lm_head gathers its logits this way, so the full-vocabulary rows
  // come out ready to sample; with n == 1 it is a plain concatenation.)
  virtual void all_gather(const Tensor& x, Tensor out) = 0;

  // Makes every rank's pending and later collectives throw Error carrying `reason`, instead of
  // waiting for a rank that failed: the group is unusable after.
  virtual void abort(const std::string& reason) = 0;
  // Seconds this rank has spent inside collectives (waiting for the others included), where the
  // communicator measures it; 0 where collectives are only enqueued.
  virtual double seconds_in_collectives() const { return 0; }
};

}  // namespace pagoda::parallel
