#!/usr/bin/env bash
# Builds and runs tests/gpu on a GPU machine that has nvcc but not Debian's dev packages (the
# lent device machines). Only GoogleTest and fmt are needed there; they travel as .debs:
#   here:   mkdir -p .gpu-deps && (cd .gpu-deps && apt-get download libgtest-dev libfmt-dev)
#           (.gpu-deps/ is git-ignored via .git/info/exclude; carry it to the device)
#   there:  bash scripts/device_gpu_tests.sh [OUT_DIR]
# Where the whole toolchain is installed, `make gpu-test` does the same through CMake.
set -euo pipefail
out=${1:-.}
deps=/tmp/pagoda-gpu-deps
mkdir -p "$deps"
for f in .gpu-deps/*.deb; do dpkg -x "$f" "$deps"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
# FMT_CONSTEVAL=: fmt 9's compile-time format checks trip newer host compilers under nvcc.
nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a -DFMT_HEADER_ONLY -DFMT_CONSTEVAL= \
  -Isrc -I"$deps/usr/include" \
  src/pagoda/backend/cuda/*.cu src/pagoda/backend/cuda/*.cpp src/pagoda/core/error.cpp tests/gpu/*_test.cpp \
  "$deps/usr/lib/x86_64-linux-gnu/libgtest_main.a" "$deps/usr/lib/x86_64-linux-gnu/libgtest.a" -lpthread \
  -o /tmp/pagoda_gpu_tests 2> >(grep -E "error" >&2 || true)
/tmp/pagoda_gpu_tests 2>&1 | tee "$out/gpu_tests.log"
