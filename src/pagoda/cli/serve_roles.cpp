#include "pagoda/cli/serve_roles.h"

#include <cstdio>
#include <cstdlib>

#include "pagoda/core/error.h"
#include "pagoda/disagg/socket.h"

namespace pagoda::cli {

void add_role_flags(CLI::App& app, RoleFlags& flags) {
  app.add_option("--role", flags.role,
                 "both (default: prefill and decode here), prefill (compute prompts for decode servers) or "
                 "decode (the API; prompts go to --prefill servers)");
  app.add_option("--prefill", flags.prefill, "decode role: a prefill server's HOST:PORT (repeat for several)");
  app.add_option("--peer-host", flags.peer_host, "prefill role: address decode servers connect to (default 127.0.0.1)");
  app.add_option("--peer-port", flags.peer_port, "prefill role: port decode servers connect to (default 8100; 0: any)");
  app.add_option("--peer-key", flags.peer_key,
                 "prefill and decode roles: the secret both sides prove they hold (default: $PAGODA_PEER_KEY)");
  app.add_option("--prefill-timeout", flags.prefill_timeout_s,
                 "decode role: seconds a prefill server has for a request before it counts as stalled (default 60)");
}

void check_role_flags(RoleFlags& flags) {
  if (flags.role != "both" && flags.role != "prefill" && flags.role != "decode")
    fail(ErrorKind::kInvalidArgument, "--role must be both, prefill or decode");
  if (flags.role != "decode" && !flags.prefill.empty())
    fail(ErrorKind::kInvalidArgument, "--prefill needs --role decode");
  if (flags.role == "decode" && flags.prefill.empty())
    fail(ErrorKind::kInvalidArgument, "--role decode needs at least one --prefill HOST:PORT");
  for (const std::string& address : flags.prefill) disagg::parse_host_port(address);
  if (flags.peer_port < 0 || flags.peer_port > 65535) fail(ErrorKind::kInvalidArgument, "--peer-port must be in [0, 65535]");
  if (!(flags.prefill_timeout_s >= 0.1 && flags.prefill_timeout_s <= 86400))
    fail(ErrorKind::kInvalidArgument, "--prefill-timeout must be in [0.1, 86400] seconds");
  if (flags.role == "both") return;
  if (flags.peer_key.empty())
    if (const char* key = std::getenv("PAGODA_PEER_KEY")) flags.peer_key = key;
  if (flags.peer_key.size() < 16)
    fail(ErrorKind::kInvalidArgument, "--role {} needs --peer-key (or $PAGODA_PEER_KEY) of at least 16 characters",
         flags.role);
}

ServeRole::ServeRole(const RoleFlags& flags, StepModel& step_model, server::Metrics& metrics) {
  if (flags.role == "both") return;
  auto* single = dynamic_cast<Model*>(&step_model);  // KV pages move between single-rank caches only
  if (!single) fail(ErrorKind::kInvalidArgument, "--role {} needs --tensor-parallel 1", flags.role);
  Model& model = *single;
  metrics_ = std::make_unique<disagg::TransferMetrics>(flags.role);
  metrics.add_section([m = metrics_.get()](std::string& out) { m->render(out); });
  if (flags.role == "prefill") {
    prefill_ = std::make_unique<disagg::PrefillServer>(
        model, disagg::PrefillServerOptions{.host = flags.peer_host, .port = flags.peer_port, .key = flags.peer_key},
        *metrics_);
    std::fprintf(stderr, "pagoda serve: prefill role: decode servers connect to %s:%d\n", flags.peer_host.c_str(),
                 prefill_->port());
  } else {
    decode_ = std::make_unique<disagg::RemotePrefill>(
        model,
        disagg::RemotePrefillOptions{
            .prefill_addresses = flags.prefill,
            .key = flags.peer_key,
            .timeout = std::chrono::milliseconds(int64_t(flags.prefill_timeout_s * 1000))},
        *metrics_);
    std::fprintf(stderr, "pagoda serve: decode role: %zu prefill server(s)\n", flags.prefill.size());
  }
}

ServeRole::~ServeRole() { stop(); }

server::EngineHook* ServeRole::hook() {
  if (prefill_) return prefill_.get();
  return decode_.get();
}

void ServeRole::start(server::EngineService& service) {
  if (prefill_) prefill_->start(service);
  if (decode_) decode_->start(service);
}

void ServeRole::stop() {
  if (prefill_) prefill_->stop();
  if (decode_) decode_->stop();
}

}  // namespace pagoda::cli
