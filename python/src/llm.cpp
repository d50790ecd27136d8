// The engine behind pagoda.LLM (python/pagoda/llm.py): a model loaded as the CLI loads it
// (engine/session.h), one Engine kept for the object's life (its prefix cache carries over from one
// generate() call to the next), and run(), which submits a list of requests and steps the engine
// until all are done, without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagoda/cli/flags.h"
#include "pagoda/engine/session.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/engine/sampling_params.h"

namespace nb = nanobind;

namespace pagoda::python {
namespace {

// One request's result, as the Python side assembles its CompletionOutput from it.
struct Completion {
  std::vector<int32_t> token_ids;
  std::string text;
  std::string finish_reason;
  int32_t prompt_tokens = 0;
  // Per generated token, when logprobs were asked for: the chosen token's logprob and the most
  // likely tokens' (id, logprob), most likely first.
  std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> logprobs;
};

class LlmEngine {
 public:
  // kv_cache_dtype is --kv-cache-dtype (auto, f16, bf16, fp8 or int2), checked by the Session as
  // the CLI checks it.
  LlmEngine(ModelFlags flags, const std::string& kv_cache_dtype) {
    flags.kv_cache_dtype = kv_cache_dtype;
    nb::gil_scoped_release release;
    session_ = std::make_unique<Session>(flags);
    kv_cache_dtype_ = kv_cache_dtype == "auto" ? std::string(dtype_name(session_->backend->activation_dtype())) : kv_cache_dtype;
    engine_ = std::make_unique<Engine>(*session_->model, session_->tokenizer, session_->engine_options);
  }

  std::vector<int32_t> encode(const std::string& text, bool add_bos) const {
    return session_->tokenizer.encode(text, add_bos && session_->tokenizer.add_bos_by_default());
  }
  std::string decode(const std::vector<int32_t>& ids) const { return session_->tokenizer.decode(ids); }

  // The prompt `pagoda chat` would send for these messages (role, content).
  std::string apply_chat_template(const std::vector<std::pair<std::string, std::string>>& messages,
                                  const std::string& template_name, bool add_generation_prompt) const {
    const ChatTemplate chat_template = cli::choose_chat_template(template_name, session_->tokenizer);
    std::vector<ChatMessage> history;
    for (const auto& [role, content] : messages) history.push_back({role, content});
    return pagoda::apply_chat_template(chat_template, history, add_generation_prompt);
  }

  // Runs every request to completion, batched by the engine. progress(done) is called with the GIL
  // after each step that finished a request. Ctrl-C (or an exception from progress) cancels the
  // requests still running and is raised once the engine has let go of them.
  std::vector<Completion> run(std::vector<std::pair<std::vector<int32_t>, SamplingParams>> requests,
                              nb::callable progress) {
    std::vector<Completion> results(requests.size());
    std::optional<nb::python_error> interrupted;
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(mutex_);  // one run at a time per engine
      std::unordered_map<RequestId, size_t> index;
      std::vector<RequestId> ids;
      size_t done = 0;
      try {
        for (size_t i = 0; i < requests.size(); ++i) {
          ids.push_back(engine_->submit(Request{.prompt = std::move(requests[i].first), .params = requests[i].second}));
          index[ids.back()] = i;
        }
        while (engine_->has_work() && done < results.size()) {
          const size_t done_before = done;
          for (const TokenEvent& event : engine_->step()) {
            const auto it = index.find(event.request);
            if (it == index.end()) continue;
            Completion& c = results[it->second];
            c.prompt_tokens = event.prompt_tokens;
            if (event.token >= 0) {
              c.token_ids.push_back(event.token);
              if (requests[it->second].second.logprobs > 0) {
                std::vector<std::pair<int32_t, float>> top;
                for (const TokenLogprob& t : event.sampled.top_logprobs) top.emplace_back(t.token, t.logprob);
                c.logprobs.emplace_back(event.sampled.logprob, std::move(top));
              }
            }
            c.text += event.text;
            if (event.finish != FinishReason::kNone) {
              c.finish_reason = finish_reason_name(event.finish);
              ++done;
            }
          }
          nb::gil_scoped_acquire acquire;
          try {
            if (PyErr_CheckSignals() != 0) throw nb::python_error();
            if (done != done_before) progress(done);
          } catch (nb::python_error& e) {
            interrupted.emplace(std::move(e));
            break;
          }
        }
        if (interrupted) {
          for (RequestId id : ids) engine_->cancel(id);  // finished ones are ignored
          while (engine_->has_work()) engine_->step();
        }
      } catch (...) {
        // A request refused at submit, or a step that failed: start from a fresh engine so that no
        // half-run request of this call stays queued in it.
        engine_.reset();
        engine_ = std::make_unique<Engine>(*session_->model, session_->tokenizer, session_->engine_options);
        throw;
      }
    }
    if (interrupted) throw std::move(*interrupted);
    return results;
  }

  std::string backend_name() const { return session_->backend->name(); }
  const std::string& kv_cache_dtype() const { return kv_cache_dtype_; }
  int32_t max_context() const { return session_->model->config().max_context; }
  std::string model_path() const { return session_->checkpoint.path(); }

 private:
  std::unique_ptr<Session> session_;
  std::string kv_cache_dtype_;
  std::unique_ptr<Engine> engine_;
  std::mutex mutex_;
};

}  // namespace

void bind_llm(nb::module_& m) {
  nb::class_<SamplingParams>(m, "EngineSamplingParams")
      .def(nb::init<>())
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("max_tokens", &SamplingParams::max_tokens)
      .def_rw("stop", &SamplingParams::stop)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def("validate", [](const SamplingParams& p) { validate(p); });

  nb::class_<Completion>(m, "Completion")
      .def_ro("token_ids", &Completion::token_ids)
      .def_ro("text", &Completion::text)
      .def_ro("finish_reason", &Completion::finish_reason)
      .def_ro("prompt_tokens", &Completion::prompt_tokens)
      .def_ro("logprobs", &Completion::logprobs);

  nb::class_<ModelFlags>(m, "ModelFlags")
      .def(nb::init<>())
      .def_rw("path", &ModelFlags::path)
      .def_rw("backend", &ModelFlags::backend)
      .def_rw("weight_dtype", &ModelFlags::weight_dtype)
      .def_rw("attention", &ModelFlags::attention)
      .def_rw("enforce_eager", &ModelFlags::enforce_eager)
      .def_rw("threads", &ModelFlags::threads)
      .def_rw("tensor_parallel", &ModelFlags::tensor_parallel)
      .def_rw("kv_memory_mb", &ModelFlags::kv_memory_mb)
      .def_rw("max_batch", &ModelFlags::max_batch)
      .def_rw("step_tokens", &ModelFlags::step_tokens)
      .def_rw("kv_partition", &ModelFlags::kv_partition);

  nb::class_<LlmEngine>(m, "LlmEngine")
      .def(nb::init<const ModelFlags&, const std::string&>(), nb::arg("flags"), nb::arg("kv_cache_dtype"))
      .def("encode", &LlmEngine::encode, nb::arg("text"), nb::arg("add_bos") = true)
      .def("decode", &LlmEngine::decode, nb::arg("ids"))
      .def("apply_chat_template", &LlmEngine::apply_chat_template, nb::arg("messages"), nb::arg("template_name"),
           nb::arg("add_generation_prompt"))
      .def("run", &LlmEngine::run, nb::arg("requests"), nb::arg("progress"))
      .def_prop_ro("backend", &LlmEngine::backend_name)
      .def_prop_ro("kv_cache_dtype", &LlmEngine::kv_cache_dtype)
      .def_prop_ro("max_context", &LlmEngine::max_context)
      .def_prop_ro("model_path", &LlmEngine::model_path);
}

}  // namespace pagoda::python
