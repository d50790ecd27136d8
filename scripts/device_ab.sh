#!/usr/bin/env bash
# A/B of kernel changes on a lent GPU machine, in one call: builds the tree as it is (A) and one
# variant per patch (the tree with the patch applied, each in its own copy), runs each variant's
# prefix GPU tests, then `pagoda bench prefix-attention` for A and every variant, interleaved,
# ROUNDS times, and prints each configuration's time as variant / A. Only figures from one call
# compare: they come from one machine.
#   here:   git diff > .device-data/mine.patch && git stash   (the tree sent must be A)
#   there:  bash scripts/device_ab.sh .device-data/mine.patch   (carry .device-deps, .device-data)
# Results land in $OUT (default ./device-out): ab.txt and gpu.txt, and everything (build and test
# logs, each bench's JSON and log) in device_ab.tgz, packed after each step so that a call cut off
# by its time limit still returns what it finished (scripts/device_out.sh). A fresh machine has no
# compiler cache: three builds side by side took 2-3 minutes on 16 cores.
# Environment:
#   TREES   ';'-separated batches [the bench's: the eight of shared/workloads/README.md]
#   HEADS   head configurations [the bench's: 32/32,16/8,32/8,64/8]
#   RUNS    timed runs per kernel and configuration [20]
#   ROUNDS  benches of each build [2]
#   KERNEL  whose times to compare: prefix, or decode (the issue-3 kernel the bench runs beside it)
#           [prefix]
#   TESTS   the variants' GPU tests to run, a gtest filter; empty: none (a measurement-only hack
#           that breaks other shapes) [*Prefix*]
#   GPU     run only on a card whose name holds this (e.g. H200: a call for an nvidia-h200 may be
#           served by an H100); on another card stop before any build, exit status 3 [any card]
set -uo pipefail
(($#)) || { echo "usage: bash scripts/device_ab.sh PATCH..." >&2; exit 2; }
patches=()
for patch in "$@"; do
  [[ -f $patch ]] || { echo "device_ab: no patch '$patch'" >&2; exit 2; }
  patches+=("$(realpath "$patch")")
done
rounds=${ROUNDS:-2}
runs=${RUNS:-20}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "device_ab: ROUNDS is a positive whole number, not '$rounds'" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "device_ab: RUNS is a positive whole number, not '$runs'" >&2; exit 2; }
kernel=${KERNEL:-prefix}
[[ $kernel == prefix || $kernel == decode ]] || { echo "device_ab: KERNEL is prefix or decode, not '$kernel'" >&2; exit 2; }
# shellcheck source=scripts/device_out.sh
source "$(dirname "$0")/device_out.sh"
device_out_init device_ab
trap 'deliver ab.txt gpu.txt' EXIT
cd "$(dirname "$0")/.." || exit 1
bench_args=()
[[ -n ${TREES:-} ]] && bench_args+=(--tree "$TREES")
[[ -n ${HEADS:-} ]] && bench_args+=(--heads "$HEADS")
jobs=$(($(nproc) / ($# + 1)))
((jobs > 0)) || jobs=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
card=$(head -n1 "$out/gpu.txt")
if [[ -n ${GPU:-} && $card != *"$GPU"* ]]; then
  echo "device_ab: the card is '$card', and GPU=$GPU asks for another: nothing run" >&2
  exit 3
fi

# Every variant's copy first, so that a patch that does not apply stops the call before any build.
repo=$PWD
names=()
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  [[ $name == A || " ${names[*]} " == *" $name "* ]] && { echo "device_ab: two variants named '$name'" >&2; exit 2; }
  names+=("$name")
  dir=/tmp/device_ab/$name
  rm -rf "$dir" && mkdir -p "$dir"
  tar --exclude=./build --exclude=./.git --exclude=./.device-deps --exclude=./.flashinfer-wheels \
    --exclude=./device-out -cf - . | (cd "$dir" && tar xf -)
  (cd "$dir" && git apply "$patch") || { echo "device_ab: $patch does not apply to this tree" >&2; exit 1; }
done
tests=${TESTS-*Prefix*}
targets=(pagoda)
[[ -n $tests ]] && targets+=(gpu_tests)
JOBS=$jobs bash scripts/device_build.sh pagoda > "$out/build_A.log" 2>&1 &
for name in "${names[@]}"; do
  (cd "/tmp/device_ab/$name" && JOBS=$jobs PAGODA_DEVICE_DEPS="$repo/.device-deps" \
    PAGODA_DEPS_PREFIX="/tmp/device_ab/deps-$name" bash scripts/device_build.sh "${targets[@]}" \
    > "$out/build_$name.log" 2>&1) &
done
wait
deliver gpu.txt
binary() { [[ $1 == A ]] && echo ./build/pagoda || echo "/tmp/device_ab/$1/build/pagoda"; }
for name in A "${names[@]}"; do
  [[ -x $(binary "$name") ]] || { echo "device_ab: the build of $name failed:" >&2; tail -n 20 "$out/build_$name.log" >&2; exit 1; }
done
for name in "${names[@]}"; do
  [[ -n $tests ]] || break
  "/tmp/device_ab/$name/build/gpu_tests" --gtest_brief=1 --gtest_filter="$tests" > "$out/tests_$name.log" 2>&1
  echo "tests $name: $(tail -n 1 "$out/tests_$name.log")"
done
deliver

for ((round = 1; round <= rounds; ++round)); do
  for name in A "${names[@]}"; do
    "$(binary "$name")" bench prefix-attention "${bench_args[@]}" --runs "$runs" \
      --out "$out/${name}_$round.json" > "$out/bench_${name}_$round.log" 2>&1 ||
      { echo "device_ab: the bench of $name failed:" >&2; tail -n 5 "$out/bench_${name}_$round.log" >&2; exit 1; }
  done
  echo "device_ab: round $round done"
  deliver
done

python3 - "$out" "$rounds" "$kernel" "${names[@]}" <<'PY' | tee "$out/ab.txt"
import json, math, sys
out, rounds, kernel, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def times(name, r):  # the launch-floor batch (1_16) is the bench's own reference, not a configuration
    configs = json.load(open(f"{out}/{name}_{r}.json"))["configs"]
    return {(c["tree"], c["q_heads"], c["kv_heads"]): c[kernel]["median_us"] for c in configs if c["tree"] != "1_16"}
print(f"{kernel} kernel, time / A")
total = {n: {} for n in ["A"] + names}
for n in total:
    for r in range(1, rounds + 1):
        for k, us in times(n, r).items():
            total[n][k] = total[n].get(k, 0.0) + us
a = total["A"]
print(f"{'tree':40s} {'heads':6s} {'A us':>8s} " + " ".join(f"{n[:12]:>12s}" for n in names))
for k in a:
    print(f"{k[0][:40]:40s} {k[1]}/{k[2]:<3d} {a[k] / rounds:8.1f} " + " ".join(f"{total[n][k] / a[k]:12.3f}" for n in names))
for n in names:
    ratios = [total[n][k] / a[k] for k in a]
    print(f"{n}: time / A geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}, range {min(ratios):.3f}-{max(ratios):.3f}")
PY
