// libFuzzer target for the tokenizer. An input starting with '{' is tokenizer.json text: if it
// loads, a short string is encoded and decoded with it. Any other input is text for the SmolLM2
// fixture tokenizer: encode, decode and the incremental decoder must agree and stay valid UTF-8.
// Only pagoda::Error may escape the library; anything else (a crash, a sanitizer report, an
// uncaught exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pagoda/core/error.h"
#include "pagoda/tokenizer/tokenizer.h"
#include "pagoda/tokenizer/utf8.h"

namespace {

using pagoda::Tokenizer;

const Tokenizer* fixture_tokenizer() {
  static const std::optional<Tokenizer> tokenizer = []() -> std::optional<Tokenizer> {
    const std::string here = __FILE__;
    const std::string root = here.substr(0, here.rfind("/fuzz/"));
    try {
      return Tokenizer::from_json_file(root + "/tests/tokenizer/fixtures/smollm2_tokenizer.json");
    } catch (const pagoda::Error&) {
      return std::nullopt;  // run without the text half rather than not at all
    }
  }();
  return tokenizer ? &*tokenizer : nullptr;
}

void check(bool condition) {
  if (!condition) __builtin_trap();
}

// decode() and the streamed pieces agree, and every piece is valid UTF-8.
void check_decoders(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (bool skip_special : {false, true}) {
    pagoda::IncrementalDecoder decoder(tokenizer, skip_special);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = decoder.push(id);
      check(pagoda::to_valid_utf8(piece) == piece);
      streamed += piece;
    }
    streamed += decoder.flush();
    check(streamed == tokenizer.decode(ids, skip_special));
  }
}

void fuzz_json(std::string_view json) {
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::from_json(json);
  } catch (const pagoda::Error&) {
    return;
  }
  try {
    for (bool parse_special : {false, true}) {
      const std::vector<int32_t> ids = tokenizer->encode("Hello  wörld 12 <s>\n😀", true, parse_special);
      for (int32_t id : ids) check(id >= 0 && id < tokenizer->vocab_size());
      check_decoders(*tokenizer, ids);
    }
  } catch (const pagoda::Error&) {
  }
}

void fuzz_text(std::string_view text) {
  const Tokenizer* tokenizer = fixture_tokenizer();
  if (tokenizer == nullptr) return;
  const std::vector<int32_t> ids = tokenizer->encode(text, false, /*parse_special=*/false);
  // Without special parsing, byte-level BPE spells out every byte that has a token.
  std::string bytes;
  for (int32_t id : ids) bytes += tokenizer->token_bytes(id);
  check(bytes.size() <= text.size());
  check_decoders(*tokenizer, ids);
  check_decoders(*tokenizer, tokenizer->encode(text, true, /*parse_special=*/true));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (!input.empty() && input.front() == '{') {
    fuzz_json(input);
  } else {
    fuzz_text(input.substr(0, 4096));
  }
  return 0;
}
