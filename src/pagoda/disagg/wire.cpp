#include "pagoda/disagg/wire.h"

#include <cstring>

#include <fmt/format.h>

namespace pagoda::disagg {
namespace {

// Little-endian field reader over one payload; every read checks the bytes left.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T value{};
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));  // x86-64 and aarch64 are little-endian
    at_ += sizeof(T);
    return value;
  }
  std::vector<uint8_t> bytes(size_t n, const char* what) {
    need(n, what);
    std::vector<uint8_t> out(bytes_.begin() + ptrdiff_t(at_), bytes_.begin() + ptrdiff_t(at_ + n));
    at_ += n;
    return out;
  }
  // A u32 count of int32 values; the count is checked against the bytes present before any
  // allocation, so a lying count cannot make us allocate.
  std::vector<int32_t> int32s(const char* what) {
    const auto n = get<uint32_t>(what);
    if (uint64_t(n) * 4 > left()) throw ProtocolError(fmt::format("{}: {} values, but {} bytes left", what, n, left()));
    std::vector<int32_t> out(n);
    if (n > 0) std::memcpy(out.data(), bytes_.data() + at_, size_t(n) * 4);  // data() may be null when empty
    at_ += size_t(n) * 4;
    return out;
  }
  std::string string(const char* what) {
    const auto n = get<uint32_t>(what);
    if (n > kMaxReasonBytes) throw ProtocolError(fmt::format("{}: {} bytes, more than {}", what, n, kMaxReasonBytes));
    const std::vector<uint8_t> b = bytes(n, what);
    return std::string(b.begin(), b.end());
  }
  void finish(const char* message) const {
    if (left() != 0) throw ProtocolError(fmt::format("{}: {} trailing bytes", message, left()));
  }

 private:
  size_t left() const { return bytes_.size() - at_; }
  void need(size_t n, const char* what) const {
    if (n > left()) throw ProtocolError(fmt::format("truncated {}: needs {} bytes, {} left", what, n, left()));
  }
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

class Writer {
 public:
  template <typename T>
  void put(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  void int32s(std::span<const int32_t> v) {
    put(uint32_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out_.insert(out_.end(), p, p + v.size() * 4);
  }
  void string(const std::string& s) {
    const size_t n = std::min<size_t>(s.size(), kMaxReasonBytes);
    put(uint32_t(n));
    out_.insert(out_.end(), s.begin(), s.begin() + ptrdiff_t(n));
  }
  // The whole frame: header, then what was put.
  std::vector<uint8_t> frame(MessageType type) const {
    const std::vector<uint8_t> header = encode_frame_header(type, out_.size());
    std::vector<uint8_t> f(kFrameHeaderBytes + out_.size());
    std::memcpy(f.data(), header.data(), kFrameHeaderBytes);
    if (!out_.empty()) std::memcpy(f.data() + kFrameHeaderBytes, out_.data(), out_.size());
    return f;
  }
  const std::vector<uint8_t>& bytes_put() const { return out_; }

 private:
  std::vector<uint8_t> out_;
};

void fixed(Reader& r, std::vector<uint8_t>& out, size_t n, const char* what) { out = r.bytes(n, what); }

KvFormat read_format(Reader& r) {
  KvFormat f;
  f.dtype = r.get<uint8_t>("KV dtype");
  f.layout = r.get<uint8_t>("KV layout");
  f.quant = r.get<uint8_t>("KV quantization");
  f.rotation = r.get<uint8_t>("KV rotation");
  f.partition = r.get<uint32_t>("KV partition");
  if (f.quant > 2 || f.rotation > 1) throw ProtocolError("KV format: unknown quantization or rotation");
  f.num_layers = r.get<int32_t>("layer count");
  f.block_size = r.get<int32_t>("block size");
  f.num_kv_heads = r.get<int32_t>("KV head count");
  f.head_dim = r.get<int32_t>("head dim");
  f.page_bytes = r.get<uint64_t>("page bytes");
  f.model_fingerprint = r.get<uint64_t>("model fingerprint");
  if (f.num_layers <= 0 || f.block_size <= 0 || f.num_kv_heads <= 0 || f.head_dim <= 0 || f.page_bytes == 0 ||
      f.page_bytes > (uint64_t(1) << 32))
    throw ProtocolError("KV format: a size is out of range");
  return f;
}

void write_format(Writer& w, const KvFormat& f) {
  w.put(f.dtype);
  w.put(f.layout);
  w.put(f.quant);
  w.put(f.rotation);
  w.put(f.partition);
  w.put(f.num_layers);
  w.put(f.block_size);
  w.put(f.num_kv_heads);
  w.put(f.head_dim);
  w.put(f.page_bytes);
  w.put(f.model_fingerprint);
}

}  // namespace

std::string describe(const KvFormat& f) {
  static constexpr const char* kQuant[] = {"none", "fp8", "int2"};
  return fmt::format("dtype {} layout {} quantization {} partition {} rotation {} layers {} block size {} KV heads {} "
                     "head dim {} page {} B model {:016x}",
                     f.dtype, f.layout, f.quant < 3 ? kQuant[f.quant] : "?", f.partition,
                     f.rotation ? "hadamard" : "none", f.num_layers, f.block_size, f.num_kv_heads, f.head_dim,
                     f.page_bytes, f.model_fingerprint);
}

FrameHeader parse_frame_header(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  const auto magic = r.get<uint32_t>("frame magic");
  if (magic != kMagic) throw ProtocolError(fmt::format("not a pagoda KV frame (magic {:08x})", magic));
  const auto version = r.get<uint16_t>("frame version");
  if (version != kProtocolVersion)
    throw ProtocolError(fmt::format("protocol version {}, this server speaks {}", version, kProtocolVersion));
  const auto type = r.get<uint16_t>("frame type");
  const auto payload = r.get<uint64_t>("frame length");
  r.finish("frame header");
  if (type < uint16_t(MessageType::kHello) || type > uint16_t(MessageType::kKvNccl))
    throw ProtocolError(fmt::format("unknown message type {}", type));
  if (MessageType(type) == MessageType::kKv) {
    if (payload < kKvHeaderBytes) throw ProtocolError("KV frame shorter than its header");
  } else if (payload > kMaxControlPayload) {
    throw ProtocolError(fmt::format("control frame of {} bytes, more than {}", payload, kMaxControlPayload));
  }
  return {MessageType(type), payload};
}

std::vector<uint8_t> encode_frame_header(MessageType type, uint64_t payload_bytes) {
  std::vector<uint8_t> out(kFrameHeaderBytes);
  const uint16_t version = kProtocolVersion, t = uint16_t(type);
  std::memcpy(out.data(), &kMagic, 4);
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &t, 2);
  std::memcpy(out.data() + 8, &payload_bytes, 8);
  return out;
}

Hello parse_hello(std::span<const uint8_t> payload) {
  Reader r(payload);
  Hello m;
  fixed(r, m.nonce, kNonceBytes, "hello nonce");
  r.finish("hello");
  return m;
}

Challenge parse_challenge(std::span<const uint8_t> payload) {
  Reader r(payload);
  Challenge m;
  fixed(r, m.nonce, kNonceBytes, "challenge nonce");
  fixed(r, m.mac, kMacBytes, "challenge proof");
  r.finish("challenge");
  return m;
}

Auth parse_auth(std::span<const uint8_t> payload) {
  Reader r(payload);
  Auth m;
  fixed(r, m.mac, kMacBytes, "auth proof");
  m.format = read_format(r);
  r.finish("auth");
  return m;
}

KvFormat parse_accept(std::span<const uint8_t> payload) {
  Reader r(payload);
  const KvFormat f = read_format(r);
  r.finish("accept");
  return f;
}

Refuse parse_refuse(std::span<const uint8_t> payload) {
  Reader r(payload);
  Refuse m{r.string("refusal reason")};
  r.finish("refuse");
  return m;
}

PrefillRequest parse_prefill(std::span<const uint8_t> payload) {
  Reader r(payload);
  PrefillRequest m;
  m.request_id = r.get<uint64_t>("request id");
  m.skip_blocks = r.get<int32_t>("skipped block count");
  m.tokens = r.int32s("prompt tokens");
  m.block_ids = r.int32s("block ids");
  WireSampling& s = m.sampling;
  s.temperature = r.get<float>("temperature");
  s.top_k = r.get<int32_t>("top_k");
  s.top_p = r.get<float>("top_p");
  s.min_p = r.get<float>("min_p");
  s.repetition_penalty = r.get<float>("repetition penalty");
  s.presence_penalty = r.get<float>("presence penalty");
  s.frequency_penalty = r.get<float>("frequency penalty");
  s.seed = r.get<uint64_t>("seed");
  r.finish("prefill request");
  if (m.tokens.empty()) throw ProtocolError("prefill request without prompt tokens");
  if (m.skip_blocks < 0 || size_t(m.skip_blocks) > m.block_ids.size())
    throw ProtocolError(fmt::format("prefill request skips {} of its {} blocks", m.skip_blocks, m.block_ids.size()));
  return m;
}

Cancel parse_cancel(std::span<const uint8_t> payload) {
  Reader r(payload);
  Cancel m{r.get<uint64_t>("request id")};
  r.finish("cancel");
  return m;
}

KvHeader parse_kv_header(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  KvHeader m;
  m.request_id = r.get<uint64_t>("request id");
  m.first_layer = r.get<int32_t>("first layer");
  m.num_layers = r.get<int32_t>("layer count");
  m.num_blocks = r.get<int32_t>("block count");
  r.finish("KV header");
  if (m.first_layer < 0 || m.num_layers <= 0 || m.num_blocks < 0)
    throw ProtocolError("KV header: a negative count or layer");
  return m;
}

PrefillDone parse_prefill_done(std::span<const uint8_t> payload) {
  Reader r(payload);
  PrefillDone m;
  m.request_id = r.get<uint64_t>("request id");
  m.first_token = r.get<int32_t>("first token");
  r.finish("prefill done");
  return m;
}

PrefillFailed parse_prefill_failed(std::span<const uint8_t> payload) {
  Reader r(payload);
  PrefillFailed m;
  m.request_id = r.get<uint64_t>("request id");
  m.reason = r.string("failure reason");
  r.finish("prefill failed");
  return m;
}

NcclId parse_nccl_id(std::span<const uint8_t> payload) {
  Reader r(payload);
  NcclId m;
  fixed(r, m.id, kNcclIdBytes, "NCCL unique id");
  r.finish("NCCL id");
  return m;
}

KvHeader parse_kv_nccl(std::span<const uint8_t> payload) {
  if (payload.size() != kKvHeaderBytes)
    throw ProtocolError(fmt::format("NCCL KV frame of {} bytes, not {}", payload.size(), kKvHeaderBytes));
  return parse_kv_header(payload);
}

std::vector<uint8_t> encode(const Hello& m) {
  Writer w;
  w.bytes(m.nonce);
  return w.frame(MessageType::kHello);
}

std::vector<uint8_t> encode(const Challenge& m) {
  Writer w;
  w.bytes(m.nonce);
  w.bytes(m.mac);
  return w.frame(MessageType::kChallenge);
}

std::vector<uint8_t> encode(const Auth& m) {
  Writer w;
  w.bytes(m.mac);
  write_format(w, m.format);
  return w.frame(MessageType::kAuth);
}

std::vector<uint8_t> encode_accept(const KvFormat& m) {
  Writer w;
  write_format(w, m);
  return w.frame(MessageType::kAccept);
}

std::vector<uint8_t> encode(const Refuse& m) {
  Writer w;
  w.string(m.reason);
  return w.frame(MessageType::kRefuse);
}

std::vector<uint8_t> encode(const PrefillRequest& m) {
  Writer w;
  w.put(m.request_id);
  w.put(m.skip_blocks);
  w.int32s(m.tokens);
  w.int32s(m.block_ids);
  const WireSampling& s = m.sampling;
  w.put(s.temperature);
  w.put(s.top_k);
  w.put(s.top_p);
  w.put(s.min_p);
  w.put(s.repetition_penalty);
  w.put(s.presence_penalty);
  w.put(s.frequency_penalty);
  w.put(s.seed);
  return w.frame(MessageType::kPrefill);
}

std::vector<uint8_t> encode(const Cancel& m) {
  Writer w;
  w.put(m.request_id);
  return w.frame(MessageType::kCancel);
}

uint64_t kv_pages_bytes(const KvHeader& m, uint64_t page_bytes, uint64_t tail_bytes) {
  return uint64_t(m.num_layers) * (uint64_t(m.num_blocks) * 2 * page_bytes + tail_bytes);
}

std::vector<uint8_t> encode_kv_prefix(const KvHeader& m, uint64_t page_bytes, uint64_t tail_bytes) {
  std::vector<uint8_t> out =
      encode_frame_header(MessageType::kKv, kKvHeaderBytes + kv_pages_bytes(m, page_bytes, tail_bytes));
  Writer w;
  w.put(m.request_id);
  w.put(m.first_layer);
  w.put(m.num_layers);
  w.put(m.num_blocks);
  const std::vector<uint8_t>& body = w.bytes_put();
  out.resize(kFrameHeaderBytes + body.size());
  std::memcpy(out.data() + kFrameHeaderBytes, body.data(), body.size());
  return out;
}

std::vector<uint8_t> encode(const PrefillDone& m) {
  Writer w;
  w.put(m.request_id);
  w.put(m.first_token);
  return w.frame(MessageType::kPrefillDone);
}

std::vector<uint8_t> encode(const PrefillFailed& m) {
  Writer w;
  w.put(m.request_id);
  w.string(m.reason);
  return w.frame(MessageType::kPrefillFailed);
}

std::vector<uint8_t> encode(const NcclId& m) {
  Writer w;
  w.bytes(m.id);
  return w.frame(MessageType::kNcclId);
}

std::vector<uint8_t> encode_kv_nccl(const KvHeader& m) {
  Writer w;
  w.put(m.request_id);
  w.put(m.first_layer);
  w.put(m.num_layers);
  w.put(m.num_blocks);
  return w.frame(MessageType::kKvNccl);
}

}  // namespace pagoda::disagg
