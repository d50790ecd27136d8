#include "tensor_checks.h"

#include <fmt/format.h>

#include "pagoda/core/error.h"

namespace nb = nanobind;

namespace pagoda::python {

DType dtype_of(const Array& a, const char* name) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes == 1) {
    if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 32) return DType::kF32;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16) return DType::kF16;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return DType::kBF16;
  }
  const char* kind = t.code == uint8_t(nb::dlpack::dtype_code::Float)  ? "f"
                     : t.code == uint8_t(nb::dlpack::dtype_code::Int)  ? "i"
                     : t.code == uint8_t(nb::dlpack::dtype_code::UInt) ? "u"
                                                                        : "DLPack type code ";
  fail(ErrorKind::kInvalidArgument, "{} is {}{}{}; pagoda takes f32, f16 or bf16", name, kind,
       t.code <= uint8_t(nb::dlpack::dtype_code::Float) ? std::to_string(t.bits) : std::to_string(int(t.code)),
       t.lanes == 1 ? "" : fmt::format(" x{}", int(t.lanes)));
}

Device device_of(const Array& a, const char* name) {
  if (a.device_type() == nb::device::cpu::value) return Device::kCpu;
  if (a.device_type() == nb::device::cuda::value) return Device::kCuda;
  fail(ErrorKind::kInvalidArgument, "{} is on DLPack device type {}; pagoda takes CPU and CUDA tensors", name,
       a.device_type());
}

const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

std::string shape_string(const Array& a) {
  std::string s = "[";
  for (size_t d = 0; d < a.ndim(); ++d) s += fmt::format("{}{}", d ? ", " : "", a.shape(d));
  return s + "]";
}

void check_tensor(const Array& a, const TensorRule& rule) {
  if (!a.is_valid()) fail(ErrorKind::kInvalidArgument, "{} is missing", rule.name);
  if (a.ndim() != rule.shape.size())
    fail(ErrorKind::kInvalidArgument, "{} must have {} dimensions {}, not shape {}", rule.name, rule.shape.size(),
         rule.dims, shape_string(a));
  size_t d = 0;
  std::string expected = "[";
  bool matches = true;
  for (int64_t size : rule.shape) {
    expected += size < 0 ? fmt::format("{}*", d ? ", " : "") : fmt::format("{}{}", d ? ", " : "", size);
    if (size >= 0 && int64_t(a.shape(d)) != size) matches = false;
    ++d;
  }
  if (!matches)
    fail(ErrorKind::kInvalidArgument, "{} has shape {}; expected {}] {}", rule.name, shape_string(a), expected,
         rule.dims);
  const Device device = device_of(a, rule.name);
  if (device != rule.device || (device == Device::kCuda && a.device_id() != rule.device_id))
    fail(ErrorKind::kInvalidArgument, "{} is on {}:{}; expected {}:{}", rule.name, device_name(device), a.device_id(),
         device_name(rule.device), rule.device_id);
  const DType dtype = dtype_of(a, rule.name);
  if (dtype != rule.dtype)
    fail(ErrorKind::kInvalidArgument, "{} is {}; expected {}", rule.name, dtype_name(dtype), dtype_name(rule.dtype));
  int64_t stride = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != stride)
      fail(ErrorKind::kInvalidArgument, "{} is not contiguous (shape {}, element strides at dimension {}: {}); pass a "
           "contiguous copy", rule.name, shape_string(a), i, a.stride(i));
    stride *= int64_t(a.shape(i));
  }
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  fail(ErrorKind::kInvalidArgument, "dtype must be f32, f16 or bf16 (or float32, float16, bfloat16), not '{}'", name);
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  fail(ErrorKind::kInvalidArgument, "device must be cpu, cuda or cuda:N, not '{}'", name);
}

}  // namespace pagoda::python
