#!/usr/bin/env bash
# Tensor parallelism on a lent machine with several GPUs (kinds nvidia-h200-x2/-x4/-x8): the GPU
# tests at N = 2 and every GPU, `pagoda bench allreduce` at N = 2, 4, 8, and `pagoda bench
# throughput --tensor-parallel N` on random checkpoints of Llama-3-8B and Llama-3-70B shapes.
# docs/tensor-parallel-runs.md says what each step must show, and in which calls to run it.
# Results land in $OUT (default ./device-out), every file in device_tensor_parallel.tgz.
#   here:   bash scripts/fetch_device_deps.sh
#   there:  STEPS="build tests allreduce" bash scripts/device_tensor_parallel.sh   (carry .device-deps)
# STEPS (in this order): build tests allreduce tp8b tp70b
# Environment: MODELS (where checkpoints go) [/tmp/pagoda-models], OUTPUT8B (output tokens of the
# 8B runs) [2048], LAYERS70 (layers of the 70B checkpoint: 80 is the whole model, 140 GB; fewer
# give per-layer figures, and up to 40 let N = 1 run too) [20], OUTPUT70 [512], BATCH70 [64]
set -euo pipefail
# shellcheck source=scripts/device_common.sh
source "$(dirname "$0")/device_common.sh"
device_init device_tensor_parallel "build tests allreduce tp8b tp70b"
export NCCL_NVLS_ENABLE=0  # no NVLink multicast, in everything started here (pagoda also sets it)
models=${MODELS:-/tmp/pagoda-models}
output8b=${OUTPUT8B:-2048}
layers70=${LAYERS70:-20}
output70=${OUTPUT70:-512}
batch70=${BATCH70:-64}
mkdir -p "$models"
results=(gpu.txt tp_tests.txt allreduce.md throughput_tp.md)
trap 'deliver "${results[@]}"' EXIT
gpu_info name,memory.total,driver_version
gpus=$(wc -l <"$out/gpu.txt")
ranks_up_to() { local n; for n in "$@"; do ((n <= gpus)) && echo "$n"; done; }

if has build; then
  bash scripts/device_build.sh pagoda gpu_tests >"$out/build.log" 2>&1 || { grep -m5 -A5 error "$out/build.log"; tail -n 20 "$out/build.log"; exit 1; }
  tail -n 1 "$out/build.log"
  deliver "${results[@]}"
fi

# The sharded model against the unsplit one (greedy logits), the collectives against host sums,
# and the fault paths (a rank that never joins or stalls), at N = 2 and at every GPU.
if has tests; then
  filter='GpuTensorParallel.*:Collectives.*:MultiGpu.*:GpuClique.*'
  for visible in 0,1 all; do
    if [[ $visible == all ]]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=$visible; fi
    echo "== GPUs: $visible" >>"$out/tp_tests.txt"
    ./build/gpu_tests --gtest_filter="$filter" >"$out/tp_tests_$visible.log" 2>&1 || true
    grep -E "ranks, chunks|\[  FAILED|Failure|PASSED|SKIPPED|tests ran" "$out/tp_tests_$visible.log" >>"$out/tp_tests.txt" || true
  done
  unset CUDA_VISIBLE_DEVICES
  cat "$out/tp_tests.txt"
  deliver "${results[@]}"
fi

if has allreduce; then
  : >"$out/allreduce.md"
  for n in $(ranks_up_to 2 4 8); do
    ./build/pagoda bench allreduce --ranks "$n" --sizes 8K,16K,32K,64K,128K,256K,512K,1M,2M \
      --out "$out/allreduce_tp$n.json" | tee -a "$out/allreduce.md"
  done
  deliver "${results[@]}"
fi

make_model() {  # arch [layers]
  local dir=$models/$1${2:+-l$2}
  [[ -f $dir/config.json ]] || ./build/pagoda make-model --arch "$1" ${2:+--layers "$2"} --dtype fp16 --out "$dir" >/dev/null
  echo "$dir"
}
# tokens/s of a throughput JSON, for the next runs' --baseline-tokens-per-s
tokens_per_s() { $python -c 'import json,sys; print(json.load(open(sys.argv[1]))["figures"]["output_tok_s"])' "$1"; }
summary() {  # json: one markdown row
  $python - "$1" >>"$out/throughput_tp.md" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
f, r, tp = j["figures"], j["roofline"], j["tensor_parallel"] or {}
p = tp.get("per_rank_roofline") or {}
cell = lambda v, fmt: "-" if v is None else fmt.format(v)
print(f'| {j["model_shape"]["layers"]} x {j["model_shape"]["hidden"]} | {tp.get("ranks", 1)} | {f["output_tok_s"]:.0f} | '
      f'{cell(tp.get("speedup"), "{:.2f}x")} | {cell(tp.get("per_rank_efficiency"), "{:.1%}")} | '
      f'{r["mean_step_ms"]:.3f} | {cell(p.get("bound_step_ms", r["bound_step_ms"]), "{:.3f}")} | '
      f'{cell(p.get("all_reduce_us"), "{:.1f}")} | {cell(p.get("fraction_of_bound", r["fraction_of_bound"]), "{:.1%}")} |')
EOF
}
header() {
  printf '\n%s\n\n| layers x hidden | N | output tok/s | speed-up | per-GPU efficiency | step ms | bound ms | all-reduce us | of the bound |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n' "$1" >>"$out/throughput_tp.md"
}

# Llama-3-8B shapes, batch 128, 512 -> 2048 (targets: TP2 >= 1.7x, TP4 >= 3.0x TP1). TP1 runs
# first; the split runs take its tokens/s as their baseline instead of re-running it.
if has tp8b; then
  dir=$(make_model llama3-8b)
  header "Llama-3-8B shapes, batch 128, 512 -> $output8b"
  base=""
  for n in $(ranks_up_to 1 2 4); do
    json=$out/throughput_llama3-8b_tp$n.json
    extra=()
    ((n > 1)) && extra=(--tensor-parallel "$n" --baseline-tokens-per-s "$base")
    ./build/pagoda bench throughput -m "$dir" --backend cuda --batch 128 --input 512 --output "$output8b" \
      --step-tokens 8192 "${extra[@]}" --json "$json" 2>&1 | tail -n 8
    ((n == 1)) && base=$(tokens_per_s "$json")
    summary "$json"
    deliver "${results[@]}"
  done
fi

# Llama-3-70B shapes at TP4 and TP8 (target: decode steps >= 80% of the per-GPU roofline with the
# all-reduce floor). At up to 40 layers N = 1 fits one H200 and is the baseline; beyond, none.
if has tp70b; then
  dir=$(make_model llama3-70b "$layers70")
  header "Llama-3-70B shapes ($layers70 of 80 layers), batch $batch70, 512 -> $output70"
  base=""
  sizes=(4 8)
  ((layers70 <= 40)) && sizes=(1 4 8)
  for n in $(ranks_up_to "${sizes[@]}"); do
    json=$out/throughput_llama3-70b-l${layers70}_tp$n.json
    extra=()
    if ((n > 1)); then
      extra=(--tensor-parallel "$n")
      if [[ -n $base ]]; then extra+=(--baseline-tokens-per-s "$base"); else extra+=(--no-baseline); fi
    fi
    ./build/pagoda bench throughput -m "$dir" --backend cuda --batch "$batch70" --input 512 --output "$output70" \
      --step-tokens 8192 "${extra[@]}" --json "$json" 2>&1 | tail -n 8
    ((n == 1)) && base=$(tokens_per_s "$json")
    summary "$json"
    deliver "${results[@]}"
  done
fi
cat "$out/throughput_tp.md" 2>/dev/null || true
