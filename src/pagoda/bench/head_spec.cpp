#include "pagoda/bench/head_spec.h"

#include <charconv>
#include <string_view>

#include "pagoda/core/error.h"

namespace pagoda::bench {
namespace {

int32_t parse_positive(std::string_view text, std::string_view spec) {
  int32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1)
    fail(ErrorKind::kInvalidArgument, "--heads: '{}' is not q_heads/kv_heads (e.g. 32/8)", spec);
  return value;
}

}  // namespace

HeadSpec parse_heads(const std::string& spec) {
  const size_t slash = spec.find('/');
  if (slash == std::string::npos)
    fail(ErrorKind::kInvalidArgument, "--heads: '{}' is not q_heads/kv_heads (e.g. 32/8)", spec);
  const std::string_view text(spec);
  const HeadSpec heads{parse_positive(text.substr(0, slash), spec), parse_positive(text.substr(slash + 1), spec)};
  if (heads.q_heads % heads.kv_heads != 0)
    fail(ErrorKind::kInvalidArgument, "--heads {}: {} KV heads do not divide {} query heads", spec, heads.kv_heads,
         heads.q_heads);
  return heads;
}

}  // namespace pagoda::bench
