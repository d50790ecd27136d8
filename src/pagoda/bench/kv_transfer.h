// `pagoda bench kv-transfer`: one prompt's KV over the disaggregated host path (a TCP loopback
// connection, disagg/tcp_kv_transport.h), against the prefill that computes it. The same
// prompt is prefilled three ways: alone; then its pages sent in one frame after the prefill (the
// transfer time, next to its bound: bytes / the loopback's measured bandwidth); then layer by
// layer as the forward pass stores each layer (the prefill server's way). What the overlap hides
// is the part of the transfer that no longer adds to the time from the prompt's arrival to its
// last KV byte received, the reading of pages inside the forward pass counted:
//   hidden = (prefill alone + transfer - (prefill with per-layer sends + what is left after it)) / transfer
#pragma once

#include <string>

#include "pagoda/engine/session.h"

namespace pagoda::bench {

struct KvTransferBenchOptions {
  ModelFlags model;
  int prompt_tokens = 1024;
  int runs = 3;  // timed runs of each way (the median is reported), after one warm-up
  std::string json_path;
};

// Runs it, prints its table and writes json_path when set. Throws Error(kInvalidArgument) for
// options out of range.
void run_kv_transfer_bench(KvTransferBenchOptions options);

}  // namespace pagoda::bench
