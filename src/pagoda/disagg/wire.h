// The messages between a decode server and a prefill server (docs/disaggregation.md).
//
// Every message is one frame: a 16-byte header (magic "PGKV", protocol version, message type,
// payload length; little-endian) and its payload. Control payloads are small and parsed whole
// here; a KV frame's payload is a short header (KvHeader) and the pages themselves, which the
// receiver reads straight into its staging buffer once the header matched what it asked for.
//
// The bytes come from the network: every parser checks every length against the bytes present
// and against the limits below, and throws ProtocolError (never reads past the end, never
// allocates more than the frame holds). A peer whose frame does not parse is disconnected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace pagoda::disagg {

inline constexpr uint32_t kMagic = 0x564b4750;  // "PGKV" little-endian
inline constexpr uint16_t kProtocolVersion = 2;
inline constexpr size_t kFrameHeaderBytes = 16;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // HMAC-SHA256
// Control frames are a prompt's tokens at most: 4M tokens is far beyond any context.
inline constexpr uint64_t kMaxControlPayload = uint64_t(16) << 20;
inline constexpr uint64_t kMaxReasonBytes = 1024;

// Thrown for bytes that do not make a valid message; what() is the reason that gets logged.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class MessageType : uint16_t {
  kHello = 1,       // decode -> prefill: client nonce
  kChallenge = 2,   // prefill -> decode: server nonce, server's proof of the key
  kAuth = 3,        // decode -> prefill: client's proof of the key, its KV format
  kAccept = 4,      // prefill -> decode: the prefill server's KV format (they match)
  kRefuse = 5,      // either way: why the connection ends
  kPrefill = 6,     // decode -> prefill: one request to prefill
  kCancel = 7,      // decode -> prefill: forget a request
  kKv = 8,          // prefill -> decode: KvHeader then the request's pages
  kPrefillDone = 9,     // prefill -> decode: the first token; the KV frame came before it
  kPrefillFailed = 10,  // prefill -> decode: the request could not be prefilled, and why
  // Between GPUs (NcclKvTransport, disagg/nccl/): the pair's NCCL communicator moves the pages.
  kNcclId = 11,    // decode -> prefill, after Accept: the communicator's unique id
  kKvNccl = 12,    // prefill -> decode: a KvHeader; those pages follow on the communicator
};

struct FrameHeader {
  MessageType type{};
  uint64_t payload_bytes = 0;
};

// What both sides' KV pools must agree on for pages to be copied as they are.
struct KvFormat {
  uint8_t dtype = 0;        // pagoda::DType (of an int2 pool's unquantized tail: f16)
  uint8_t layout = 0;       // pagoda::KvLayout
  uint8_t quant = 0;        // pagoda::KvQuant: none, fp8 or int2
  uint8_t rotation = 0;     // 1: keys stored rotated by the randomized Hadamard transform
  uint32_t partition = 0;   // int2's partition Π (0: not int2)
  int32_t num_layers = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  uint64_t page_bytes = 0;  // one block of one layer's K (or V) pool
  uint64_t model_fingerprint = 0;  // the model's shape and vocabulary: same model on both sides
  friend bool operator==(const KvFormat&, const KvFormat&) = default;
};
std::string describe(const KvFormat& format);

struct Hello {
  std::vector<uint8_t> nonce;  // kNonceBytes
};
struct Challenge {
  std::vector<uint8_t> nonce;  // kNonceBytes
  std::vector<uint8_t> mac;    // kMacBytes
};
struct Auth {
  std::vector<uint8_t> mac;
  KvFormat format;
};
struct Refuse {
  std::string reason;
};
// The sampling state the first token needs (stop conditions stay on the decode server).
struct WireSampling {
  float temperature = 0.f;
  int32_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  uint64_t seed = 0;
};
struct PrefillRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;     // the prompt
  std::vector<int32_t> block_ids;  // the decode server's blocks for it, in order
  int32_t skip_blocks = 0;         // leading blocks the decode server has cached: not sent
  WireSampling sampling;
};
struct KvHeader {  // the start of a kKv payload
  uint64_t request_id = 0;
  int32_t first_layer = 0;
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
};
inline constexpr size_t kKvHeaderBytes = 20;
struct PrefillDone {
  uint64_t request_id = 0;
  int32_t first_token = 0;
};
struct PrefillFailed {
  uint64_t request_id = 0;
  std::string reason;
};
struct Cancel {
  uint64_t request_id = 0;
};
inline constexpr size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct NcclId {
  std::vector<uint8_t> id;  // kNcclIdBytes
};

// Header: checks magic, version and the type, and bounds a control payload (a KV payload is
// bounded by the receiver, which knows what it asked for).
FrameHeader parse_frame_header(std::span<const uint8_t> bytes);  // exactly kFrameHeaderBytes
std::vector<uint8_t> encode_frame_header(MessageType type, uint64_t payload_bytes);

// Each parse_* takes one whole payload and rejects trailing bytes; each encode_* returns a whole
// frame, header included.
Hello parse_hello(std::span<const uint8_t> payload);
Challenge parse_challenge(std::span<const uint8_t> payload);
Auth parse_auth(std::span<const uint8_t> payload);
KvFormat parse_accept(std::span<const uint8_t> payload);
Refuse parse_refuse(std::span<const uint8_t> payload);
PrefillRequest parse_prefill(std::span<const uint8_t> payload);
Cancel parse_cancel(std::span<const uint8_t> payload);
KvHeader parse_kv_header(std::span<const uint8_t> bytes);  // exactly kKvHeaderBytes
PrefillDone parse_prefill_done(std::span<const uint8_t> payload);
PrefillFailed parse_prefill_failed(std::span<const uint8_t> payload);
NcclId parse_nccl_id(std::span<const uint8_t> payload);
KvHeader parse_kv_nccl(std::span<const uint8_t> payload);  // a kKvNccl payload: one KvHeader

std::vector<uint8_t> encode(const Hello& m);
std::vector<uint8_t> encode(const Challenge& m);
std::vector<uint8_t> encode(const Auth& m);
std::vector<uint8_t> encode_accept(const KvFormat& m);
std::vector<uint8_t> encode(const Refuse& m);
std::vector<uint8_t> encode(const PrefillRequest& m);
std::vector<uint8_t> encode(const Cancel& m);
// The frame header and KvHeader of a KV frame whose pages (kv_pages_bytes) follow.
std::vector<uint8_t> encode_kv_prefix(const KvHeader& m, uint64_t page_bytes, uint64_t tail_bytes);
std::vector<uint8_t> encode(const PrefillDone& m);
std::vector<uint8_t> encode(const PrefillFailed& m);
std::vector<uint8_t> encode(const NcclId& m);
std::vector<uint8_t> encode_kv_nccl(const KvHeader& m);

// Bytes of a KV frame's pages: in each of num_layers layers, the K and V pages of num_blocks
// blocks, then tail_bytes of the last block's unquantized tail (int2; see Backend::kv_tail_bytes).
uint64_t kv_pages_bytes(const KvHeader& m, uint64_t page_bytes, uint64_t tail_bytes);

}  // namespace pagoda::disagg
