// Peer authentication by a shared secret (--peer-key): a challenge-response in which each side
// proves it holds the key without sending it (HMAC-SHA256, RFC 2104, over both sides' fresh
// nonces and the prover's role, so a proof can neither be replayed nor reflected back).
//
//   decode -> prefill  Hello     nonce_d
//   prefill -> decode  Challenge nonce_p, HMAC(key, "prefill" | nonce_d | nonce_p)
//   decode -> prefill  Auth      HMAC(key, "decode" | nonce_d | nonce_p), KV format
//   prefill -> decode  Accept (KV format) or Refuse (reason)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pagoda::disagg {

// kNonceBytes from the operating system's CSPRNG.
std::vector<uint8_t> make_nonce();

// The proof that the holder of `key` playing `role` ("prefill" or "decode") saw both nonces.
std::vector<uint8_t> prove(const std::string& key, const char* role, std::span<const uint8_t> decode_nonce,
                           std::span<const uint8_t> prefill_nonce);

// Compares in constant time (the time taken says nothing about where the bytes differ).
bool proofs_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

// HMAC-SHA256(key, message).
std::vector<uint8_t> hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message);

}  // namespace pagoda::disagg
