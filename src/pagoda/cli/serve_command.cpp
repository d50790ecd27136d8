// pagoda serve: the OpenAI-compatible HTTP server (src/pagoda/server/) on one engine.
//
// Shutdown: the SIGINT and SIGTERM handlers only write the signal's number into a pipe; a thread
// of its own reads it and does the work outside signal context. (Blocking the signals and
// sigwait() would not do: OpenBLAS starts its threads before main, with the signals open.) The
// first signal drains: the server stops accepting, requests in flight finish, then the process
// exits 0. A second one exits at once.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/flags.h"
#include "pagoda/cli/serve_roles.h"
#include "pagoda/core/default_model.h"
#include "pagoda/core/error.h"
#include "pagoda/http/server.h"
#include "pagoda/model/tensor_parallel_model.h"
#include "pagoda/server/api.h"

namespace pagoda::cli {
namespace {

// What the signal thread drains; null while the model loads (a signal then just exits).
std::atomic<http::Server*> g_server{nullptr};
int g_signal_pipe[2] = {-1, -1};

// Async-signal-safe: all it does is tell the signal thread which signal came. The pipe's write
// end does not block, and errno is put back for the code the signal interrupted.
extern "C" void forward_signal(int signal) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

int next_signal() {
  unsigned char byte = 0;
  while (read(g_signal_pipe[0], &byte, 1) != 1) {}
  return byte;
}

void start_signal_thread() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0 || fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK) != 0)
    fail(ErrorKind::kInternal, "signal pipe: {}", std::strerror(errno));
  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a vanished client is an error code, not a death
  std::thread([] {
    int signal = next_signal();
    http::Server* server = g_server.load();
    if (!server) std::_Exit(128 + signal);
    std::fprintf(stderr, "pagoda serve: %s: finishing the requests in flight (again to quit now)\n",
                 strsignal(signal));
    server->shutdown();
    signal = next_signal();
    std::_Exit(128 + signal);
  }).detach();
}

// "SmolLM2-135M-Instruct.Q4_1" for .../SmolLM2-135M-Instruct.Q4_1.gguf, the folder's name for a
// Hugging Face folder.
std::string model_name_from_path(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

}  // namespace

void register_serve(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string api_key;
    std::string metrics_key;
    int max_queue = 256;
    int64_t max_body_bytes = 1 << 20;
    int max_connections = 512;
    std::string served_model_name;
    std::string chat_template;
    RoleFlags role;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
  add_model_flags(*cmd, flags->model);
  cmd->add_option("--host", flags->host, "address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", flags->port, "port (default 8000; 0: any free port)");
  cmd->add_option("--api-key", flags->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--metrics-key", flags->metrics_key,
                  "require 'Authorization: Bearer KEY' on /metrics (default: open, counters only)");
  cmd->add_option("--max-queue", flags->max_queue, "requests that may wait for a batch slot; more get 429 (default 256)");
  cmd->add_option("--max-body-bytes", flags->max_body_bytes, "largest request body; larger get 413 (default 1 MiB)");
  cmd->add_option("--max-connections", flags->max_connections, "open connections; past them the longest-idle one is closed, or 503 if none is idle (default 512)");
  cmd->add_option("--served-model-name", flags->served_model_name, "the model's id in the API (default: its file name)");
  cmd->add_option("--chat-template", flags->chat_template, "chatml, llama3 or llama2 (default: from the model)");
  add_role_flags(*cmd, flags->role);
  cmd->callback([flags] {
    if (flags->port < 0 || flags->port > 65535) fail(ErrorKind::kInvalidArgument, "--port must be in [0, 65535]");
    if (flags->max_queue < 1 || flags->max_queue > 1'000'000)
      fail(ErrorKind::kInvalidArgument, "--max-queue must be in [1, 1000000]");
    if (flags->max_body_bytes < 1024 || flags->max_body_bytes > (int64_t(1) << 30))
      fail(ErrorKind::kInvalidArgument, "--max-body-bytes must be in [1024, 1073741824]");
    if (flags->max_connections < 1 || flags->max_connections > 65536)
      fail(ErrorKind::kInvalidArgument, "--max-connections must be in [1, 65536]");
    if (!flags->chat_template.empty()) chat_template_by_name(flags->chat_template);  // fail before loading
    check_role_flags(flags->role);

    start_signal_thread();
    Session session(flags->model);
    if (const auto* split = dynamic_cast<const TensorParallelModel*>(session.model.get()))
      std::fprintf(stderr, "pagoda serve: tensor parallel: %s\n", split->describe().c_str());
    const ChatTemplate chat_template = choose_chat_template(flags->chat_template, session.tokenizer);
    Engine engine(*session.model, session.tokenizer, session.engine_options);
    const std::string model_id = !flags->served_model_name.empty() ? flags->served_model_name
                                 : model_name_from_path(flags->model.path.empty() ? default_model_path() : flags->model.path);
    const server::ModelContext model{.tokenizer = session.tokenizer,
                                     .chat_template = chat_template,
                                     .model_id = model_id,
                                     .max_context = session.model->config().max_context};
    server::Metrics metrics;
    ServeRole role(flags->role, *session.model, metrics);
    server::EngineService service(engine, metrics, flags->max_queue, role.hook());
    role.start(service);
    // The peer links' threads wake the engine service: they end before it does, however this
    // scope is left.
    struct StopRoleFirst {
      ServeRole& role;
      ~StopRoleFirst() { role.stop(); }
    } stop_role_first{role};
    server::Api api(model, service, metrics, {.api_key = flags->api_key, .metrics_key = flags->metrics_key});

    http::ServerOptions options{.host = flags->host,
                                .port = flags->port,
                                .max_connections = flags->max_connections,
                                .error_response = server::api_error_response};
    options.limits.max_body_bytes = size_t(flags->max_body_bytes);
    http::Server server(options, [&api](const http::Request& request, http::Exchange& exchange) {
      api.handle(request, exchange);
    });
    g_server.store(&server);
    if (flags->api_key.empty() && flags->host != "127.0.0.1" && flags->host != "localhost" && flags->host != "::1")
      std::fprintf(stderr, "pagoda serve: warning: listening on %s without --api-key: anyone who can reach it can use it\n",
                   flags->host.c_str());
    std::fprintf(stderr, "pagoda serve: model %s, %d KV blocks of %d tokens, batch %d, context %d tokens\n",
                 model_id.c_str(), engine.num_kv_blocks(), session.engine_options.block_size,
                 session.engine_options.max_batch, model.max_context);
    std::fprintf(stderr, "pagoda serve: listening on http://%s:%d\n", flags->host.c_str(), server.port());
    server.run();
    g_server.store(nullptr);
    role.stop();
    service.stop();
    std::fprintf(stderr, "pagoda serve: stopped\n");
  });
}

}  // namespace pagoda::cli
