// TcpKvTransport: the host path of KvTransport. Pages travel as kKv frames over the peer link's
// TCP connection, one frame per send() (a layer, or all of them), staged in host memory at both
// ends (a GPU backend copies them through pinned memory in read_kv_pages / write_kv_pages). The
// receiving link's reader thread reads a frame only if its header matches a posted receive
// exactly (request, the next layers it waits for, block count, bytes), so a peer cannot make it
// allocate or write anything it did not ask for; the pages reach the pool on the engine thread,
// in poll(), once every layer has come, and only for receives still posted.
#pragma once

#include <chrono>
#include <mutex>
#include <unordered_map>

#include "pagoda/disagg/kv_transport.h"
#include "pagoda/disagg/peer_link.h"

namespace pagoda::disagg {

class TcpKvTransport final : public KvTransport {
 public:
  explicit TcpKvTransport(PeerLink& link) : link_(link) {}

  void register_pool(Backend& backend, int32_t num_layers) override;
  void send(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens, int32_t first_layer,
            int32_t num_layers) override;
  void receive(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens, int32_t first_layer,
               int32_t num_layers) override;
  void cancel_receive(uint64_t request_id) override;
  void forget(uint64_t request_id) override;
  std::vector<TransferEvent> poll() override;

  // The link's reader thread, on a kKv frame header: reads the frame's pages into host memory.
  // Throws ProtocolError for a frame that was not asked for (the byte stream is then lost and
  // the link must close), PeerLost when the pages stop coming before `deadline`.
  void read_frame(const FrameHeader& header, Deadline deadline);
  // The link is gone: every posted receive fails with `reason`.
  void fail_all(const std::string& reason);

 private:
  struct Posted {
    std::vector<int32_t> blocks;
    int32_t last_block_tokens = 0;
    int32_t first_layer = 0, num_layers = 0;
    int32_t next_layer = 0;  // the layers before it have come
    uint64_t layer_bytes = 0;  // K and V pages, then the last block's tail
    bool reading = false;  // the reader thread is reading a frame of it
    bool staged = false;   // every layer has come
    bool cancelled = false;  // read and drop its pages
    std::string error;     // non-empty: failed
    std::vector<std::byte> pages;
    double seconds = 0;  // reading its frames' pages off the socket
  };
  uint64_t layer_bytes(size_t num_blocks, int32_t last_block_tokens) const;

  PeerLink& link_;
  Backend* backend_ = nullptr;
  int32_t num_layers_ = 0;
  uint64_t page_bytes_ = 0;
  std::mutex mutex_;
  std::unordered_map<uint64_t, Posted> posted_;
  std::vector<TransferEvent> sent_;  // send()s since the last poll
};

}  // namespace pagoda::disagg
