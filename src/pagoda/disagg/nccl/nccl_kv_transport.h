// NcclKvTransport: KvTransport between two GPUs, over one NCCL communicator per (prefill,
// decode) pair (rank 0 the prefill server, rank 1 the decode server). The decode server makes
// the communicator's unique id and sends it over the peer link (kNcclId); control stays on the
// link: before each send, the prefill server sends a kKvNccl frame naming the request, layers
// and blocks, and only when that matches a posted receive does the decode server's reader post
// the matching ncclRecv. So the communicator carries only pages both sides agreed on, in the
// order the link gave them.
//
// Pages move device to device on a stream of the transport's own, layer by layer: a send waits
// (an event) for the compute stream's work issued so far, i.e. the layer's K/V the forward pass
// just stored, gathers the layer's pages into one staging buffer and sends it; the receiver
// receives it and scatters it into its pool's pages. Neither blocks the engine thread or the
// compute stream. poll() reports a send once its pages are out of the pool (until then its
// blocks must stay the request's) and a receive once its last layer's scatter has finished on
// the GPU (an event), so a decode step issued after that reads the pages.
//
// Only for pools the GPU stores unquantized (f16, bf16: no int2 tails). Built only with CUDA and
// NCCL (CMake: pagoda_disagg_nccl).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <deque>
#include <mutex>
#include <unordered_map>

#include "pagoda/backend/cuda/cuda_backend.h"
#include "pagoda/disagg/kv_transport.h"
#include "pagoda/disagg/peer_link.h"

namespace pagoda::disagg {

class NcclKvTransport final : public KvTransport {
 public:
  // A fresh unique id, made by the decode server and sent in a kNcclId frame.
  static NcclId make_id();
  // Joins the pair's communicator on `device` (blocks until the peer joins too, or throws
  // Error(kInternal) with NCCL's reason). link: the pair's peer link, for the kKvNccl frames.
  NcclKvTransport(PeerLink& link, const NcclId& id, bool is_decode, int device);
  ~NcclKvTransport() override;
  NcclKvTransport(const NcclKvTransport&) = delete;
  NcclKvTransport& operator=(const NcclKvTransport&) = delete;

  // backend must be a CudaBackend on `device` whose pool is unquantized.
  void register_pool(Backend& backend, int32_t num_layers) override;
  void send(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens, int32_t first_layer,
            int32_t num_layers) override;
  void receive(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens, int32_t first_layer,
               int32_t num_layers) override;
  void cancel_receive(uint64_t request_id) override;
  void forget(uint64_t request_id) override;
  std::vector<TransferEvent> poll() override;

  // The decode link's reader thread, on a kKvNccl frame: posts the receive of those pages.
  // Throws ProtocolError for pages that were not asked for (the link must then close).
  void read_frame(const KvHeader& header);
  // The link is gone: the communicator is aborted (a receive waiting for pages that will not
  // come ends) and every posted receive fails with `reason`.
  void fail_all(const std::string& reason);

 private:
  struct Posted {
    std::vector<int32_t> blocks;
    int32_t first_layer = 0, num_layers = 0, next_layer = 0;
    bool cancelled = false;
    std::string error;
    cudaEvent_t done = nullptr;  // after its last layer's scatter
    std::chrono::steady_clock::time_point first_frame;
  };
  // Gathers (or scatters) one layer's pages of `blocks` to (from) staging_ on stream_.
  void copy_pages(int32_t layer, std::span<const int32_t> blocks, bool to_pool);
  void reserve_staging(size_t bytes);
  void release(Posted& p);

  PeerLink& link_;
  int device_;
  int peer_;  // the other rank
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  CudaBackend* backend_ = nullptr;
  int32_t num_layers_ = 0;
  size_t page_bytes_ = 0;
  std::mutex mutex_;  // posted_, aborted_, and every NCCL call (the engine thread and the reader both issue them)
  bool aborted_ = false;
  std::unordered_map<uint64_t, Posted> posted_;
  struct PendingSend {
    TransferEvent event;
    std::chrono::steady_clock::time_point start;
    cudaEvent_t gathered = nullptr;  // after its last layer's send on stream_
  };
  std::deque<PendingSend> sending_;
};

}  // namespace pagoda::disagg
