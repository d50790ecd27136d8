// libFuzzer target for the OpenAI request parser: any bytes as a /v1/chat/completions and a
// /v1/completions body, with SmolLM2's tokenizer and chat template. Only ApiError may come out;
// an accepted request must be one the engine takes (prompts in the vocabulary that leave room in
// the context, parameters validate() accepts). Anything else (a crash, a sanitizer report,
// another exception, a trap) is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "pagoda/core/default_model.h"
#include "pagoda/core/error.h"
#include "pagoda/format/gguf.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/openai_request.h"

namespace {

using namespace pagoda;
using namespace pagoda::server;

// Small, so that inputs of a few hundred bytes reach the context checks.
constexpr int32_t kMaxContext = 256;

std::optional<Tokenizer> g_tokenizer;
std::optional<ChatTemplate> g_template;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

void check_job(const GenerationJob& job) {
  check(!job.prompts.empty() && (job.kind == ApiKind::kCompletion || job.prompts.size() == 1));
  check(job.max_tokens_per_prompt.size() == job.prompts.size());
  check(job.n >= 1 && job.n <= kMaxChoices);
  for (size_t p = 0; p < job.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = job.prompts[p];
    check(!prompt.empty());
    for (int32_t id : prompt) check(id >= 0 && id < g_tokenizer->vocab_size());
    check(job.max_tokens_per_prompt[p] >= 1);
    check(int64_t(prompt.size()) + job.max_tokens_per_prompt[p] <= kMaxContext);
  }
  for (int32_t i = 0; i < int32_t(job.prompts.size()) * job.n; ++i) validate(choice_params(job, i));  // must not throw
  check(job.params.logprobs == (job.logprobs ? std::max(1, job.top_logprobs) : 0));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  try {
    g_tokenizer = Tokenizer::from_gguf(GgufFile::open(default_model_path()));
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_openai_request needs the default model: %s\n", e.what());
    std::exit(1);
  }
  g_template = detect_chat_template(g_tokenizer->chat_template_text()).value();  // SmolLM2 has ChatML
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const ModelContext model{*g_tokenizer, *g_template, "smollm2", kMaxContext};
  for (auto parse : {parse_chat_request, parse_completion_request}) {
    try {
      check_job(parse(body, model));
    } catch (const ApiError& e) {
      check(e.status == 400 || e.status == 404);
    }
  }
  return 0;
}
