#!/usr/bin/env bash
# The engine on a lent GPU machine, in one call: build, the GPU tests, and the engine benchmarks on
# random checkpoints of real shapes, with Hugging Face transformers as the peer in the same run.
# Results land in $OUT (default ./device-out): the JSON and the comparison, and every file (logs
# too) in device_engine.tgz, packed after each step (scripts/device_common.sh).
#   here:   bash scripts/fetch_device_deps.sh
#   there:  STEPS="build tests" bash scripts/device_engine.sh     (carry .device-deps)
# The trace steps replay bench/workloads/mooncake_synthetic_trace.jsonl, which is in the tree.
# The GPU tests of the whole model need the default model (SmolLM2, 98 MB), which no single call
# can carry (64 MiB): split it here (`split -n 3 -d FILE`, a part in each of .device-model/{a,b,c}),
# carry one part per call, `cat` them together there and export PAGODA_MODEL=that file.
# STEPS (in this order): build tests llama3 trace shared trace_modes llama2 hf
# Environment: MODELS (where checkpoints go) [/tmp/pagoda-models], OUTPUT (offline output tokens)
# [2048], HF_OUTPUT (output tokens of the transformers run) [256], TRACE_ARGS (the trace step's
# scaling) [--length-scale 0.0625 --time-scale 0.05 --max-input 8000]
set -euo pipefail
# shellcheck source=scripts/device_common.sh
source "$(dirname "$0")/device_common.sh"
device_init device_engine "build tests llama3 trace llama2 hf"
models=${MODELS:-/tmp/pagoda-models}
output=${OUTPUT:-2048}
hf_output=${HF_OUTPUT:-256}
trace=bench/workloads/mooncake_synthetic_trace.jsonl
mkdir -p "$models"
results=(gpu.txt "throughput_llama3-8b_o$output.json" trace_llama3-8b.json "throughput_llama2-7b_o$output.json"
  "throughput_llama2-7b_o$hf_output.json" "hf_llama2-7b_o$hf_output.json" compare_hf.md)
trap 'deliver "${results[@]}"' EXIT
gpu_info name,memory.total,driver_version
device=$(cut -d, -f1 "$out/gpu.txt" | head -n1)

if has build; then
  bash scripts/device_build.sh pagoda gpu_tests >"$out/build.log" 2>&1 || { grep -m5 -A5 error "$out/build.log"; tail -n 20 "$out/build.log"; exit 1; }
  tail -n 1 "$out/build.log"
  deliver "${results[@]}"
fi

if has tests; then
  ./build/gpu_tests --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/gpu_tests.log" 2>&1 || true
  grep -E "^  |\[  FAILED|Failure|PASSED|tests ran" "$out/gpu_tests.log" | head -n 60 || true
  deliver "${results[@]}"
fi

# A random checkpoint of an exact shape, written once per machine.
make_model() {  # arch
  [[ -f $models/$1/config.json ]] || ./build/pagoda make-model --arch "$1" --dtype fp16 --out "$models/$1" >/dev/null
}
# pagoda's offline run: batch 64, input 512, `output` tokens; all 64 sequences fit the KV cache.
offline() {  # arch output kv_mb
  ./build/pagoda bench throughput -m "$models/$1" --backend cuda --batch 64 --input 512 --output "$2" \
    --max-batch 64 --step-tokens 8192 --kv-memory-mb "$3" --json "$out/throughput_$1_o$2.json" \
    2>&1 | tail -n 25
}

if has llama3; then
  make_model llama3-8b
  offline llama3-8b "$output" 24000
  deliver "${results[@]}"
fi

if has trace; then
  make_model llama3-8b
  ./build/pagoda bench throughput -m "$models/llama3-8b" --backend cuda --trace "$trace" \
    ${TRACE_ARGS:---length-scale 0.0625 --time-scale 0.05 --max-input 8000} --max-batch 64 --step-tokens 8192 \
    --kv-memory-mb 60000 --json "$out/trace_llama3-8b.json" 2>&1 | tail -n 25
  deliver "${results[@]}"
fi

# Decode attention in the engine: 64 requests of 2560 prompt tokens, 256 output tokens each, whose
# prompts start with the same 2048 tokens (a system prompt: the prefix cache gives every sequence
# its blocks), under each --attention and under prefix with no CUDA graphs; then prompts that
# share nothing, where auto is paged.
if has shared; then
  make_model llama3-8b
  attention_run() {  # name, shared prefix tokens, flags...
    local name=$1 prefix=$2
    shift 2
    ./build/pagoda bench throughput -m "$models/llama3-8b" --backend cuda --batch 64 --input 2560 \
      --shared-prefix "$prefix" --output 256 --step-tokens 8192 "$@" --json "$out/$name.json" 2>&1 | tail -n 7
    deliver gpu.txt  # the JSON travels in the archive
  }
  attention_runs=(shared_paged shared_prefix shared_prefix_eager shared_auto private_paged private_prefix)
  attention_run shared_paged 2048 --attention paged
  attention_run shared_prefix 2048 --attention prefix
  attention_run shared_prefix_eager 2048 --attention prefix --enforce-eager
  attention_run shared_auto 2048 --attention auto
  attention_run private_paged 0 --attention paged
  attention_run private_prefix 0 --attention prefix
  runs=("${attention_runs[@]/#/$out/}")
  $python bench/compare_attention_modes.py "${runs[@]/%/.json}" --md "$out/attention_modes.md" || true
  deliver gpu.txt attention_modes.md
fi

# Decode attention in the engine under a real trace's prefix sharing: the whole Mooncake trace,
# prompts x 1/16 and outputs x 1/4 (so that decode steps, not prefills, are most of its time),
# under each --attention, one after another.
if has trace_modes; then
  make_model llama3-8b
  for attention in paged prefix auto; do
    ./build/pagoda bench throughput -m "$models/llama3-8b" --backend cuda --trace "$trace" \
      --time-scale 0.05 --length-scale 0.0625 --output-scale 0.25 --max-input 7300 --attention "$attention" \
      --max-batch 64 --step-tokens 8192 --kv-memory-mb 40000 --json "$out/trace_modes_$attention.json" 2>&1 |
      grep -E "TPOT|wall time|prefix-attention steps|step planning"
    deliver gpu.txt  # the JSON travels in the archive
  done
  $python bench/compare_attention_modes.py "$out"/trace_modes_{paged,prefix,auto}.json --md "$out/trace_modes.md" || true
  deliver gpu.txt trace_modes.md
fi

if has llama2; then
  make_model llama2-7b
  offline llama2-7b "$output" 90000
  [[ $hf_output == "$output" ]] || offline llama2-7b "$hf_output" 90000
  deliver "${results[@]}"
fi

if has hf; then
  make_model llama2-7b
  $python bench/hf_generate.py --model "$models/llama2-7b" --batch 64 --input 512 --output "$hf_output" \
    --json "$out/hf_llama2-7b_o$hf_output.json" 2>&1 | tail -n 8
  $python bench/compare_throughput.py --pagoda "$out/throughput_llama2-7b_o$hf_output.json" \
    --hf "$out/hf_llama2-7b_o$hf_output.json" --md "$out/compare_hf.md" 2>&1 | tail -n 8 || true
fi
echo "device_engine: done on $device"
