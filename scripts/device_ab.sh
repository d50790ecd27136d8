#!/usr/bin/env bash
# A/B of kernel variants on a lent GPU machine, in one call. A variant is a commit: its diff
# against its parent, applied to the tree as it is (A). The script builds A and one copy of the
# tree per variant side by side, runs each variant's prefix GPU tests, then `pagoda bench
# prefix-attention` for A and every variant, interleaved, ROUNDS times, and prints each
# configuration's time as variant / A. Only figures from one call compare: they come from one
# machine. The experiments kept in history (docs/experiments/*.md) are such commits.
#
# The device's copy of the working tree may have no .git, so the diffs travel as files:
#   here:   bash scripts/device_ab.sh --export COMMIT...   (writes .device-ab/COMMIT.patch, git-ignored)
#   there:  bash scripts/device_ab.sh COMMIT...            (carry .device-deps and .device-ab)
# Where the repository is at hand, COMMIT's diff is taken from git and --export is not needed.
# COMMIT is a commit id or branch name (letters, digits, '.', '_', '-'); it names the variant.
#
# Results land in $OUT (default ./device-out): ab.txt and gpu.txt, and everything (build and test
# logs, each bench's JSON and log) in device_ab.tgz, packed after each step so that a call cut off
# by its time limit still returns what it finished (scripts/device_common.sh). A fresh machine
# has no compiler cache: three builds side by side take 2-3 minutes on 16 cores.
# Environment:
#   TREES   ';'-separated batches [the bench's: the eight listed trees of bench/workloads/README.md]
#   HEADS   head configurations [the bench's: 32/32,16/8,32/8,64/8]
#   RUNS    timed runs per kernel and configuration [20]
#   ROUNDS  benches of each build [2]
#   KERNEL  whose times to compare: prefix, or decode (the paged decode kernel the bench runs
#           beside it) [prefix]
#   TESTS   the variants' GPU tests to run, a gtest filter; empty: none (a measurement-only
#           variant that computes wrong outputs) [*Prefix*]
#   GPU     run only on a card whose name holds this (e.g. H200: a call for an nvidia-h200 may be
#           served by an H100); on another card stop before any build, exit status 3 [any card]
set -uo pipefail
usage="usage: bash scripts/device_ab.sh [--export] COMMIT..."
export_only=0
[[ ${1:-} == --export ]] && { export_only=1; shift; }
(($#)) || { echo "$usage" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
has_git=0
git -C "$root" rev-parse --git-dir >/dev/null 2>&1 && has_git=1

# The variants' diffs, each checked before anything is built: $diffs/NAME.patch.
diffs=$(mktemp -d /tmp/device_ab_diffs.XXXXXX)
trap 'rm -rf "$diffs"' EXIT
names=()
for commit in "$@"; do
  [[ $commit =~ ^[A-Za-z0-9._-]+$ ]] || { echo "device_ab: '$commit' is not a commit id or branch name" >&2; exit 2; }
  [[ $commit == A || " ${names[*]} " == *" $commit "* ]] && { echo "device_ab: two variants named '$commit'" >&2; exit 2; }
  names+=("$commit")
  if ((has_git)) && git -C "$root" rev-parse --verify --quiet "$commit^{commit}" >/dev/null; then
    git -C "$root" diff --binary "$commit^" "$commit" > "$diffs/$commit.patch" ||
      { echo "device_ab: no diff for $commit (a root commit?)" >&2; exit 2; }
  elif ((!export_only)) && [[ -f $root/.device-ab/$commit.patch ]]; then
    cp "$root/.device-ab/$commit.patch" "$diffs/$commit.patch"
  else
    echo "device_ab: no commit '$commit' here and no .device-ab/$commit.patch" \
      "(run 'bash scripts/device_ab.sh --export $commit' in the repository and carry .device-ab)" >&2
    exit 2
  fi
  [[ -s $diffs/$commit.patch ]] || { echo "device_ab: $commit changes nothing" >&2; exit 2; }
done
if ((export_only)); then
  mkdir -p "$root/.device-ab"
  for name in "${names[@]}"; do cp "$diffs/$name.patch" "$root/.device-ab/" && echo "$root/.device-ab/$name.patch"; done
  exit 0
fi

rounds=${ROUNDS:-2}
runs=${RUNS:-20}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "device_ab: ROUNDS is a positive whole number, not '$rounds'" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "device_ab: RUNS is a positive whole number, not '$runs'" >&2; exit 2; }
kernel=${KERNEL:-prefix}
[[ $kernel == prefix || $kernel == decode ]] || { echo "device_ab: KERNEL is prefix or decode, not '$kernel'" >&2; exit 2; }
# shellcheck source=scripts/device_common.sh
source "$root/scripts/device_common.sh"
device_init device_ab
trap 'deliver ab.txt gpu.txt; rm -rf "$diffs"' EXIT
bench_args=()
[[ -n ${TREES:-} ]] && bench_args+=(--tree "$TREES")
[[ -n ${HEADS:-} ]] && bench_args+=(--heads "$HEADS")
jobs=$(($(nproc) / ($# + 1)))
((jobs > 0)) || jobs=1
gpu_info name
card=$(head -n1 "$out/gpu.txt")
if [[ -n ${GPU:-} && $card != *"$GPU"* ]]; then
  echo "device_ab: the card is '$card', and GPU=$GPU asks for another: nothing run" >&2
  exit 3
fi

# Every variant's copy first, so that a diff that does not apply stops the call before any build.
for name in "${names[@]}"; do
  dir=/tmp/device_ab/$name
  rm -rf "$dir" && mkdir -p "$dir"
  tar --exclude=./build --exclude=./.git --exclude=./.device-deps --exclude=./.flashinfer-wheels \
    --exclude=./.device-ab --exclude=./device-out -cf - . | (cd "$dir" && tar xf -)
  (cd "$dir" && git apply "$diffs/$name.patch") || { echo "device_ab: $name does not apply to this tree" >&2; exit 1; }
done
tests=${TESTS-*Prefix*}
targets=(pagoda)
[[ -n $tests ]] && targets+=(gpu_tests)
JOBS=$jobs bash scripts/device_build.sh pagoda > "$out/build_A.log" 2>&1 &
for name in "${names[@]}"; do
  (cd "/tmp/device_ab/$name" && JOBS=$jobs PAGODA_DEVICE_DEPS="$root/.device-deps" \
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
