// Errors for bad input. Anything a user can get wrong (a file, a flag, a request) throws
// pagoda::Error carrying what was wrong and where; the CLI and server turn it into a one-line
// message and a non-zero exit or an HTTP error. assert() is kept for programmer errors.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace pagoda {

enum class ErrorKind {
  kInvalidArgument,  // a flag or request parameter out of range
  kNotFound,         // a file, tensor, key or token that does not exist
  kCorrupt,          // bytes that do not parse: truncated file, bad offset, bad JSON
  kUnsupported,      // well-formed but not something pagoda runs (architecture, tensor type)
  kOutOfMemory,      // KV blocks or device memory exhausted
  kInternal,         // a bug or an environment failure (I/O error, CUDA error)
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace pagoda
