// The peer messages: every message survives encode and parse unchanged, and bytes that are not
// a valid message (wrong magic or version, unknown type, lying counts, truncation, trailing
// bytes, oversized control frames) are refused with ProtocolError before anything is allocated.
#include "pagoda/disagg/wire.h"

#include <gtest/gtest.h>

#include <cstring>

namespace pagoda::disagg {
namespace {

std::span<const uint8_t> payload_of(const std::vector<uint8_t>& frame) {
  return std::span(frame).subspan(kFrameHeaderBytes);
}

TEST(Wire, FrameHeaderRoundTripsAndNamesThePayload) {
  const std::vector<uint8_t> frame = encode(Cancel{42});
  ASSERT_EQ(frame.size(), kFrameHeaderBytes + 8);
  const FrameHeader h = parse_frame_header(std::span(frame).first(kFrameHeaderBytes));
  EXPECT_EQ(h.type, MessageType::kCancel);
  EXPECT_EQ(h.payload_bytes, 8u);
  // Hand-checked layout: "PGKV", version 2, type 7, length 8, little-endian.
  const uint8_t expected[16] = {'P', 'G', 'K', 'V', 2, 0, 7, 0, 8, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(0, std::memcmp(frame.data(), expected, 16));
  EXPECT_EQ(parse_cancel(payload_of(frame)).request_id, 42u);
}

TEST(Wire, HeaderRefusesWrongMagicVersionTypeAndSize) {
  std::vector<uint8_t> h = encode_frame_header(MessageType::kPrefill, 10);
  std::vector<uint8_t> bad = h;
  bad[0] = 'X';
  EXPECT_THROW(parse_frame_header(bad), ProtocolError);
  bad = h;
  bad[4] = 1;  // version 1: pages in one frame, no int2 tails
  try {
    parse_frame_header(bad);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("version 1"), std::string::npos) << e.what();
  }
  bad = h;
  bad[6] = 99;  // type
  EXPECT_THROW(parse_frame_header(bad), ProtocolError);
  EXPECT_THROW(parse_frame_header(encode_frame_header(MessageType::kPrefill, kMaxControlPayload + 1)), ProtocolError);
  EXPECT_THROW(parse_frame_header(encode_frame_header(MessageType::kKv, kKvHeaderBytes - 1)), ProtocolError);
  EXPECT_NO_THROW(parse_frame_header(encode_frame_header(MessageType::kKv, uint64_t(1) << 40)));  // bounded by the receiver
  EXPECT_THROW(parse_frame_header(std::span(h).first(15)), ProtocolError);
}

TEST(Wire, PrefillRequestRoundTrips) {
  PrefillRequest m{.request_id = 7,
                   .tokens = {1, 2, 3, 4, 5},
                   .block_ids = {9, 4},
                   .skip_blocks = 1,
                   .sampling = {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f, .seed = 1234}};
  const PrefillRequest back = parse_prefill(payload_of(encode(m)));
  EXPECT_EQ(back.request_id, 7u);
  EXPECT_EQ(back.tokens, m.tokens);
  EXPECT_EQ(back.block_ids, m.block_ids);
  EXPECT_EQ(back.skip_blocks, 1);
  EXPECT_EQ(back.sampling.temperature, 0.7f);
  EXPECT_EQ(back.sampling.top_k, 40);
  EXPECT_EQ(back.sampling.seed, 1234u);
}

TEST(Wire, PrefillRequestRefusesLiesAndTruncation) {
  const std::vector<uint8_t> frame = encode(PrefillRequest{.request_id = 1, .tokens = {1, 2}, .block_ids = {0}});
  const std::vector<uint8_t> payload(frame.begin() + kFrameHeaderBytes, frame.end());
  for (size_t cut = 0; cut < payload.size(); ++cut)
    EXPECT_THROW(parse_prefill(std::span(payload).first(cut)), ProtocolError) << "cut at " << cut;
  std::vector<uint8_t> trailing = payload;
  trailing.push_back(0);
  EXPECT_THROW(parse_prefill(trailing), ProtocolError);
  std::vector<uint8_t> lying = payload;
  const uint32_t huge = 0x40000000;  // a billion tokens in a 50-byte payload
  std::memcpy(lying.data() + 12, &huge, 4);
  EXPECT_THROW(parse_prefill(lying), ProtocolError);
  EXPECT_THROW(parse_prefill(payload_of(encode(PrefillRequest{.request_id = 1, .block_ids = {0}}))), ProtocolError);
  EXPECT_THROW(parse_prefill(payload_of(encode(PrefillRequest{.request_id = 1, .tokens = {1}, .block_ids = {0},
                                                              .skip_blocks = 2}))),
               ProtocolError);
}

TEST(Wire, AuthCarriesTheKvFormat) {
  const KvFormat f{.dtype = 2, .layout = 0, .quant = 2, .rotation = 1, .partition = 64, .num_layers = 30,
                   .block_size = 64, .num_kv_heads = 3, .head_dim = 64, .page_bytes = 4032, .model_fingerprint = 0x1234};
  const Auth back = parse_auth(payload_of(encode(Auth{std::vector<uint8_t>(kMacBytes, 7), f})));
  EXPECT_EQ(back.format, f);
  EXPECT_EQ(back.mac, std::vector<uint8_t>(kMacBytes, 7));
  EXPECT_EQ(parse_accept(payload_of(encode_accept(f))), f);
  KvFormat zero_layers = f;
  zero_layers.num_layers = 0;
  EXPECT_THROW(parse_accept(payload_of(encode_accept(zero_layers))), ProtocolError);
  KvFormat unknown_quant = f;
  unknown_quant.quant = 3;
  EXPECT_THROW(parse_accept(payload_of(encode_accept(unknown_quant))), ProtocolError);
  // The quantization and rotation bytes sit right after dtype and layout.
  const std::vector<uint8_t> accept = encode_accept(f);
  const std::span<const uint8_t> payload = payload_of(accept);
  EXPECT_EQ(payload[2], 2);
  EXPECT_EQ(payload[3], 1);
}

TEST(Wire, KvHeaderAndPageBytes) {
  const KvHeader h{.request_id = 3, .first_layer = 0, .num_layers = 30, .num_blocks = 2};
  const std::vector<uint8_t> prefix = encode_kv_prefix(h, 1000, 0);
  ASSERT_EQ(prefix.size(), kFrameHeaderBytes + kKvHeaderBytes);
  const FrameHeader frame = parse_frame_header(std::span(prefix).first(kFrameHeaderBytes));
  EXPECT_EQ(frame.type, MessageType::kKv);
  EXPECT_EQ(frame.payload_bytes, kKvHeaderBytes + 30u * 2 * 2 * 1000);  // layers x blocks x (K, V) x page
  // An int2 tail: once per layer, after the layer's pages.
  EXPECT_EQ(kv_pages_bytes(h, 1000, 384), 30u * (2 * 2 * 1000 + 384));
  const KvHeader back = parse_kv_header(std::span(prefix).subspan(kFrameHeaderBytes));
  EXPECT_EQ(back.request_id, 3u);
  EXPECT_EQ(back.num_blocks, 2);
  KvHeader negative = h;
  negative.num_blocks = -1;
  const std::vector<uint8_t> lying = encode_kv_prefix(negative, 1, 0);
  EXPECT_THROW(parse_kv_header(std::span(lying).subspan(kFrameHeaderBytes)), ProtocolError);
}

TEST(Wire, NcclMessagesRoundTripAndRefuseOtherSizes) {
  NcclId id{std::vector<uint8_t>(kNcclIdBytes)};
  for (size_t i = 0; i < kNcclIdBytes; ++i) id.id[i] = uint8_t(i * 3);
  const std::vector<uint8_t> frame = encode(id);
  EXPECT_EQ(parse_frame_header(std::span(frame).first(kFrameHeaderBytes)).type, MessageType::kNcclId);
  EXPECT_EQ(parse_nccl_id(payload_of(frame)).id, id.id);
  EXPECT_THROW(parse_nccl_id(payload_of(frame).first(kNcclIdBytes - 1)), ProtocolError);
  const std::vector<uint8_t> kv = encode_kv_nccl({.request_id = 4, .first_layer = 2, .num_layers = 1, .num_blocks = 3});
  EXPECT_EQ(parse_frame_header(std::span(kv).first(kFrameHeaderBytes)).type, MessageType::kKvNccl);
  const KvHeader back = parse_kv_nccl(payload_of(kv));
  EXPECT_EQ(back.request_id, 4u);
  EXPECT_EQ(back.first_layer, 2);
  EXPECT_EQ(back.num_blocks, 3);
  std::vector<uint8_t> longer(payload_of(kv).begin(), payload_of(kv).end());
  longer.push_back(0);  // pages never follow on the link
  EXPECT_THROW(parse_kv_nccl(longer), ProtocolError);
}

TEST(Wire, StringsAreBounded) {
  const PrefillFailed back = parse_prefill_failed(payload_of(encode(PrefillFailed{5, "no blocks"})));
  EXPECT_EQ(back.reason, "no blocks");
  std::vector<uint8_t> payload(8 + 4, 0);
  const uint32_t long_string = uint32_t(kMaxReasonBytes + 1);
  std::memcpy(payload.data() + 8, &long_string, 4);
  payload.resize(payload.size() + kMaxReasonBytes + 1, 'a');
  EXPECT_THROW(parse_prefill_failed(payload), ProtocolError);
  EXPECT_EQ(parse_refuse(payload_of(encode(Refuse{"wrong key"}))).reason, "wrong key");
}

}  // namespace
}  // namespace pagoda::disagg
