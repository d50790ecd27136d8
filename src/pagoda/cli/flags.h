// The flags every subcommand that runs a model shares: those that choose and load it (the values
// of engine/session.h's ModelFlags), the sampling flags, and the chat template.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "pagoda/engine/sampling_params.h"
#include "pagoda/engine/session.h"
#include "pagoda/tokenizer/chat_template.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {

void add_model_flags(CLI::App& app, ModelFlags& flags);
// Sampling flags with llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05);
// -n binds to params.max_tokens, whose current value is the command's default.
void add_sampling_flags(CLI::App& app, SamplingParams& params);

// The chat format named by --chat-template, else the one the model's template implements; throws
// Error(kUnsupported) when the model's template is not one pagoda recognises.
ChatTemplate choose_chat_template(const std::string& name, const Tokenizer& tokenizer);

}  // namespace pagoda::cli
