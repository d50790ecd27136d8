#!/usr/bin/env bash
# Quantized weights on a lent GPU machine (docs/experiments/gpu-quantized-matmul.md), in one call:
# build, the quantized-weight GPU tests, `pagoda bench quant-matmul`, and the engine on a random
# Llama-3-8B-shaped checkpoint quantized to q4_k against the same checkpoint in f16.
#   here:   bash scripts/fetch_device_deps.sh   (carry .device-deps)
#   there:  STEPS="build tests bench throughput" OUT=dir bash scripts/device_quantized.sh
# The SmolLM2 test (GpuQuantizedModel.*) needs the default model: PAGODA_MODEL=FILE (it travels in
# parts: see scripts/device_engine.sh); the tests step runs it when PAGODA_MODEL is set.
# Environment: STEPS [build tests bench throughput], OUT [./device-out], LAYERS (of the random
# checkpoint) [4], MODELS [/tmp/pagoda-models].
set -euo pipefail
cd "$(dirname "$0")/.."
steps=" ${STEPS:-build tests bench throughput} "
out=${OUT:-device-out}
layers=${LAYERS:-4}
models=${MODELS:-/tmp/pagoda-models}
mkdir -p "$out" "$models"
has() { [[ $steps == *" $1 "* ]]; }

if has build; then
  bash scripts/device_build.sh pagoda gpu_tests >"$out/build.log" 2>&1 || { tail -c 4000 "$out/build.log"; exit 1; }
fi
if has tests; then
  filter='*Quant*:BackendOps.*'
  [[ -n ${PAGODA_MODEL:-} ]] || filter+=':-GpuQuantizedModel.*'
  ./build/gpu_tests --gtest_filter="$filter" >"$out/tests.log" 2>&1 || true
  grep -E "FAIL|Failure|greedy tokens|parts from|\[  (PASSED|FAILED)" "$out/tests.log" | head -n 40 || true
fi
if has bench; then
  ./build/pagoda bench quant-matmul --out "$out/quantized-weights.json" >"$out/quantized-weights.md" 2>"$out/bench.err"
  cut -c1-170 "$out/quantized-weights.md"
fi
if has throughput; then
  ckpt=$models/llama3-8b-l$layers
  [[ -d $ckpt ]] || ./build/pagoda make-model --arch llama3-8b --layers "$layers" --out "$ckpt" >/dev/null
  [[ -f $ckpt-q4_k.gguf ]] || ./build/pagoda quantize "$ckpt" "$ckpt-q4_k.gguf" --type q4_k >/dev/null
  for batch in 1 64; do
    for dtype in file f16; do
      ./build/pagoda bench throughput -m "$ckpt-q4_k.gguf" --backend cuda --weight-dtype $dtype --max-batch $batch \
        --batch $batch --input 128 --output 128 --json "$out/throughput_q4_k_${dtype}_b$batch.json" \
        >"$out/throughput_q4_k_${dtype}_b$batch.txt" 2>&1 || true
      echo "== q4_k checkpoint, --weight-dtype $dtype, batch $batch"
      grep -iE "roofline|tok/s|decode" "$out/throughput_q4_k_${dtype}_b$batch.txt" | head -n 8 || true
    done
  done
fi
