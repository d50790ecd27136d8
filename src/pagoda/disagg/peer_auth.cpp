#include "pagoda/disagg/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "pagoda/core/error.h"
#include "pagoda/disagg/wire.h"

namespace pagoda::disagg {

std::vector<uint8_t> make_nonce() {
  std::vector<uint8_t> nonce(kNonceBytes);
  if (RAND_bytes(nonce.data(), int(nonce.size())) != 1) fail(ErrorKind::kInternal, "no random bytes for a nonce");
  return nonce;
}

std::vector<uint8_t> hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), key.data(), int(key.size()), message.data(), message.size(), mac.data(), &length))
    fail(ErrorKind::kInternal, "HMAC-SHA256 failed");
  mac.resize(length);
  return mac;
}

std::vector<uint8_t> prove(const std::string& key, const char* role, std::span<const uint8_t> decode_nonce,
                           std::span<const uint8_t> prefill_nonce) {
  std::vector<uint8_t> message(role, role + std::strlen(role));
  message.push_back(0);
  message.insert(message.end(), decode_nonce.begin(), decode_nonce.end());
  message.insert(message.end(), prefill_nonce.begin(), prefill_nonce.end());
  return hmac_sha256(std::span(reinterpret_cast<const uint8_t*>(key.data()), key.size()), message);
}

bool proofs_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace pagoda::disagg
