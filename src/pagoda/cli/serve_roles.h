// `pagoda serve --role prefill|decode|both`: the flags of disaggregated serving and what each
// role adds to the server (docs/disaggregation.md). --role both (the default) is the colocated
// server and adds nothing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "pagoda/disagg/prefill_server.h"
#include "pagoda/disagg/remote_prefill.h"

namespace pagoda::cli {

struct RoleFlags {
  std::string role = "both";
  std::vector<std::string> prefill;  // decode: the prefill servers
  std::string peer_host = "127.0.0.1";
  int peer_port = 8100;
  std::string peer_key;  // or $PAGODA_PEER_KEY
  double prefill_timeout_s = 60;
};

void add_role_flags(CLI::App& app, RoleFlags& flags);
// Throws Error(kInvalidArgument) for flags that do not fit together; before the model loads.
void check_role_flags(RoleFlags& flags);

// The role's part of a running server: its engine hook, metrics and peer links.
class ServeRole {
 public:
  // Null hook for --role both. Listens (prefill) before returning.
  ServeRole(const RoleFlags& flags, StepModel& model, server::Metrics& metrics);
  ~ServeRole();  // stop()
  server::EngineHook* hook();
  // Starts the peer links once the engine service runs.
  void start(server::EngineService& service);
  // Ends every peer link; before the engine service goes.
  void stop();

 private:
  std::unique_ptr<disagg::TransferMetrics> metrics_;
  std::unique_ptr<disagg::PrefillServer> prefill_;
  std::unique_ptr<disagg::RemotePrefill> decode_;
};

}  // namespace pagoda::cli
