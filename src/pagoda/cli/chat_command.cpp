// pagoda chat: a conversation with the model's chat template applied. Interactive by default
// (one line per user turn; /reset clears the history, /exit or end of input quits); --once TEXT
// answers a single message and exits (what `make run` does).
#include <cstdio>
#include <iostream>
#include <unistd.h>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/generation.h"
#include "pagoda/cli/flags.h"
#include "pagoda/core/error.h"

namespace pagoda::cli {

void register_chat(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    SamplingParams sampling{.max_tokens = 512};
    std::string chat_template;
    std::string system;
    std::string once;
    bool show_speed = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("chat", "talk with the model (its chat template applied)");
  add_model_flags(*cmd, flags->model);
  add_sampling_flags(*cmd, flags->sampling);
  cmd->add_option("--chat-template", flags->chat_template, "chatml, llama3 or llama2 (default: from the model)");
  cmd->add_option("--system", flags->system, "system prompt");
  cmd->add_option("--once", flags->once, "answer this one message and exit");
  cmd->add_flag("--speed", flags->show_speed, "print prefill and decode speed after each answer");
  cmd->callback([flags] {
    validate(flags->sampling);
    if (!flags->chat_template.empty()) chat_template_by_name(flags->chat_template);  // fail before loading
    Session session(flags->model);
    const ChatTemplate chat_template = choose_chat_template(flags->chat_template, session.tokenizer);
    Engine engine(*session.model, session.tokenizer, session.engine_options);

    std::vector<ChatMessage> history;
    if (!flags->system.empty()) history.push_back({"system", flags->system});
    auto answer = [&](const std::string& user_text, bool show_speed) {
      history.push_back({"user", user_text});
      const std::string prompt = apply_chat_template(chat_template, history, true);
      Request request{.prompt = session.tokenizer.encode(prompt, session.tokenizer.add_bos_by_default()),
                      .params = flags->sampling};
      const GenerationResult result = run_request(engine, std::move(request), [](const std::string& text) {
        std::fputs(text.c_str(), stdout);
        std::fflush(stdout);
      });
      std::fputc('\n', stdout);
      if (show_speed) print_speed(result);
      history.push_back({"assistant", result.text});
    };

    if (!flags->once.empty()) {
      std::printf("> %s\n", flags->once.c_str());
      answer(flags->once, true);
      return;
    }
    const bool interactive = ::isatty(STDIN_FILENO);
    if (interactive) std::fprintf(stderr, "pagoda chat: type a message; /reset clears the history, /exit quits\n");
    std::string line;
    while (true) {
      if (interactive) std::fputs("> ", stdout), std::fflush(stdout);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line == "/reset") {
        history.erase(history.begin() + (flags->system.empty() ? 0 : 1), history.end());
        continue;
      }
      if (line.empty()) continue;
      try {
        answer(line, flags->show_speed);
      } catch (const Error& e) {
        // A conversation grown past the context: say so and keep the session.
        if (e.kind() != ErrorKind::kInvalidArgument) throw;
        history.pop_back();
        std::fprintf(stderr, "pagoda: %s (/reset starts over)\n", e.what());
      }
    }
  });
}

}  // namespace pagoda::cli
