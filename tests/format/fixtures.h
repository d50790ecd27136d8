// Helpers shared by the format tests: where fixtures live, reading a file, finding the model.
#pragma once

#include <cstdint>
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

}  // namespace pagoda::testing
