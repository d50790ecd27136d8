// The start of every peer link: both sides prove the shared key (peer_auth.h) and agree on the
// KV format (dtype, quantization partition, layout, shapes, model). A mismatch is refused here,
// at connect, never discovered later as garbage KV. Both functions throw PeerLost or
// ProtocolError with the reason the link was refused.
#pragma once

#include <chrono>
#include <string>

#include "pagoda/disagg/socket.h"
#include "pagoda/disagg/wire.h"
#include "pagoda/model/model.h"

namespace pagoda::disagg {

inline constexpr std::chrono::seconds kHandshakeTimeout{5};

// The KV format of the model's pool (allocated: the engine exists).
KvFormat local_kv_format(Model& model);

void handshake_as_decode(Socket& socket, const std::string& key, const KvFormat& local);
void handshake_as_prefill(Socket& socket, const std::string& key, const KvFormat& local);

}  // namespace pagoda::disagg
