#include "pagoda/format/gguf_writer.h"

#include <cerrno>
#include <cstring>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" as a little-endian u32
constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kAlignment = 32;  // GGUF's default: no general.alignment key needed

uint64_t align_up(uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

GgufValue gguf_string(std::string value) { return {GgufValueType::kString, std::move(value)}; }
GgufValue gguf_u32(uint32_t value) { return {GgufValueType::kU32, uint64_t(value)}; }
GgufValue gguf_i32(int32_t value) { return {GgufValueType::kI32, int64_t(value)}; }
GgufValue gguf_f32(float value) { return {GgufValueType::kF32, double(value)}; }
GgufValue gguf_bool(bool value) { return {GgufValueType::kBool, value}; }

GgufValue gguf_string_array(std::vector<std::string> values) {
  std::vector<GgufValue> elements;
  elements.reserve(values.size());
  for (std::string& v : values) elements.push_back(gguf_string(std::move(v)));
  return {GgufValueType::kArray, std::move(elements)};
}

GgufValue gguf_i32_array(const std::vector<int32_t>& values) {
  std::vector<GgufValue> elements;
  elements.reserve(values.size());
  for (int32_t v : values) elements.push_back(gguf_i32(v));
  return {GgufValueType::kArray, std::move(elements)};
}

GgufValue gguf_f32_array(const std::vector<float>& values) {
  std::vector<GgufValue> elements;
  elements.reserve(values.size());
  for (float v : values) elements.push_back(gguf_f32(v));
  return {GgufValueType::kArray, std::move(elements)};
}

GgufWriter::GgufWriter(std::string path) : path_(std::move(path)), file_(nullptr, &std::fclose) {}
GgufWriter::~GgufWriter() = default;

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

uint64_t GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, GgmlType type) {
  const GgmlTypeTraits traits = ggml_type_traits(uint32_t(type));
  if (traits.block_size == 0) fail(ErrorKind::kInvalidArgument, "tensor '{}': unknown type {}", name, uint32_t(type));
  if (dims.empty() || dims.size() > 4)
    fail(ErrorKind::kInvalidArgument, "tensor '{}' has {} dimensions, GGUF holds 1 to 4", name, dims.size());
  uint64_t elements = 1;
  for (int64_t d : dims) {
    if (d <= 0) fail(ErrorKind::kInvalidArgument, "tensor '{}' has a dimension of {}", name, d);
    elements *= uint64_t(d);
  }
  if (dims[0] % traits.block_size != 0)
    fail(ErrorKind::kInvalidArgument, "tensor '{}': rows of {} values are not a multiple of {}'s block size {}", name,
         dims[0], traits.name, traits.block_size);
  const uint64_t nbytes = elements / uint64_t(traits.block_size) * uint64_t(traits.block_bytes);
  tensors_.push_back({std::move(name), std::move(dims), type, data_bytes_, nbytes});
  data_bytes_ = align_up(data_bytes_ + nbytes);
  return nbytes;
}

void GgufWriter::write(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_.get()) != bytes)
    fail(ErrorKind::kInternal, "cannot write '{}': {}", path_, std::strerror(errno));
}

void GgufWriter::write_header() {
  file_.reset(std::fopen(path_.c_str(), "wb"));
  if (!file_) fail(ErrorKind::kInternal, "cannot create '{}': {}", path_, std::strerror(errno));
  std::string header;
  const auto put = [&header](const auto& value) {
    header.append(reinterpret_cast<const char*>(&value), sizeof value);  // little-endian hosts only
  };
  const auto put_string = [&](const std::string& s) {
    put(uint64_t(s.size()));
    header += s;
  };
  const auto put_value = [&](const auto& self, const GgufValue& v) -> void {
    switch (v.type) {
      case GgufValueType::kU8: put(uint8_t(v.as_int())); break;
      case GgufValueType::kI8: put(int8_t(v.as_int())); break;
      case GgufValueType::kU16: put(uint16_t(v.as_int())); break;
      case GgufValueType::kI16: put(int16_t(v.as_int())); break;
      case GgufValueType::kU32: put(uint32_t(v.as_int())); break;
      case GgufValueType::kI32: put(int32_t(v.as_int())); break;
      case GgufValueType::kU64: put(std::get<uint64_t>(v.value)); break;
      case GgufValueType::kI64: put(int64_t(v.as_int())); break;
      case GgufValueType::kF32: put(float(v.as_float())); break;
      case GgufValueType::kF64: put(v.as_float()); break;
      case GgufValueType::kBool: put(uint8_t(v.as_bool() ? 1 : 0)); break;
      case GgufValueType::kString: put_string(v.as_string()); break;
      case GgufValueType::kArray: {
        put(uint32_t(v.array_type()));
        put(uint64_t(v.as_array().size()));
        for (const GgufValue& element : v.as_array()) self(self, element);
        break;
      }
    }
  };
  put(kGgufMagic);
  put(kGgufVersion);
  put(uint64_t(tensors_.size()));
  put(uint64_t(metadata_.size()));
  for (const auto& [key, value] : metadata_) {
    put_string(key);
    put(uint32_t(value.type));
    put_value(put_value, value);
  }
  for (const Tensor& t : tensors_) {
    put_string(t.name);
    put(uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put(uint64_t(d));
    put(uint32_t(t.type));
    put(t.offset);
  }
  header.append(align_up(header.size()) - header.size(), '\0');
  write(header.data(), header.size());
}

void GgufWriter::pad_to(uint64_t position) {
  static constexpr uint8_t kZeros[kAlignment] = {};
  write(kZeros, size_t(position - written_));
  written_ = position;
}

void GgufWriter::write_data(std::span<const uint8_t> bytes) {
  if (!file_) fail(ErrorKind::kInternal, "'{}': tensor data written before the header", path_);
  while (!bytes.empty()) {
    if (current_ >= tensors_.size())
      fail(ErrorKind::kInternal, "'{}': more tensor data than the {} tensors declared", path_, tensors_.size());
    const Tensor& t = tensors_[current_];
    const size_t n = size_t(std::min<uint64_t>(bytes.size(), t.nbytes - current_done_));
    write(bytes.data(), n);
    written_ += n;
    current_done_ += n;
    bytes = bytes.subspan(n);
    if (current_done_ == t.nbytes) {
      pad_to(align_up(written_));
      ++current_;
      current_done_ = 0;
    }
  }
}

void GgufWriter::finish() {
  if (!file_) fail(ErrorKind::kInternal, "'{}': finished before the header was written", path_);
  if (current_ < tensors_.size())
    fail(ErrorKind::kInternal, "'{}': tensor '{}' and those after it were not written", path_,
         tensors_[current_].name);
  if (std::fclose(file_.release()) != 0)
    fail(ErrorKind::kInternal, "cannot write '{}': {}", path_, std::strerror(errno));
}

}  // namespace pagoda
