#!/usr/bin/env bash
# Decode attention on a lent GPU machine, in one call: build, GPU tests, `pagoda bench attention`,
# FlashInfer on the same sweep, the comparison, the plot, and ncu's L2 hit rate of the per-head
# decode kernel (the L2-prefetch paper's structure). Results land in $OUT (default ./device-out):
# the JSON, the comparison, the plot and ncu's figures, and every file (logs too) in
# device_attention.tgz, packed after each step (scripts/device_common.sh).
#   here:   bash scripts/fetch_device_deps.sh   (and .flashinfer-wheels, see bench/flashinfer_decode.py)
#   there:  bash scripts/device_attention.sh     (carry .device-deps and .flashinfer-wheels)
# Environment:
#   BENCH_ARGS   sweep flags for both benchmarks, e.g. "--batches 256 --contexts 4096" [the full sweep]
#   PAGODA_ARGS  flags for `pagoda bench attention` only, e.g. "--variants tiled,tiled_prefetch"
#   STEPS        which steps to run [tests bench flashinfer ncu]
set -euo pipefail
# shellcheck source=scripts/device_common.sh
source "$(dirname "$0")/device_common.sh"
device_init device_attention "tests bench flashinfer ncu"
results=(gpu.txt attention.json attention.png flashinfer_attention.json compare_flashinfer.md ncu_paper_baseline.txt)
read -r -a bench_args <<<"${BENCH_ARGS:-}"
read -r -a pagoda_args <<<"${PAGODA_ARGS:-}"
gpu_info

# FlashInfer's kernels compile just-in-time (minutes): install and compile them while pagoda builds.
if has flashinfer; then
  (
    flashinfer_install click einops ninja nvidia-ml-py tabulate "packaging>=24.2" requests urllib3 idna \
      charset-normalizer certifi tqdm "typing-extensions>=4.13" &&
      $python bench/flashinfer_decode.py --compile-only "${bench_args[@]}" --out "$out/flashinfer_jit.json"
  ) >"$out/flashinfer_jit.log" 2>&1 &
  flashinfer_jit=$!
fi

# A failed build ends the script (pipefail); the JIT job must not outlive it.
trap '[[ -n ${flashinfer_jit:-} ]] && kill "$flashinfer_jit" 2>/dev/null; deliver "${results[@]}"' EXIT
bash scripts/device_build.sh pagoda gpu_tests 2>&1 | tee "$out/build.log" | tail -n 5

if has tests; then
  ./build/gpu_tests --gtest_brief=1 >"$out/gpu_tests.log" 2>&1 || true
  tail -n 3 "$out/gpu_tests.log"
  grep -E "^\[  FAILED|Failure|error" "$out/gpu_tests.log" | head -n 20 || true
  deliver "${results[@]}"
fi

# The benchmarks time the GPU alone: let the JIT's compilers finish first, so no busy CPU delays
# a launch.
if has flashinfer; then
  wait "$flashinfer_jit" || { echo "FlashInfer JIT failed:"; tail -n 20 "$out/flashinfer_jit.log"; }
fi

if has bench; then
  ./build/pagoda bench attention "${bench_args[@]}" "${pagoda_args[@]}" --out "$out/attention.json" >"$out/bench_attention.log" 2>&1 || true
  tail -n 60 "$out/bench_attention.log"
  deliver "${results[@]}"
fi

if has flashinfer; then
  $python bench/flashinfer_decode.py "${bench_args[@]}" --out "$out/flashinfer_attention.json" \
    >"$out/flashinfer.log" 2>&1 || true
  tail -n 5 "$out/flashinfer.log"
  $python bench/compare_attention.py "$out/attention.json" "$out/flashinfer_attention.json" \
    --md "$out/compare_flashinfer.md" 2>&1 | tail -n 12 || true
  deliver "${results[@]}"
fi

if has ncu; then
  # The L2-prefetch paper's measurement (its Table 3): the L2 hit rate of the per-head kernel
  # with and without prefetch at the Llama-2-7B shape, batch 64, context 4K.
  ncu --clock-control none -k regex:per_head_decode --metrics \
    lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,gpu__time_duration.sum,dram__bytes_read.sum \
    ./build/pagoda bench attention --batches 64 --contexts 4096 --heads 32/32 --runs 1 --warmup 0 \
    --variants baseline,baseline_prefetch --out "$out/ncu_bench.json" >"$out/ncu_paper_baseline.txt" 2>&1 || true
  grep -E "per_head_decode|hit_rate|duration|dram__bytes" "$out/ncu_paper_baseline.txt" | head -n 20 || true
fi

$python bench/plot_attention.py "$out/attention.json" 2>&1 | tail -n 2 || true
