// Head configurations as the GPU benchmarks take them: "q_heads/kv_heads", e.g. 32/8.
#pragma once

#include <cstdint>
#include <string>

namespace pagoda::bench {

struct HeadSpec {
  int32_t q_heads;
  int32_t kv_heads;
};

// Throws Error(kInvalidArgument) for anything but two positive numbers whose second divides the first.
HeadSpec parse_heads(const std::string& spec);

}  // namespace pagoda::bench
