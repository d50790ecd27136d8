#include "pagoda/engine/session.h"

#include <omp.h>

#include <filesystem>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/default_model.h"
#include "pagoda/format/gguf.h"
#include "pagoda/model/shard.h"
#include "pagoda/model/tensor_parallel_model.h"
#ifdef PAGODA_HAVE_CUDA
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#endif

namespace pagoda {
namespace {

Tokenizer load_tokenizer(const Checkpoint& checkpoint) {
  if (checkpoint.gguf()) return Tokenizer::from_gguf(*checkpoint.gguf());
  namespace fs = std::filesystem;
  const fs::path path = fs::is_directory(checkpoint.path()) ? fs::path(checkpoint.path())
                                                            : fs::path(checkpoint.path()).parent_path();
  return Tokenizer::from_json_file((path / "tokenizer.json").string());
}

// --weight-dtype: the storage of weights that are not kept in a GGUF file's quantized blocks. auto
// is f16, except that a bf16 checkpoint stays bf16 (its values may not fit f16's range, which the
// GPU backend would otherwise convert every weight and activation to).
DType parse_weight_dtype(const std::string& name, const Checkpoint& checkpoint) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "auto" || name == "file")
    return checkpoint.get("model.embed_tokens.weight").type == GgmlType::kBF16 ? DType::kBF16 : DType::kF16;
  fail(ErrorKind::kInvalidArgument, "--weight-dtype must be auto, file, f32, f16 or bf16, not '{}'", name);
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
  const bool int2 = options.kv_quant == KvQuant::kInt2;
  // auto picks, for int2, the remedies measured best (docs/experiments/kv-quantization.md) where the
  // backend runs them: on the CPU fp8 keys, one f16 sink token and nearest rounding; the GPU's
  // kernels run the paper's format (int2 keys, stochastic rounding, no sink).
  const bool cuda = backend.device() == Device::kCuda;
  if (flags.kv_key_dtype == "fp8" || (flags.kv_key_dtype == "auto" && int2 && !cuda)) {
    options.kv_key_quant = KvQuant::kFp8;
  } else if (flags.kv_key_dtype != "int2" && flags.kv_key_dtype != "auto") {
    fail(ErrorKind::kInvalidArgument, "--kv-key-dtype must be auto, int2 or fp8, not '{}'", flags.kv_key_dtype);
  }
  if (flags.kv_key_dtype != "auto" && !int2)
    fail(ErrorKind::kInvalidArgument, "--kv-key-dtype applies to --kv-cache-dtype int2");
  if (flags.kv_sink_tokens >= 0 && !int2)
    fail(ErrorKind::kInvalidArgument, "--kv-sink-tokens applies to --kv-cache-dtype int2");
  if (flags.kv_sink_tokens < -1 || flags.kv_sink_tokens >= flags.kv_partition)
    fail(ErrorKind::kInvalidArgument, "--kv-sink-tokens must be in [0, {}) (below --kv-partition), not {}",
         flags.kv_partition, flags.kv_sink_tokens);
  options.kv_sink_tokens = !int2 ? 0 : flags.kv_sink_tokens >= 0 ? flags.kv_sink_tokens : cuda ? 0 : 1;
  if (flags.kv_rounding == "stochastic" || (flags.kv_rounding == "auto" && cuda)) {
    options.kv_stochastic_rounding = true;
  } else if (flags.kv_rounding != "nearest" && flags.kv_rounding != "auto") {
    fail(ErrorKind::kInvalidArgument, "--kv-rounding must be auto, nearest or stochastic, not '{}'", flags.kv_rounding);
  }
  if (flags.kv_rounding != "auto" && !int2)
    fail(ErrorKind::kInvalidArgument, "--kv-rounding applies to --kv-cache-dtype int2");
  // The rotation spreads a key's outlier channels: a 2-bit partition's range, and fp8's per-token
  // scale, then fit every channel better. It needs a power-of-two head_dim.
  const bool power_of_two = (config.head_dim & (config.head_dim - 1)) == 0;
  if (flags.kv_rotation == "hadamard" ||
      (flags.kv_rotation == "auto" && options.kv_quant != KvQuant::kNone && power_of_two)) {
    options.kv_hadamard = true;
  } else if (flags.kv_rotation != "none" && flags.kv_rotation != "auto") {
    fail(ErrorKind::kInvalidArgument, "--kv-rotation must be auto, none or hadamard, not '{}'", flags.kv_rotation);
  }
  if (options.kv_hadamard && options.kv_quant == KvQuant::kNone)
    fail(ErrorKind::kInvalidArgument, "--kv-rotation hadamard applies to a quantized cache (--kv-cache-dtype int2 or fp8)");
  if (options.kv_hadamard && !power_of_two)
    fail(ErrorKind::kInvalidArgument, "--kv-rotation hadamard needs a power-of-two head_dim, not {}", config.head_dim);
  if (options.kv_quant == KvQuant::kInt2 && config.head_dim % flags.kv_partition != 0)
    fail(ErrorKind::kInvalidArgument,
         "--kv-cache-dtype int2: --kv-partition {} does not divide the model's head_dim {} (K is partitioned along "
         "head_dim)", flags.kv_partition, config.head_dim);
  if (backend.device() == Device::kCuda) {
    // The GPU kernels' shapes (backend/cuda/quantized_kv.h), refused before the weights load.
    if (options.kv_quant != KvQuant::kNone && config.head_dim != 64 && config.head_dim != 128)
      fail(ErrorKind::kUnsupported, "--kv-cache-dtype {}: the CUDA backend's {} kernels take head_dim 64 or 128, not {}",
           name, name, config.head_dim);
    if (options.kv_quant == KvQuant::kInt2 && flags.kv_partition != 64)
      fail(ErrorKind::kUnsupported, "--kv-cache-dtype int2: the CUDA backend's int2 kernels take --kv-partition 64, not {}",
           flags.kv_partition);
    if (int2 && (options.kv_key_quant != KvQuant::kInt2 || options.kv_sink_tokens != 0 || !options.kv_stochastic_rounding))
      fail(ErrorKind::kUnsupported,
           "--kv-cache-dtype int2: the CUDA backend's int2 kernels take int2 keys, stochastic rounding and no sink "
           "tokens (--kv-key-dtype int2 --kv-rounding stochastic --kv-sink-tokens 0, the defaults there)");
    if (options.kv_dtype && *options.kv_dtype != weight_dtype)
      fail(ErrorKind::kUnsupported, "--kv-cache-dtype {}: the CUDA backend keeps KV in its activation dtype, {}", name,
           dtype_name(weight_dtype));
  }
}

// The ranks' backends: on the CPU, each a share of the cores (--threads, or all of them, / N); on
// CUDA, rank r on GPU r.
std::unique_ptr<StepModel> load_tensor_parallel(const Checkpoint& checkpoint, const Backend& kind,
                                                const ModelFlags& flags, const LoadOptions& options) {
  std::vector<std::unique_ptr<Backend>> backends;
#if defined(PAGODA_HAVE_CUDA) && defined(PAGODA_HAVE_NCCL)
  if (kind.device() == Device::kCuda) {
    int present = 0;
    if (cudaGetDeviceCount(&present) != cudaSuccess) present = 0;
    if (flags.tensor_parallel > present)
      fail(ErrorKind::kInvalidArgument, "--tensor-parallel {}: one GPU per rank, and {} GPUs are present",
           flags.tensor_parallel, present);
    for (int r = 0; r < flags.tensor_parallel; ++r) {
      backends.push_back(std::make_unique<CudaBackend>(
          kind.activation_dtype(), CudaBackendOptions{.graphs = !flags.enforce_eager, .gpu = r}));
    }
    cuda::check_cuda(cudaSetDevice(0), "cudaSetDevice");  // this thread drives rank 0's backend
    return std::make_unique<TensorParallelModel>(checkpoint, std::move(backends), options);
  }
#endif
  if (kind.device() != Device::kCpu)
    fail(ErrorKind::kUnsupported, "--tensor-parallel {}: the {} backend has no tensor-parallel ranks in this build",
         flags.tensor_parallel, kind.name());
  const int threads = flags.threads > 0 ? flags.threads : omp_get_max_threads();
  for (int r = 0; r < flags.tensor_parallel; ++r)
    backends.push_back(std::make_unique<CpuBackend>(std::max(1, threads / flags.tensor_parallel)));
  return std::make_unique<TensorParallelModel>(checkpoint, std::move(backends), options);
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
  (void)dtype, (void)graphs;
  if (name == "cuda") fail(ErrorKind::kUnsupported, "--backend cuda: this pagoda was built without CUDA");
#endif
  return std::make_unique<CpuBackend>();
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
  if (flags.tensor_parallel != 1) check_tensor_parallel(checkpoint.config(), flags.tensor_parallel);
  owned_backend = make_backend(flags.backend, weight_dtype, !flags.enforce_eager);
  backend = owned_backend.get();
  // file keeps a GGUF file's quantized weights as they are where the backend multiplies them, so a
  // decode step reads the file's bytes, not their f16 expansion. auto does so on the CPU; on the
  // GPU its quantized matmuls do not yet beat f16 weights, which they match at one row and trail
  // above (docs/experiments/gpu-quantized-matmul.md).
  const bool keep_quantized =
      flags.weight_dtype == "file" || (flags.weight_dtype == "auto" && backend->device() == Device::kCpu);
  LoadOptions options{.weight_dtype = weight_dtype, .keep_quantized = keep_quantized, .attention = attention};
  parse_kv_cache_flags(flags, checkpoint.config(), *backend, weight_dtype, options);
  if (flags.tensor_parallel == 1) {
    model = std::make_unique<Model>(checkpoint, *backend, options);
  } else {
    model = load_tensor_parallel(checkpoint, *backend, flags, options);
    owned_backend.reset();  // it only named the kind of backend the ranks run
    backend = &static_cast<TensorParallelModel&>(*model).rank_backend(0);
  }
  engine_options = EngineOptions{.kv_memory_bytes = size_t(flags.kv_memory_mb) << 20,
                                 .max_batch = flags.max_batch,
                                 .max_step_tokens = flags.step_tokens};
  // An int2 block holds a whole number of V partitions.
  if (options.kv_quant == KvQuant::kInt2) engine_options.block_size = flags.kv_partition;
}

}  // namespace pagoda
