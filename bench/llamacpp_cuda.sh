#!/usr/bin/env bash
# Side-by-side GPU benchmark: llama.cpp's CUDA build (llama-bench, llama-batched-bench) and pagoda
# (bench throughput) on the same GGUF files, decode tokens/s at batch 1, 8 and 64, in one run.
#
# llama.cpp comes from the llama-cpp-python sdist on PyPI (its source sits under vendor/llama.cpp).
# A lent GPU machine has no network, so the source is fetched and pruned here and travels in
# build-llamacpp-cuda/ (git-ignored; name the folder holding it in the run tool's carry list):
#
#   here:   bash bench/llamacpp_cuda.sh fetch
#   device: bash bench/llamacpp_cuda.sh build            # CUDA, sm_90a, llama-bench + llama-batched-bench
#           bash bench/llamacpp_cuda.sh run --model A.gguf [--model B.gguf] [--batches 1,8,64]
#                [--input 512] [--output 128] [--pagoda ./build/pagoda] [--out DIR]
#
# run reports per model and batch: llama-batched-bench's decode speed (S_TG: pl x tg tokens over
# the generation phase after a --input token prompt), llama-bench's batch-1 decode at depth 0 and
# at depth --input, and pagoda's decode speed (bench throughput: batch / mean decode-only step)
# with its bytes roofline. pagoda dequantizes quantized GGUF weights to f16 on the GPU unless
# built with quantized GPU weights, so on a Q8_0 / Q4_K file it reads 2-4x more bytes per step
# than llama.cpp; the JSON records pagoda's weight dtype and bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=build-llamacpp-cuda
TARBALL="$DIR/llama.cpp-src.tar.xz"
BIN="$DIR/build/bin"
die() { echo "llamacpp_cuda.sh: $*" >&2; exit 1; }

fetch() {
  mkdir -p "$DIR/sdist"
  compgen -G "$DIR/sdist/llama_cpp_python-*.tar.gz" >/dev/null ||
    python3 -m pip download --no-deps --no-binary :all: llama-cpp-python -d "$DIR/sdist"
  local tmp
  tmp=$(mktemp -d)
  tar xzf "$DIR"/sdist/llama_cpp_python-*.tar.gz -C "$tmp" --strip-components=1
  # Only what the CUDA build of the two tools compiles: no models, docs, tests, examples, other
  # backends or web UI (176 MB of source -> ~7 MB compressed).
  local skip=(models docs benches tests examples media .git .github tools/server/public
              ggml/src/ggml-vulkan ggml/src/ggml-sycl ggml/src/ggml-metal ggml/src/ggml-opencl
              ggml/src/ggml-cann ggml/src/ggml-musa ggml/src/ggml-webgpu ggml/src/ggml-hexagon ggml/src/ggml-zdnn)
  tar cJf "$TARBALL" -C "$tmp/vendor" "${skip[@]/#/--exclude=llama.cpp/}" llama.cpp
  rm -rf "$tmp"
  echo "llamacpp_cuda.sh: $TARBALL ($(du -h "$TARBALL" | cut -f1)), from $(ls "$DIR"/sdist)"
}

build() {
  [[ -f $TARBALL ]] || die "no $TARBALL: run 'bash bench/llamacpp_cuda.sh fetch' where there is network, and carry $DIR"
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [[ -x $nvcc ]] || die "nvcc not found"
  rm -rf "$DIR/src" && mkdir -p "$DIR/src"
  tar xJf "$TARBALL" -C "$DIR/src" --strip-components=1
  local start=$SECONDS
  # FlashAttention kernels for f16 KV only (GGML_CUDA_FA_ALL_QUANTS off), Hopper only, no
  # examples, tests or server: what llama-bench and llama-batched-bench need.
  cmake -S "$DIR/src" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON \
    -DGGML_CUDA_NCCL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >"$DIR/configure.log"
  cmake --build "$DIR/build" -j "$(nproc)" --target llama-bench llama-batched-bench >"$DIR/build.log"
  echo "llamacpp_cuda.sh: built llama-bench and llama-batched-bench in $((SECONDS - start)) s on $(nproc) cores"
}

run() {
  local models=() batches=1,8,64 input=512 output=128 pagoda=./build/pagoda out=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --model) models+=("$2"); shift 2 ;;
      --batches) batches="$2"; shift 2 ;;
      --input) input="$2"; shift 2 ;;
      --output) output="$2"; shift 2 ;;
      --pagoda) pagoda="$2"; shift 2 ;;
      --out) out="$2"; shift 2 ;;
      *) die "unknown argument $1" ;;
    esac
  done
  ((${#models[@]})) || die "run needs --model FILE.gguf (repeatable)"
  [[ -x $BIN/llama-bench && -x $BIN/llama-batched-bench ]] || die "no llama.cpp build in $BIN: run 'build' first"
  [[ -x $pagoda ]] || die "no pagoda at $pagoda"
  out=${out:-bench/results/llamacpp-cuda-$(date -u +%Y%m%d-%H%M)}
  mkdir -p "$out"
  local raw max_batch
  raw=$(mktemp -d)
  max_batch=$(tr ',' '\n' <<<"$batches" | sort -n | tail -n1)
  local i=0
  for model in "${models[@]}"; do
    [[ -f $model ]] || die "no model $model"
    # Alternated per model so that both run on the same warm GPU.
    "$BIN/llama-bench" -m "$model" -ngl 99 -fa on -p 0 -n "$output" -d "0,$input" -r 3 -o json >"$raw/bench_$i.json"
    "$BIN/llama-batched-bench" -m "$model" -ngl 99 -fa on -c $((max_batch * (input + output) + 256)) -b 2048 -ub 512 \
      -npp "$input" -ntg "$output" -npl "$batches" --output-format jsonl >"$raw/batched_$i.txt" 2>"$raw/batched_$i.log"
    for b in ${batches//,/ }; do
      "$pagoda" bench throughput -m "$model" --batch "$b" --input "$input" --output "$output" \
        --json "$raw/pagoda_${i}_$b.json" >"$raw/pagoda_${i}_$b.txt" 2>&1
    done
    i=$((i + 1))
  done
  python3 - "$out" "$raw" "$batches" "$input" "$output" "${models[@]}" <<'PY'
import json, pathlib, subprocess, sys
out, raw = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
batches = [int(b) for b in sys.argv[3].split(",")]
input_tokens, output_tokens, models = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
rows, lines = [], []
lines.append(f"| model | batch | llama.cpp decode tok/s | pagoda decode tok/s | pagoda / llama.cpp | pagoda weights | "
             f"pagoda step of roofline |")
lines.append("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
for i, model in enumerate(models):
    bench = json.loads((raw / f"bench_{i}.json").read_text())
    tg = {e.get("n_depth", 0): e["avg_ts"] for e in bench if e["n_gen"] > 0}
    batched = [json.loads(l) for l in (raw / f"batched_{i}.txt").read_text().splitlines() if l.startswith("{")]
    for b in batches:
        ll = next((e["speed_tg"] for e in batched if e["pl"] == b), None)
        pg = json.loads((raw / f"pagoda_{i}_{b}.json").read_text())
        roof = pg["roofline"]
        pagoda_tps = roof["mean_batch"] / (roof["mean_step_ms"] / 1e3) if roof["mean_step_ms"] else None
        row = {"model": model, "batch": b, "llamacpp_decode_tok_s": ll, "pagoda_decode_tok_s": pagoda_tps,
               "pagoda_output_tok_s": pg["figures"]["output_tok_s"], "pagoda_weight_dtype": pg["weight_dtype"],
               "pagoda_weight_bytes": pg["weight_bytes"], "pagoda_fraction_of_roofline": roof["fraction_of_bound"],
               "llamacpp_bench_tg_depth0_tok_s": tg.get(0), f"llamacpp_bench_tg_depth{input_tokens}_tok_s": tg.get(input_tokens)}
        rows.append(row)
        ratio = f"{pagoda_tps / ll:.2f}x" if ll and pagoda_tps else "-"
        lines.append(f"| {pathlib.Path(model).name} | {b} | {ll or 0:.1f} | {pagoda_tps or 0:.1f} | {ratio} | "
                     f"{pg['weight_dtype']}, {pg['weight_bytes'] / 1e9:.2f} GB | {100 * roof['fraction_of_bound']:.1f}% |")
    lines.append(f"| {pathlib.Path(model).name} | llama-bench tg{output_tokens} | depth 0: {tg.get(0, 0):.1f}, "
                 f"depth {input_tokens}: {tg.get(input_tokens, 0):.1f} | | | | |")
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
except FileNotFoundError:
    gpu = "no nvidia-smi"
lines.append("")
lines.append(f"{gpu}; {input_tokens} prompt tokens, {output_tokens} generated per sequence; llama.cpp "
             f"{bench[0].get('build_commit', '?')} (-ngl 99, flash attention on), pagoda {commit}. llama.cpp's figure is "
             f"llama-batched-bench's S_TG, pagoda's batch / mean decode-only step of bench throughput.")
result = {"benchmark": "llamacpp_cuda", "gpu": gpu, "commit": commit, "llama_cpp": bench[0].get("build_commit", "?"),
          "input_tokens": input_tokens, "output_tokens": output_tokens, "rows": rows,
          "bound": "pagoda's roofline: (weight bytes + KV bytes) per decode-only step / streaming-read bandwidth, "
                   "measured by bench throughput in the same run"}
(out / "llamacpp_cuda.json").write_text(json.dumps(result, indent=1) + "\n")
(out / "llamacpp_cuda.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
  rm -rf "$raw"
}

case "${1:-}" in
  fetch) fetch ;;
  build) build ;;
  run) shift; run "$@" ;;
  *) die "usage: bash bench/llamacpp_cuda.sh fetch | build | run --model FILE.gguf [...]" ;;
esac
