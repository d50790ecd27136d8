// Writes a model as a GGUF file with its weights in a chosen type (pagoda quantize): from a GGUF
// file (metadata kept, tensors converted) or a Hugging Face folder (metadata and tokenizer written
// as llama.cpp's converter writes them, q/k rows interleaved for Llama's RoPE, names mapped), so
// that pagoda, llama.cpp and the `gguf` Python package read the result.
#pragma once

#include <cstdint>
#include <string>

#include "pagoda/format/ggml_type.h"

namespace pagoda {

// The type a tensor is stored in when the model is written as `target`, as llama-quantize
// chooses: 1-D tensors (norms, biases, rope_freqs) stay f32; the output projection of a K-quant
// model is q6_k (it is the tensor most sensitive to error); every other 2-D tensor is `target`.
GgmlType export_tensor_type(const std::string& gguf_name, int dims, GgmlType target);

struct GgufExportResult {
  int tensors = 0;
  uint64_t bytes_in = 0;   // of the source's tensors
  uint64_t bytes_out = 0;  // of the written tensors
};

// Throws Error(kInvalidArgument) for a target type that cannot be written or a tensor whose rows
// are not a multiple of its type's block size, kUnsupported for a source pagoda cannot convert
// (a tokenizer that is not byte-level BPE), kCorrupt for a source that holds a non-finite value,
// and what Checkpoint::open and GgufFile::open throw.
GgufExportResult export_gguf(const std::string& in, const std::string& out, GgmlType target);

}  // namespace pagoda
