#include "pagoda/disagg/handshake.h"

#include <fmt/format.h>

#include "pagoda/core/error.h"
#include "pagoda/core/fnv1a.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/disagg/peer_auth.h"

namespace pagoda::disagg {
namespace {

std::vector<uint8_t> read_frame(Socket& socket, MessageType expected, Deadline deadline) {
  std::vector<uint8_t> header_bytes(kFrameHeaderBytes);
  socket.recv_exact(header_bytes, deadline);
  const FrameHeader header = parse_frame_header(header_bytes);
  std::vector<uint8_t> payload(header.type == MessageType::kKv ? 0 : header.payload_bytes);
  if (header.type == MessageType::kKv) throw ProtocolError("KV pages during the handshake");
  socket.recv_exact(payload, deadline);
  if (header.type == MessageType::kRefuse) throw ProtocolError("refused by the peer: " + parse_refuse(payload).reason);
  if (header.type != expected)
    throw ProtocolError(fmt::format("message type {} during the handshake, expected {}", int(header.type), int(expected)));
  return payload;
}

// Tells the peer why, as far as the connection still works, then throws the same reason.
[[noreturn]] void refuse(Socket& socket, const std::string& reason, Deadline deadline) {
  try {
    socket.send_all(encode(Refuse{reason}), deadline);
  } catch (const PeerLost&) {
  }
  throw ProtocolError(reason);
}

}  // namespace

KvFormat local_kv_format(Model& model) {
  // Pages carry the codes, their metadata and the V tail; fp8 keys and sink tokens live elsewhere.
  if (model.kv_quant() == KvQuant::kInt2 && (model.kv_key_quant() != KvQuant::kInt2 || model.kv_sink_tokens() != 0))
    fail(ErrorKind::kUnsupported,
         "int2 KV with fp8 keys or sink tokens does not travel between servers; give both roles --kv-key-dtype int2 "
         "--kv-sink-tokens 0");
  const ModelConfig& c = model.config();
  const int64_t shape[] = {c.vocab_size, c.hidden_size, c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim,
                           c.intermediate_size};
  return {.dtype = uint8_t(model.kv_dtype()),
          .layout = uint8_t(KvLayout::kHnd),
          .quant = uint8_t(model.kv_quant()),
          .rotation = uint8_t(model.kv_hadamard()),
          .partition = model.kv_quant() == KvQuant::kInt2 ? uint32_t(model.kv_partition()) : 0,
          .num_layers = c.num_layers,
          .block_size = model.kv_block_size(),
          .num_kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .page_bytes = model.backend().kv_page_bytes(),
          .model_fingerprint = fnv1a(shape, sizeof shape)};
}

void handshake_as_decode(Socket& socket, const std::string& key, const KvFormat& local) {
  const Deadline deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
  const Hello hello{make_nonce()};
  socket.send_all(encode(hello), deadline);
  const Challenge challenge = parse_challenge(read_frame(socket, MessageType::kChallenge, deadline));
  if (!proofs_equal(challenge.mac, prove(key, "prefill", hello.nonce, challenge.nonce)))
    refuse(socket, "the prefill server does not hold the peer key", deadline);
  socket.send_all(encode(Auth{prove(key, "decode", hello.nonce, challenge.nonce), local}), deadline);
  const KvFormat remote = parse_accept(read_frame(socket, MessageType::kAccept, deadline));
  if (remote != local)
    refuse(socket, fmt::format("KV formats differ: prefill {}, decode {}", describe(remote), describe(local)), deadline);
}

void handshake_as_prefill(Socket& socket, const std::string& key, const KvFormat& local) {
  const Deadline deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
  const Hello hello = parse_hello(read_frame(socket, MessageType::kHello, deadline));
  const Challenge challenge{make_nonce(), {}};
  const Challenge sent{challenge.nonce, prove(key, "prefill", hello.nonce, challenge.nonce)};
  socket.send_all(encode(sent), deadline);
  const Auth auth = parse_auth(read_frame(socket, MessageType::kAuth, deadline));
  if (!proofs_equal(auth.mac, prove(key, "decode", hello.nonce, challenge.nonce)))
    refuse(socket, "wrong peer key", deadline);
  if (auth.format != local)
    refuse(socket, fmt::format("KV formats differ: decode {}, prefill {}", describe(auth.format), describe(local)), deadline);
  socket.send_all(encode_accept(local), deadline);
}

}  // namespace pagoda::disagg
