#include "pagoda/core/error.h"

namespace pagoda {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kCorrupt: return "corrupt input";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kOutOfMemory: return "out of memory";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

}  // namespace pagoda
