#include "pagoda/core/tensor.h"

namespace pagoda {

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

}  // namespace pagoda
