#include "pagoda/format/ggml_type.h"

namespace pagoda {

// Every type ggml defines, so a file holding types pagoda cannot dequantize still parses (its
// tensor sizes are known) and fails only when such a tensor is used. Sizes are ggml's
// (ggml-common.h); Q8_1 is 36 bytes there (two fp16 + 32 int8), whatever older tables say.
GgmlTypeTraits ggml_type_traits(uint32_t type) {
  switch (type) {
    case 0: return {"f32", 1, 4, true};
    case 1: return {"f16", 1, 2, true};
    case 2: return {"q4_0", 32, 18, true};
    case 3: return {"q4_1", 32, 20, true};
    case 6: return {"q5_0", 32, 22, true};
    case 7: return {"q5_1", 32, 24, true};
    case 8: return {"q8_0", 32, 34, true};
    case 9: return {"q8_1", 32, 36, false};
    case 10: return {"q2_k", 256, 84, false};
    case 11: return {"q3_k", 256, 110, false};
    case 12: return {"q4_k", 256, 144, true};
    case 13: return {"q5_k", 256, 176, true};
    case 14: return {"q6_k", 256, 210, true};
    case 15: return {"q8_k", 256, 292, false};
    case 16: return {"iq2_xxs", 256, 66, false};
    case 17: return {"iq2_xs", 256, 74, false};
    case 18: return {"iq3_xxs", 256, 98, false};
    case 19: return {"iq1_s", 256, 50, false};
    case 20: return {"iq4_nl", 32, 18, false};
    case 21: return {"iq3_s", 256, 110, false};
    case 22: return {"iq2_s", 256, 82, false};
    case 23: return {"iq4_xs", 256, 136, false};
    case 24: return {"i8", 1, 1, false};
    case 25: return {"i16", 1, 2, false};
    case 26: return {"i32", 1, 4, false};
    case 27: return {"i64", 1, 8, false};
    case 28: return {"f64", 1, 8, false};
    case 29: return {"iq1_m", 256, 56, false};
    case 30: return {"bf16", 1, 2, true};
    case 34: return {"tq1_0", 256, 54, false};
    case 35: return {"tq2_0", 256, 66, false};
    case 39: return {"mxfp4", 32, 17, false};
    default: return {"unknown", 0, 0, false};
  }
}

}  // namespace pagoda
