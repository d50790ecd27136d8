// libFuzzer target for the peer message parser of disaggregated serving (disagg/wire.h). The
// input is a frame header followed by a payload; the header is parsed, then the payload as the
// message the header names (and as every other message type, since a hostile peer picks the
// type). A parser must either throw ProtocolError or return a message that encodes back to the
// same payload; a crash, a sanitizer report, another exception or a mismatch is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/disagg/wire.h"

namespace {

using namespace pagoda::disagg;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// The encoded frame's payload (the header stripped) equals what was parsed.
void same(const std::vector<uint8_t>& frame, std::span<const uint8_t> payload) {
  check(frame.size() == kFrameHeaderBytes + payload.size());
  check(std::equal(payload.begin(), payload.end(), frame.begin() + kFrameHeaderBytes));
}

template <typename Parse, typename Encode>
void round_trip(std::span<const uint8_t> payload, Parse parse, Encode encode_fn) {
  try {
    same(encode_fn(parse(payload)), payload);
  } catch (const ProtocolError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  if (size >= kFrameHeaderBytes) {
    try {
      const FrameHeader header = parse_frame_header(bytes.first(kFrameHeaderBytes));
      check(header.payload_bytes <= kMaxControlPayload || header.type == MessageType::kKv);
      same(encode_frame_header(header.type, header.payload_bytes), {});
    } catch (const ProtocolError&) {
    }
  }
  const std::span<const uint8_t> payload = size >= kFrameHeaderBytes ? bytes.subspan(kFrameHeaderBytes) : bytes;
  round_trip(payload, parse_hello, [](const Hello& m) { return encode(m); });
  round_trip(payload, parse_challenge, [](const Challenge& m) { return encode(m); });
  round_trip(payload, parse_auth, [](const Auth& m) { return encode(m); });
  round_trip(payload, parse_accept, [](const KvFormat& m) { return encode_accept(m); });
  round_trip(payload, parse_refuse, [](const Refuse& m) { return encode(m); });
  round_trip(payload, parse_prefill, [](const PrefillRequest& m) { return encode(m); });
  round_trip(payload, parse_cancel, [](const Cancel& m) { return encode(m); });
  round_trip(payload, parse_prefill_done, [](const PrefillDone& m) { return encode(m); });
  round_trip(payload, parse_prefill_failed, [](const PrefillFailed& m) { return encode(m); });
  round_trip(payload, parse_nccl_id, [](const NcclId& m) { return encode(m); });
  round_trip(payload, parse_kv_nccl, [](const KvHeader& m) { return encode_kv_nccl(m); });
  if (payload.size() >= kKvHeaderBytes) {
    try {
      const KvHeader h = parse_kv_header(payload.first(kKvHeaderBytes));
      check(h.num_layers > 0 && h.num_blocks >= 0 && h.first_layer >= 0);
    } catch (const ProtocolError&) {
    }
  }
  return 0;
}
