#include "pagoda/cli/session.h"

#include <omp.h>

#include <filesystem>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/default_model.h"
#include "pagoda/format/gguf.h"
#ifdef PAGODA_HAVE_CUDA
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#endif

namespace pagoda::cli {
namespace {

Tokenizer load_tokenizer(const Checkpoint& checkpoint) {
  if (checkpoint.gguf()) return Tokenizer::from_gguf(*checkpoint.gguf());
  namespace fs = std::filesystem;
  const fs::path path = fs::is_directory(checkpoint.path()) ? fs::path(checkpoint.path())
                                                            : fs::path(checkpoint.path()).parent_path();
  return Tokenizer::from_json_file((path / "tokenizer.json").string());
}

// --weight-dtype: auto is f16, except that a bf16 checkpoint stays bf16 (its values may not fit
// f16's range, which the GPU backend would otherwise convert every weight and activation to).
DType parse_weight_dtype(const std::string& name, const Checkpoint& checkpoint) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "auto")
    return checkpoint.get("model.embed_tokens.weight").type == GgmlType::kBF16 ? DType::kBF16 : DType::kF16;
  fail(ErrorKind::kInvalidArgument, "--weight-dtype must be auto, f32, f16 or bf16, not '{}'", name);
}

// --kv-cache-dtype and --kv-partition into options, refused here, before the weights load, when
// the model or the backend cannot take them.
void parse_kv_cache_flags(const ModelFlags& flags, const ModelConfig& config, const Backend& backend,
                          DType weight_dtype, LoadOptions& options) {
  const std::string& name = flags.kv_cache_dtype;
  if (name == "f16") {
    options.kv_dtype = DType::kF16;
  } else if (name == "bf16") {
    options.kv_dtype = DType::kBF16;
  } else if (name == "fp8") {
    options.kv_quant = KvQuant::kFp8;
  } else if (name == "int2") {
    options.kv_quant = KvQuant::kInt2;
  } else if (name != "auto") {
    fail(ErrorKind::kInvalidArgument, "--kv-cache-dtype must be auto, f16, bf16, fp8 or int2, not '{}'", name);
  }
  if (flags.kv_partition != 32 && flags.kv_partition != 64 && flags.kv_partition != 128)
    fail(ErrorKind::kInvalidArgument, "--kv-partition must be 32, 64 or 128, not {}", flags.kv_partition);
  options.kv_partition = flags.kv_partition;
  if (flags.kv_rotation == "hadamard" || (flags.kv_rotation == "auto" && options.kv_quant == KvQuant::kInt2)) {
    options.kv_hadamard = true;
  } else if (flags.kv_rotation != "none" && flags.kv_rotation != "auto") {
    fail(ErrorKind::kInvalidArgument, "--kv-rotation must be auto, none or hadamard, not '{}'", flags.kv_rotation);
  }
  if (options.kv_hadamard && options.kv_quant == KvQuant::kNone)
    fail(ErrorKind::kInvalidArgument, "--kv-rotation hadamard applies to a quantized cache (--kv-cache-dtype int2 or fp8)");
  if (options.kv_hadamard && (config.head_dim & (config.head_dim - 1)) != 0)
    fail(ErrorKind::kInvalidArgument, "--kv-rotation hadamard needs a power-of-two head_dim, not {}", config.head_dim);
  if (options.kv_quant == KvQuant::kInt2 && config.head_dim % flags.kv_partition != 0)
    fail(ErrorKind::kInvalidArgument,
         "--kv-cache-dtype int2: --kv-partition {} does not divide the model's head_dim {} (K is partitioned along "
         "head_dim)", flags.kv_partition, config.head_dim);
  if (backend.device() == Device::kCuda) {
    if (options.kv_quant != KvQuant::kNone)
      fail(ErrorKind::kUnsupported, "--kv-cache-dtype {}: the CUDA backend has no {} KV kernels yet; use --backend cpu",
           name, name);
    if (options.kv_dtype && *options.kv_dtype != weight_dtype)
      fail(ErrorKind::kUnsupported, "--kv-cache-dtype {}: the CUDA backend keeps KV in its activation dtype, {}", name,
           dtype_name(weight_dtype));
  }
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, DType dtype, bool graphs) {
  if (name != "auto" && name != "cpu" && name != "cuda")
    fail(ErrorKind::kInvalidArgument, "--backend must be auto, cpu or cuda, not '{}'", name);
#ifdef PAGODA_HAVE_CUDA
  if (name == "cuda" || (name == "auto" && cuda::device_available())) {
    if (dtype == DType::kF32) {
      if (name == "cuda") fail(ErrorKind::kInvalidArgument, "the CUDA backend runs f16 or bf16 weights, not f32");
      return std::make_unique<CpuBackend>();
    }
    return std::make_unique<CudaBackend>(dtype, CudaBackendOptions{.graphs = graphs});
  }
#else
  (void)graphs;
  if (name == "cuda") fail(ErrorKind::kUnsupported, "--backend cuda: this pagoda was built without CUDA");
#endif
  return std::make_unique<CpuBackend>();
}

void add_model_flags(CLI::App& app, ModelFlags& flags) {
  app.add_option("-m,--model", flags.path, "GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct)");
  app.add_option("--backend", flags.backend, "cpu, cuda, or auto (default: cuda when a GPU is present)");
  app.add_option("--weight-dtype", flags.weight_dtype,
                 "storage of quantized weights: auto (default: f16, bf16 for a bf16 checkpoint), f16, bf16 or f32; on "
                 "the GPU, of every weight and activation");
  app.add_option("--attention", flags.attention,
                 "decode attention: paged (a work item per sequence), prefix (prefix-aware packing: blocks the "
                 "batch shares are read once), or auto (default: prefix when the step's sequences share blocks)");
  app.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "KV cache storage: auto (default: the activation dtype), f16, bf16, fp8 (e4m3) or int2 (2-bit, "
                 "attention on the codes; see docs/kv-quantization.md)");
  app.add_option("--kv-partition", flags.kv_partition,
                 "int2 KV: elements per quantization partition, 32, 64 or 128 (default 64); it must divide head_dim");
  app.add_option("--kv-rotation", flags.kv_rotation,
                 "quantized KV: rotate keys and queries by a randomized Hadamard transform before keys are stored: "
                 "auto (default: hadamard under int2), none or hadamard");
  app.add_flag("--enforce-eager", flags.enforce_eager,
               "on the GPU, launch every op at every step instead of replaying decode steps as CUDA graphs");
  app.add_option("-t,--threads", flags.threads, "CPU threads (default: all cores)");
  app.add_option("--kv-memory-mb", flags.kv_memory_mb, "memory for the KV cache in MiB (default 1024)");
  app.add_option("--max-batch", flags.max_batch, "sequences in flight (default 16)");
  app.add_option("--step-tokens", flags.step_tokens, "tokens per forward pass, for chunked prefill (default 512)");
}

void add_sampling_flags(CLI::App& app, SamplingParams& params) {
  params.temperature = 0.8f;
  params.top_k = 40;
  params.top_p = 0.95f;
  params.min_p = 0.05f;
  app.add_option("-n,--max-tokens", params.max_tokens, "most tokens to generate");
  app.add_option("--temp,--temperature", params.temperature, "sampling temperature; 0 is greedy (default 0.8)");
  app.add_option("--top-k", params.top_k, "keep the k most likely tokens; 0 is off (default 40)");
  app.add_option("--top-p", params.top_p, "nucleus sampling mass in (0, 1] (default 0.95)");
  app.add_option("--min-p", params.min_p, "drop tokens below min-p x the top probability (default 0.05)");
  app.add_option("--repeat-penalty", params.repetition_penalty, "repetition penalty; 1 is off (default 1)");
  app.add_option("--presence-penalty", params.presence_penalty, "OpenAI presence penalty in [-2, 2]");
  app.add_option("--frequency-penalty", params.frequency_penalty, "OpenAI frequency penalty in [-2, 2]");
  app.add_option("-s,--seed", params.seed, "random seed (default: random)");
  app.add_option("--stop", params.stop, "stop string (repeatable)");
  app.add_flag("--ignore-eos", params.ignore_eos, "keep generating past the end-of-sequence token");
}

ChatTemplate choose_chat_template(const std::string& name, const Tokenizer& tokenizer) {
  if (!name.empty()) return chat_template_by_name(name);
  if (auto detected = detect_chat_template(tokenizer.chat_template_text())) return *detected;
  fail(ErrorKind::kUnsupported,
       "the model's chat template is not one pagoda recognises; choose one with --chat-template "
       "chatml|llama3|llama2");
}

Session::Session(const ModelFlags& flags)
    : checkpoint(Checkpoint::open(flags.path.empty() ? default_model_path() : flags.path)),
      tokenizer(load_tokenizer(checkpoint)) {
  if (flags.threads < 0 || flags.threads > 1024) fail(ErrorKind::kInvalidArgument, "--threads must be in [0, 1024]");
  if (flags.threads > 0) omp_set_num_threads(flags.threads);
  if (flags.kv_memory_mb < 1 || flags.kv_memory_mb > (1 << 22))
    fail(ErrorKind::kInvalidArgument, "--kv-memory-mb must be in [1, 4194304]");
  if (flags.max_batch < 1 || flags.max_batch > 4096) fail(ErrorKind::kInvalidArgument, "--max-batch must be in [1, 4096]");
  if (flags.step_tokens < 1 || flags.step_tokens > 65536)
    fail(ErrorKind::kInvalidArgument, "--step-tokens must be in [1, 65536]");
  const DType weight_dtype = parse_weight_dtype(flags.weight_dtype, checkpoint);
  LoadOptions::Attention attention = LoadOptions::Attention::kAuto;
  if (flags.attention == "paged") {
    attention = LoadOptions::Attention::kPaged;
  } else if (flags.attention == "prefix") {
    attention = LoadOptions::Attention::kPrefix;
  } else if (flags.attention != "auto") {
    fail(ErrorKind::kInvalidArgument, "--attention must be auto, paged or prefix, not '{}'", flags.attention);
  }
  backend = make_backend(flags.backend, weight_dtype, !flags.enforce_eager);
  LoadOptions options{.weight_dtype = weight_dtype, .attention = attention};
  parse_kv_cache_flags(flags, checkpoint.config(), *backend, weight_dtype, options);
  model = std::make_unique<Model>(checkpoint, *backend, options);
  engine_options = EngineOptions{.kv_memory_bytes = size_t(flags.kv_memory_mb) << 20,
                                 .max_batch = flags.max_batch,
                                 .max_step_tokens = flags.step_tokens};
  // An int2 block holds a whole number of V partitions.
  if (options.kv_quant == KvQuant::kInt2) engine_options.block_size = flags.kv_partition;
}

}  // namespace pagoda::cli
