// libFuzzer target: GGUF parsing, then one block of every tensor dequantized. Any exception
// other than pagoda::Error, and any crash or sanitizer report, is a bug.
#include "pagoda/format/gguf.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/format/dequantize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const pagoda::GgufFile file = pagoda::GgufFile::parse({data, size}, "fuzz.gguf");
    std::vector<float> out(256);  // the largest block size pagoda dequantizes
    for (const pagoda::GgufTensorInfo& t : file.tensors()) {
      const pagoda::GgmlTypeTraits traits = pagoda::ggml_type_traits(uint32_t(t.type));
      // The parser guarantees nbytes lies in the input; only whole blocks can be dequantized.
      if (!traits.can_dequantize || t.nbytes < uint64_t(traits.block_bytes)) continue;
      pagoda::dequantize_row(t.type, t.data, out.data(), traits.block_size);
    }
    for (const auto& [key, value] : file.metadata()) {
      if (value.type == pagoda::GgufValueType::kArray) (void)value.array_type();
    }
  } catch (const pagoda::Error&) {
  }
  return 0;
}
