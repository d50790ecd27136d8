// Peer authentication: HMAC-SHA256 against RFC 4231's test vectors, and the handshake over a
// real socket pair: the same key and KV format connect; a wrong key or another KV format is
// refused at connect on both sides, with the reason.
#include "pagoda/disagg/peer_auth.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <future>

#include "pagoda/disagg/handshake.h"

namespace pagoda::disagg {
namespace {

std::string hex(const std::vector<uint8_t>& bytes) {
  std::string out;
  for (uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

TEST(PeerAuth, HmacSha256MatchesRfc4231) {
  // Test case 1: key 20 x 0x0b, "Hi There".
  EXPECT_EQ(hex(hmac_sha256(std::vector<uint8_t>(20, 0x0b), bytes_of("Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: key "Jefe".
  EXPECT_EQ(hex(hmac_sha256(bytes_of("Jefe"), bytes_of("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(PeerAuth, ProofsDependOnRoleNoncesAndKey) {
  const std::vector<uint8_t> a = make_nonce(), b = make_nonce();
  EXPECT_NE(a, b);
  const auto proof = prove("key-0123456789abcdef", "decode", a, b);
  EXPECT_TRUE(proofs_equal(proof, prove("key-0123456789abcdef", "decode", a, b)));
  EXPECT_FALSE(proofs_equal(proof, prove("key-0123456789abcdef", "prefill", a, b)));
  EXPECT_FALSE(proofs_equal(proof, prove("key-0123456789abcdef", "decode", b, a)));
  EXPECT_FALSE(proofs_equal(proof, prove("key-0123456789abcdeF", "decode", a, b)));
}

struct Pair {
  Socket decode, prefill;
};
Pair socket_pair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  return {Socket(fds[0]), Socket(fds[1])};
}

const KvFormat kFormat{.dtype = 0, .num_layers = 2, .block_size = 16, .num_kv_heads = 1, .head_dim = 8,
                       .page_bytes = 512, .model_fingerprint = 99};

// Runs both sides; returns (decode's error, prefill's error), empty where it connected.
std::pair<std::string, std::string> handshake(const std::string& decode_key, const std::string& prefill_key,
                                              const KvFormat& decode_format, const KvFormat& prefill_format) {
  Pair pair = socket_pair();
  auto prefill = std::async(std::launch::async, [&] {
    try {
      handshake_as_prefill(pair.prefill, prefill_key, prefill_format);
      return std::string();
    } catch (const std::exception& e) {
      pair.prefill.shutdown();  // as the server does: the link closes
      return std::string(e.what());
    }
  });
  std::string decode_error;
  try {
    handshake_as_decode(pair.decode, decode_key, decode_format);
  } catch (const std::exception& e) {
    decode_error = e.what();
    pair.decode.shutdown();
  }
  return {decode_error, prefill.get()};
}

TEST(Handshake, SameKeyAndFormatConnect) {
  const auto [d, p] = handshake("secret-key-0123456", "secret-key-0123456", kFormat, kFormat);
  EXPECT_EQ(d, "");
  EXPECT_EQ(p, "");
}

TEST(Handshake, WrongKeyIsRefusedByBothSides) {
  const auto [d, p] = handshake("secret-key-0123456", "another-key-012345", kFormat, kFormat);
  // The decode side checks the prefill server's proof first and refuses it.
  EXPECT_NE(d.find("does not hold the peer key"), std::string::npos) << d;
  EXPECT_NE(p.find("refused by the peer"), std::string::npos) << p;
}

TEST(Handshake, KvFormatMismatchIsRefusedAtConnect) {
  KvFormat other = kFormat;
  other.partition = 32;  // e.g. int2 KV with another partition size
  const auto [d, p] = handshake("secret-key-0123456", "secret-key-0123456", other, kFormat);
  EXPECT_NE(p.find("KV formats differ"), std::string::npos) << p;
  EXPECT_NE(d.find("KV formats differ"), std::string::npos) << d;
}

}  // namespace
}  // namespace pagoda::disagg
