// KvTransport: moves the KV pages of a request between a prefill server's pool and a decode
// server's (docs/disaggregation.md). The control messages (which request, which blocks, the
// first token) travel separately, over the peer link; a transport moves pages only.
//
// One transport per peer connection. The sender's engine thread calls send() as the pages are
// computed: all layers at once, or layer by layer as the forward pass stores each (so that the
// transfer overlaps the rest of the prefill). The receiver's engine thread posts receive() for
// the whole layer range before asking for the prefill, and poll() reports each transfer once,
// when every layer has come: completed (its pages are in the registered pool) or failed.
// Implementations: TcpKvTransport (host memory over the peer link's TCP connection; a GPU pool
// is staged through pinned host memory by the backend) and, between two GPUs, NcclKvTransport
// (nccl/nccl_kv_transport.h: layer-by-layer NCCL send/recv on a stream of its own).
//
// Pages travel as the pool stores them (Backend::read_kv_pages): a quantized pool's codes and
// metadata, so int2 or fp8 KV stays compressed on the wire. An int2 sequence's last V partition,
// still unquantized, travels with its last block (Backend::kv_tail_bytes): both sides know how
// many tokens that block holds, `last_block_tokens`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagoda/backend/backend.h"

namespace pagoda::disagg {

struct TransferEvent {
  uint64_t request_id = 0;
  bool ok = false;
  std::string error;    // why it failed
  uint64_t bytes = 0;   // page bytes moved
  // receive: reading its pages off the wire (summed over its frames: between per-layer frames
  // the prefill computes); send: reading the pages from the pool
  double seconds = 0;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // The pool pages are read from and written to (the engine's backend), before any transfer.
  virtual void register_pool(Backend& backend, int32_t num_layers) = 0;
  // Sends the pages of `blocks` (the last holding last_block_tokens tokens) in layers
  // [first_layer, first_layer + num_layers) for request `request_id`. Engine thread. The pages
  // are read by the time poll() reports the send (TcpKvTransport: before send returns); until
  // then the blocks must keep them. A request's sends cover its layers in order.
  virtual void send(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens,
                    int32_t first_layer, int32_t num_layers) = 0;
  // Expects those pages for request `request_id`, to be written into `blocks` of the pool.
  virtual void receive(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens,
                       int32_t first_layer, int32_t num_layers) = 0;
  // Its blocks are no longer its own (the request was cancelled or moved elsewhere): pages that
  // still arrive for it are dropped, never written.
  virtual void cancel_receive(uint64_t request_id) = 0;
  // The peer answered without pages (it failed the request): nothing more will come for it.
  virtual void forget(uint64_t request_id) = 0;
  // Transfers finished since the last call. Engine thread.
  virtual std::vector<TransferEvent> poll() = 0;
};

}  // namespace pagoda::disagg
