// libFuzzer target: safetensors parsing from bytes, reading each tensor's first and last byte
// (so ASan checks the views the parser hands out). Any exception other than pagoda::Error, and
// any crash or sanitizer report, is a bug.
#include "pagoda/format/safetensors.h"

#include <cstddef>
#include <cstdint>

#include "pagoda/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const pagoda::SafetensorsFile file =
        pagoda::SafetensorsFile::parse({data, size}, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const pagoda::SafetensorsTensor& t : file.tensors()) {
      if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
      if (file.find(t.name) == nullptr) __builtin_trap();
    }
  } catch (const pagoda::Error&) {
  }
  return 0;
}
