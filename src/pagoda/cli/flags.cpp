#include "pagoda/cli/flags.h"

#include "pagoda/core/error.h"

namespace pagoda::cli {

void add_model_flags(CLI::App& app, ModelFlags& flags) {
  app.add_option("-m,--model", flags.path, "GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct)");
  app.add_option("--backend", flags.backend, "cpu, cuda, or auto (default: cuda when a GPU is present)");
  app.add_option("--weight-dtype", flags.weight_dtype,
                 "weight storage: file (a GGUF file's q4_0/q4_1/q5_0/q5_1/q8_0/q4_k/q5_k/q6_k blocks as they are, "
                 "multiplied directly, on the CPU and the GPU), auto (default: file on the CPU; f16 on the GPU, or "
                 "bf16 for a bf16 checkpoint), f16, bf16 or f32; on the GPU f16/bf16 is also the activations' type");
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
                 "auto (default: hadamard under int2 and fp8 when head_dim is a power of two), none or hadamard");
  app.add_option("--kv-key-dtype", flags.kv_key_dtype,
                 "int2 KV: the keys' format, auto (default: fp8), int2 (the 2-bit format for K too) or fp8 (e4m3, "
                 "one scale per token)");
  app.add_option("--kv-sink-tokens", flags.kv_sink_tokens,
                 "int2 KV: a sequence's first tokens (attention sinks) also kept in f16 (default 1; below "
                 "--kv-partition)");
  app.add_option("--kv-rounding", flags.kv_rounding,
                 "int2 KV: how values round to codes, auto (default: nearest), nearest or stochastic (the paper's)");
  app.add_flag("--enforce-eager", flags.enforce_eager,
               "on the GPU, launch every op at every step instead of replaying decode steps as CUDA graphs");
  app.add_option("-t,--threads", flags.threads, "CPU threads (default: all cores)");
  app.add_option("--tensor-parallel", flags.tensor_parallel,
                 "split the model over N ranks, one thread each (Megatron-style; on the CPU each rank gets "
                 "threads / N cores; default 1)");
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

}  // namespace pagoda::cli
