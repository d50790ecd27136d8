// pagoda._core: the extension module under the pagoda package. pagoda::Error becomes the Python
// exception a caller expects for its kind, with the message the CLI prints after "pagoda: error: ".
#include <nanobind/nanobind.h>

#include "pagoda/core/error.h"

namespace nb = nanobind;

namespace pagoda::python {
void bind_llm(nb::module_& m);
void bind_ops(nb::module_& m);
}  // namespace pagoda::python

NB_MODULE(_core, m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pagoda::Error& e) {
      PyObject* type = PyExc_RuntimeError;  // kCorrupt, kUnsupported, kInternal
      switch (e.kind()) {
        case pagoda::ErrorKind::kInvalidArgument: type = PyExc_ValueError; break;
        case pagoda::ErrorKind::kNotFound: type = PyExc_FileNotFoundError; break;
        case pagoda::ErrorKind::kOutOfMemory: type = PyExc_MemoryError; break;
        default: break;
      }
      PyErr_SetString(type, e.what());
    }
  });
  pagoda::python::bind_llm(m);
  pagoda::python::bind_ops(m);
#ifdef PAGODA_HAVE_CUDA
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
}
