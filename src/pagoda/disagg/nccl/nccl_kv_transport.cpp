#include "pagoda/disagg/nccl/nccl_kv_transport.h"

#include <fmt/format.h>

#include <cstring>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/core/error.h"

namespace pagoda::disagg {
namespace {

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess && result != ncclInProgress)
    fail(ErrorKind::kInternal, "NCCL KV transport: {}: {}", what, ncclGetErrorString(result));
}

// Makes `device` current on the calling thread (the engine thread and the link's reader both
// call in) and restores the one it had.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    cuda::check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~OnDevice() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace

NcclId NcclKvTransport::make_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  static_assert(sizeof(id.internal) == kNcclIdBytes);
  NcclId out{std::vector<uint8_t>(kNcclIdBytes)};
  std::memcpy(out.id.data(), id.internal, kNcclIdBytes);
  return out;
}

NcclKvTransport::NcclKvTransport(PeerLink& link, const NcclId& id, bool is_decode, int device)
    : link_(link), device_(device), peer_(is_decode ? 0 : 1) {
  if (id.id.size() != kNcclIdBytes) fail(ErrorKind::kInvalidArgument, "NCCL unique id of {} bytes", id.id.size());
  ncclUniqueId unique;
  std::memcpy(unique.internal, id.id.data(), kNcclIdBytes);
  OnDevice on(device_);
  check_nccl(ncclCommInitRank(&comm_, 2, unique, is_decode ? 1 : 0), "ncclCommInitRank");
  cuda::check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::check_cuda(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "cudaEventCreate");
}

NcclKvTransport::~NcclKvTransport() {
  OnDevice on(device_);
  for (auto& [id, p] : posted_) release(p);
  for (PendingSend& s : sending_) cudaEventDestroy(s.gathered);
  // Abort, not destroy: a peer gone mid-transfer leaves operations that would never finish.
  if (comm_ && !aborted_) ncclCommAbort(comm_);
  if (stream_) cudaStreamDestroy(stream_);
  if (compute_done_) cudaEventDestroy(compute_done_);
  if (staging_) cudaFree(staging_);
}

void NcclKvTransport::register_pool(Backend& backend, int32_t num_layers) {
  backend_ = dynamic_cast<CudaBackend*>(&backend);
  if (!backend_) fail(ErrorKind::kUnsupported, "the NCCL KV transport needs the cuda backend, not {}", backend.name());
  if (backend.kv_tail_bytes(1) != 0)
    fail(ErrorKind::kUnsupported, "the NCCL KV transport moves unquantized pools only");
  num_layers_ = num_layers;
  page_bytes_ = backend.kv_page_bytes();
}

void NcclKvTransport::reserve_staging(size_t bytes) {
  if (bytes <= staging_bytes_) return;
  // Stream-ordered: the old buffer may still be in use by operations on stream_.
  cuda::check_cuda(cudaStreamSynchronize(stream_), "NCCL KV staging");
  if (staging_) cudaFree(staging_);
  staging_ = nullptr;
  staging_bytes_ = 0;
  cuda::check_cuda(cudaMalloc(&staging_, bytes), "NCCL KV staging");
  staging_bytes_ = bytes;
}

void NcclKvTransport::copy_pages(int32_t layer, std::span<const int32_t> blocks, bool to_pool) {
  const PagedKv& pool = backend_->kv_layer(layer);
  auto* staging = static_cast<std::byte*>(staging_);
  for (void* base : {pool.k, pool.v})
    for (int32_t id : blocks) {
      if (id < 0 || id >= pool.num_blocks)
        fail(ErrorKind::kInvalidArgument, "KV page of block {} outside the pool's {} blocks", id, pool.num_blocks);
      std::byte* page = static_cast<std::byte*>(base) + size_t(id) * page_bytes_;
      cuda::check_cuda(to_pool ? cudaMemcpyAsync(page, staging, page_bytes_, cudaMemcpyDeviceToDevice, stream_)
                               : cudaMemcpyAsync(staging, page, page_bytes_, cudaMemcpyDeviceToDevice, stream_),
                       "NCCL KV page copy");
      staging += page_bytes_;
    }
}

void NcclKvTransport::send(uint64_t request_id, std::span<const int32_t> blocks, int32_t /*last_block_tokens*/,
                           int32_t first_layer, int32_t num_layers) {
  if (!backend_) fail(ErrorKind::kInternal, "NCCL KV transport: send before register_pool");
  const auto start = std::chrono::steady_clock::now();
  const size_t layer_bytes = 2 * blocks.size() * page_bytes_;
  std::lock_guard lock(mutex_);
  if (aborted_) return;  // the link is gone: nothing more goes out
  OnDevice on(device_);
  reserve_staging(layer_bytes);
  // The layer's K/V are what the compute stream was given so far: wait for it, not the host.
  cuda::check_cuda(cudaEventRecord(compute_done_, backend_->stream()), "cudaEventRecord");
  cuda::check_cuda(cudaStreamWaitEvent(stream_, compute_done_), "cudaStreamWaitEvent");
  for (int32_t l = first_layer; l < first_layer + num_layers; ++l) {
    link_.send(encode_kv_nccl({.request_id = request_id, .first_layer = l, .num_layers = 1,
                               .num_blocks = int32_t(blocks.size())}));
    copy_pages(l, blocks, false);
    check_nccl(ncclSend(staging_, layer_bytes, ncclChar, peer_, comm_, stream_), "ncclSend");
  }
  PendingSend pending{.event = {.request_id = request_id, .ok = true, .bytes = uint64_t(num_layers) * layer_bytes}, .start = start};
  cuda::check_cuda(cudaEventCreateWithFlags(&pending.gathered, cudaEventDisableTiming), "cudaEventCreate");
  cuda::check_cuda(cudaEventRecord(pending.gathered, stream_), "cudaEventRecord");
  sending_.push_back(pending);
}

void NcclKvTransport::receive(uint64_t request_id, std::span<const int32_t> blocks, int32_t /*last_block_tokens*/,
                              int32_t first_layer, int32_t num_layers) {
  if (!backend_) fail(ErrorKind::kInternal, "NCCL KV transport: receive before register_pool");
  if (first_layer < 0 || num_layers <= 0 || first_layer + num_layers > num_layers_)
    fail(ErrorKind::kInternal, "KV transport: layers [{}, {}) outside the model's {}", first_layer,
         first_layer + num_layers, num_layers_);
  std::lock_guard lock(mutex_);
  OnDevice on(device_);
  Posted& p = posted_[request_id];
  release(p);
  p = Posted{.blocks = {blocks.begin(), blocks.end()},
             .first_layer = first_layer,
             .num_layers = num_layers,
             .next_layer = first_layer};
  cuda::check_cuda(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), "cudaEventCreate");
}

void NcclKvTransport::read_frame(const KvHeader& header) {
  std::lock_guard lock(mutex_);
  auto it = posted_.find(header.request_id);
  if (it == posted_.end() || !it->second.error.empty())
    throw ProtocolError(fmt::format("KV pages for request {}, which this server is not waiting for", header.request_id));
  Posted& p = it->second;
  if (header.first_layer != p.next_layer || header.num_layers > p.first_layer + p.num_layers - p.next_layer ||
      header.num_blocks != int32_t(p.blocks.size()))
    throw ProtocolError(fmt::format("KV pages of layers [{}, +{}) x {} blocks for request {}, expected [{}, +{}) x {}",
                                    header.first_layer, header.num_layers, header.num_blocks, header.request_id,
                                    p.next_layer, p.first_layer + p.num_layers - p.next_layer, p.blocks.size()));
  if (p.next_layer == p.first_layer) p.first_frame = std::chrono::steady_clock::now();
  OnDevice on(device_);
  const size_t layer_bytes = 2 * p.blocks.size() * page_bytes_;
  reserve_staging(layer_bytes);
  for (int32_t l = header.first_layer; l < header.first_layer + header.num_layers; ++l) {
    check_nccl(ncclRecv(staging_, layer_bytes, ncclChar, peer_, comm_, stream_), "ncclRecv");
    // A cancelled receive's blocks may be someone else's by now: its pages are received (the
    // communicator stays in step) and dropped.
    if (!p.cancelled) copy_pages(l, p.blocks, true);
  }
  p.next_layer += header.num_layers;
  if (p.next_layer == p.first_layer + p.num_layers) cuda::check_cuda(cudaEventRecord(p.done, stream_), "cudaEventRecord");
}

void NcclKvTransport::cancel_receive(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  auto it = posted_.find(request_id);
  if (it == posted_.end()) return;
  it->second.cancelled = true;
  // Scatters already on stream_ write the request's blocks: whatever the compute stream does with
  // those blocks next (they go back to the pool) comes after them.
  OnDevice on(device_);
  if (!aborted_) {
    cuda::check_cuda(cudaEventRecord(compute_done_, stream_), "cudaEventRecord");
    cuda::check_cuda(cudaStreamWaitEvent(backend_->stream(), compute_done_), "cudaStreamWaitEvent");
  }
  if (it->second.next_layer == it->second.first_layer + it->second.num_layers || !it->second.error.empty()) {
    release(it->second);
    posted_.erase(it);
  }
}

void NcclKvTransport::forget(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  auto it = posted_.find(request_id);
  if (it == posted_.end()) return;
  OnDevice on(device_);
  release(it->second);
  posted_.erase(it);
}

void NcclKvTransport::release(Posted& p) {
  if (p.done) cudaEventDestroy(p.done);
  p.done = nullptr;
}

void NcclKvTransport::fail_all(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (!aborted_) {
    OnDevice on(device_);
    ncclCommAbort(comm_);  // operations waiting for a peer that is gone end
    aborted_ = true;
  }
  for (auto& [id, p] : posted_)
    if (p.error.empty()) p.error = reason;
}

std::vector<TransferEvent> NcclKvTransport::poll() {
  std::lock_guard lock(mutex_);
  std::vector<TransferEvent> events;
  OnDevice on(device_);
  // Sends, in order: each is done once its pages are out of the pool (its last send has left
  // the staging buffer it reused).
  while (!sending_.empty() && (aborted_ || cudaEventQuery(sending_.front().gathered) == cudaSuccess)) {
    PendingSend& s = sending_.front();
    s.event.ok = !aborted_;
    if (aborted_) s.event.error = "the link was lost";
    s.event.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count();
    events.push_back(s.event);
    cudaEventDestroy(s.gathered);
    sending_.pop_front();
  }
  for (auto it = posted_.begin(); it != posted_.end();) {
    Posted& p = it->second;
    const bool all_posted = p.next_layer == p.first_layer + p.num_layers;
    if (!p.error.empty() || (all_posted && cudaEventQuery(p.done) == cudaSuccess)) {
      if (!p.cancelled) {
        events.push_back({.request_id = it->first,
                          .ok = p.error.empty(),
                          .error = p.error,
                          .bytes = p.error.empty() ? uint64_t(p.num_layers) * 2 * p.blocks.size() * page_bytes_ : 0,
                          .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.first_frame).count()});
      }
      release(p);
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

}  // namespace pagoda::disagg
