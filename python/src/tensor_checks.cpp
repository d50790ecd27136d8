#include "tensor_checks.h"

#include <fmt/format.h>

#include <mutex>
#include <unordered_map>

#include "pagoda/core/error.h"

namespace nb = nanobind;

namespace pagoda::python {
namespace {

// The DLPack C exchange API (DLPack 1.2, dlpack.h's DLPackExchangeAPI), declared here by its
// documented layout: a version header, then function pointers. Only the two this file calls
// are typed; the others are opaque.
struct ExchangeApi {
  uint32_t major, minor;
  const void* prev_api;
  const void* managed_tensor_allocator;
  const void* managed_tensor_from_py_object_no_sync;
  const void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

// The type's exchange API when it offers one of major version 1 with a view function, else null.
// Looked up once per type (a handful in a process: torch.Tensor, its subclasses).
const ExchangeApi* exchange_api(PyTypeObject* type) {
  static std::unordered_map<PyTypeObject*, const ExchangeApi*> apis;  // under the GIL
  const auto it = apis.find(type);
  if (it != apis.end()) return it->second;
  const ExchangeApi* api = nullptr;
  if (PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__")) {
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
      api = static_cast<const ExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
      if (api->major != 1 || api->dltensor_from_py_object_no_sync == nullptr) api = nullptr;
    }
    Py_DECREF(capsule);  // the API itself lives for the whole process
  } else {
    PyErr_Clear();
  }
  apis.emplace(type, api);
  return api;
}

}  // namespace

TensorArg::TensorArg(nb::handle obj, const char* name) : name_(name) {
  if (obj.is_none()) fail(ErrorKind::kInvalidArgument, "{} is None; pass a tensor", name);
  const auto* api = exchange_api(Py_TYPE(obj.ptr()));
  if (api) {
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t_) != 0) nb::raise_python_error();
    exchange_api_ = api;
    return;
  }
  if (!nb::try_cast<Array>(obj, held_, false))
    fail(ErrorKind::kInvalidArgument, "{} is a {}, not a DLPack tensor (torch, numpy, CuPy, JAX)", name,
         nb::type_name(obj.type()).c_str());
  t_.data = held_.data_handle();
  t_.device = {held_.device_type(), held_.device_id()};
  t_.ndim = int32_t(held_.ndim());
  t_.dtype = held_.dtype();
  t_.shape = const_cast<int64_t*>(held_.shape_ptr());
  t_.strides = const_cast<int64_t*>(held_.stride_ptr());
  t_.byte_offset = held_.byte_offset();
}

int64_t TensorArg::stride(size_t d) const {
  if (t_.strides) return t_.strides[d];
  int64_t stride = 1;
  for (size_t i = ndim(); --i > d;) stride *= t_.shape[i];
  return stride;
}

uintptr_t TensorArg::stream(int64_t stream) const {
  if (stream != kCurrentStream) return uintptr_t(stream);
  const auto* api = static_cast<const ExchangeApi*>(exchange_api_);
  if (!api || device_type() != nb::device::cuda::value || !api->current_work_stream) return 0;
  void* current = nullptr;
  if (api->current_work_stream(int32_t(device_type()), int32_t(device_id()), &current) != 0) nb::raise_python_error();
  return reinterpret_cast<uintptr_t>(current);
}

DType dtype_of(const TensorArg& a) {
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
  fail(ErrorKind::kInvalidArgument, "{} is {}{}{}; pagoda takes f32, f16 or bf16", a.name(), kind,
       t.code <= uint8_t(nb::dlpack::dtype_code::Float) ? std::to_string(t.bits) : std::to_string(int(t.code)),
       t.lanes == 1 ? "" : fmt::format(" x{}", int(t.lanes)));
}

Device device_of(const TensorArg& a) {
  if (a.device_type() == nb::device::cpu::value) return Device::kCpu;
  if (a.device_type() == nb::device::cuda::value) return Device::kCuda;
  fail(ErrorKind::kInvalidArgument, "{} is on DLPack device type {}; pagoda takes CPU and CUDA tensors", a.name(),
       a.device_type());
}

const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

std::string shape_string(const TensorArg& a) {
  std::string s = "[";
  for (size_t d = 0; d < a.ndim(); ++d) s += fmt::format("{}{}", d ? ", " : "", a.shape(d));
  return s + "]";
}

void check_tensor(const TensorArg& a, const TensorRule& rule) {
  if (a.ndim() != rule.shape.size())
    fail(ErrorKind::kInvalidArgument, "{} must have {} dimensions {}, not shape {}", a.name(), rule.shape.size(),
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
    fail(ErrorKind::kInvalidArgument, "{} has shape {}; expected {}] {}", a.name(), shape_string(a), expected,
         rule.dims);
  const Device device = device_of(a);
  if (device != rule.device || (device == Device::kCuda && a.device_id() != rule.device_id))
    fail(ErrorKind::kInvalidArgument, "{} is on {}:{}; expected {}:{}", a.name(), device_name(device), a.device_id(),
         device_name(rule.device), rule.device_id);
  const DType dtype = dtype_of(a);
  if (dtype != rule.dtype)
    fail(ErrorKind::kInvalidArgument, "{} is {}; expected {}", a.name(), dtype_name(dtype), dtype_name(rule.dtype));
  int64_t stride = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != stride)
      fail(ErrorKind::kInvalidArgument, "{} is not contiguous (shape {}, element strides at dimension {}: {}); pass a "
           "contiguous copy", a.name(), shape_string(a), i, a.stride(i));
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
