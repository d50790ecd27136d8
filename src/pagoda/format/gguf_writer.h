// GGUF v3 writer: metadata and tensor infos first, then each tensor's bytes streamed in the order
// the tensors were declared, so a model larger than memory is written a chunk at a time. The
// file reads back with GgufFile, the `gguf` Python package and llama.cpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/format/gguf.h"

namespace pagoda {

// Metadata values of the common types.
GgufValue gguf_string(std::string value);
GgufValue gguf_u32(uint32_t value);
GgufValue gguf_i32(int32_t value);
GgufValue gguf_f32(float value);
GgufValue gguf_bool(bool value);
GgufValue gguf_string_array(std::vector<std::string> values);
GgufValue gguf_i32_array(const std::vector<int32_t>& values);
GgufValue gguf_f32_array(const std::vector<float>& values);

class GgufWriter {
 public:
  explicit GgufWriter(std::string path);
  ~GgufWriter();

  // Sets a metadata key (replacing an earlier value of it); before write_header.
  void set(const std::string& key, GgufValue value);
  // Declares the next tensor: dims in ggml order (dims[0] is the row length, a multiple of the
  // type's block size, or Error(kInvalidArgument)). Before write_header. Returns its byte size.
  uint64_t add_tensor(std::string name, std::vector<int64_t> dims, GgmlType type);

  // Creates the file and writes magic, metadata and tensor infos. Throws Error(kInternal) when
  // the file cannot be written.
  void write_header();
  // Appends bytes of the tensors' data, in declaration order: any split into calls, each tensor's
  // bytes in total exactly its size (Error(kInternal) otherwise, at finish).
  void write_data(std::span<const uint8_t> bytes);
  // Pads and closes the file; throws when fewer or more bytes were written than declared.
  void finish();

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    uint64_t offset;  // relative to the data section
    uint64_t nbytes;
  };
  void write(const void* data, size_t bytes);
  void pad_to(uint64_t position);

  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;   // the data section's size, every tensor padded to the alignment
  uint64_t written_ = 0;      // bytes of the data section written so far (padding included)
  size_t current_ = 0;        // the tensor write_data is filling
  uint64_t current_done_ = 0; // its bytes written
};

}  // namespace pagoda
