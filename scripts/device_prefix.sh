#!/usr/bin/env bash
# Prefix-aware decode attention on a lent GPU machine, in one call: build, the prefix-attention
# GPU tests (and the decode and merge tests beside them), `pagoda bench prefix-attention`,
# FlashInfer's decode and cascade wrappers on the same batches. Results land in $OUT (default
# ./device-out): prefix_attention.json, flashinfer_prefix.json, and every file (logs, ncu
# reports) in device_prefix.tgz, packed after each step (scripts/device_common.sh).
#   here:   bash scripts/fetch_device_deps.sh   (and .flashinfer-wheels, see bench/flashinfer_decode.py)
#   there:  bash scripts/device_prefix.sh        (carry .device-deps and .flashinfer-wheels)
#   then:   bench/compare_prefix.py joins the JSONs with bench/workloads/pat_reference.md
# Environment:
#   TREES        ';'-separated batches for both benchmarks, as the bench's --tree takes them [listed: the
#                eight of bench/workloads/README.md]; `pat`: the twenty trees of the PAT artifact's
#                kernel benchmark (benchmark/run_kernel_bench.sh of github.com/flashserve/PAT)
#   HEADS        head configurations [32/32,16/8,32/8,64/8]
#   STEPS        which steps to run [tests bench flashinfer]; `ncu` adds Nsight Compute's full set
#                and the L2's busiest-unit breakdown for the prefix kernel and the paged decode
#                kernel on each of NCU_CONFIGS, each kernel alone: in the archive, ncu_*.txt
#                (details), ncu_*.raw.csv.gz (every metric), ncu_*.sass.csv.gz (per-instruction
#                stall samples) and ncu_*.stalls.txt (those samples by warp role:
#                bench/ncu_stalls.py); the reports themselves stay in /tmp there (a few of them
#                pass the tool's 16 MiB a file)
#   NCU_CONFIGS  ';'-separated "TREE HEADS" pairs for the ncu step [256_4096 32/8]
#   GTEST_FILTER the GPU tests to run [*Prefix*:*Merge*:GpuDecode*]
set -euo pipefail
# shellcheck source=scripts/device_common.sh
source "$(dirname "$0")/device_common.sh"
device_init device_prefix "tests bench flashinfer"
heads=${HEADS:-32/32,16/8,32/8,64/8}
gpu_info

# FlashInfer's kernels compile just-in-time (minutes): install and compile them while pagoda builds.
if has flashinfer; then
  (
    flashinfer_install &&
      $python bench/flashinfer_prefix.py --compile-only --heads "$heads" --jit-cache /tmp/flashinfer-jit \
        --out /tmp/flashinfer_jit.json
  ) >"$out/flashinfer_jit.log" 2>&1 &
  flashinfer_jit=$!
fi
results=(prefix_attention.json flashinfer_prefix.json)
trap 'if [[ -n ${flashinfer_jit:-} ]]; then kill "$flashinfer_jit" 2>/dev/null || true; fi; deliver "${results[@]}"' EXIT
bash scripts/device_build.sh pagoda gpu_tests 2>&1 | tee "$out/build.log" | tail -n 3
trees=$(./build/pagoda bench prefix-attention --tree "${TREES:-listed}" --list-trees)

if has tests; then
  ./build/gpu_tests --gtest_brief=1 --gtest_filter="${GTEST_FILTER:-*Prefix*:*Merge*:GpuDecode*}" \
    >"$out/gpu_tests.log" 2>&1 || true
  tail -n 3 "$out/gpu_tests.log"
  grep -E "^\[  FAILED|Failure|error|Expected|Which is|worst" "$out/gpu_tests.log" | head -n 30 || true
  deliver
fi

# The benchmarks time the GPU alone: let the JIT's compilers finish first.
if has flashinfer; then
  wait "$flashinfer_jit" || { echo "FlashInfer JIT failed:"; tail -n 20 "$out/flashinfer_jit.log"; }
fi
if has bench; then
  ./build/pagoda bench prefix-attention --tree "$trees" --heads "$heads" --out "$out/prefix_attention.json" \
    >"$out/bench_prefix.log" 2>&1 || true
  tail -n 40 "$out/bench_prefix.log"
  deliver "${results[@]}"
fi
if has flashinfer; then
  $python bench/flashinfer_prefix.py --trees "$trees" --heads "$heads" --jit-cache /tmp/flashinfer-jit \
    --out "$out/flashinfer_prefix.json" >"$out/flashinfer_prefix.log" 2>&1 || true
  tail -n 40 "$out/flashinfer_prefix.log"
  deliver "${results[@]}"
fi
if has ncu; then
  # Where the time goes on a device: DRAM and L2 throughput, the L2's breakdown by unit and
  # source, the warps' stalls. One timed run of each kernel after no warm-up (the bench's
  # launch-floor batch, 1_16, is profiled too); --clock-control none leaves the clocks as the
  # bench runs them.
  IFS=';' read -r -a ncu_configs <<<"${NCU_CONFIGS:-256_4096 32/8}"
  for config in "${ncu_configs[@]}"; do
    read -r tree config_heads <<<"$config"
    [[ -n $config_heads ]] || { echo "NCU_CONFIGS: '$config' is not \"TREE HEADS\" (e.g. \"256_4096 32/8\")"; continue; }
    name=ncu_${tree//,/-}_${config_heads//\//-}
    ncu --clock-control none --set full --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed \
      -k regex:'prefix_tiled|decode_tiled' -f -o "/tmp/$name" \
      ./build/pagoda bench prefix-attention --tree "$tree" --heads "$config_heads" --runs 1 --warmup 0 \
      --out "/tmp/$name.json" >"$out/$name.log" 2>&1 || { echo "ncu failed on $config:"; tail -n 5 "$out/$name.log"; }
    ncu -i "/tmp/$name.ncu-rep" --page details >"$out/$name.txt" 2>&1 || true
    ncu -i "/tmp/$name.ncu-rep" --page raw --csv 2>&1 | gzip >"$out/$name.raw.csv.gz" || true
    ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/$name.sass.csv.gz" || true
    python3 bench/ncu_stalls.py "$out/$name.sass.csv.gz" >"$out/$name.stalls.txt" 2>&1 || true
    grep -E "kernel<|Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput" "$out/$name.txt" | head -n 24 || true
    deliver "${results[@]}"
  done
fi
