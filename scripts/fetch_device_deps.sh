#!/usr/bin/env bash
# Downloads, on this Debian 12 machine, the .debs that the full CMake build (pagoda, gpu_tests,
# every test binary) needs on the lent GPU machines. Those have nvcc, CMake, ninja and g++ but
# not Debian's dev packages, and cannot download anything; the .debs travel with the working
# tree in .device-deps/ (git-ignored) and scripts/device_build.sh unpacks them there.
#   here:   bash scripts/fetch_device_deps.sh
#   there:  bash scripts/device_build.sh pagoda gpu_tests && ./build/gpu_tests
# Idempotent: a package whose .deb is already in .device-deps/ is not downloaded again.
set -euo pipefail

cd "$(dirname "$0")/.."
dest=${PAGODA_DEVICE_DEPS:-.device-deps}

# Every package the CMake configure and link need, with the runtime libraries they pull in.
# Left out on purpose: libc6, libstdc++6, libgcc-s1, libgomp1 (the device's own, newer ones
# must be used: an older copy on the RPATH would shadow them).
packages=(
  # BLAS: Debian's openblas .pc and libopenblas.so live under openblas-pthread/.
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0
  # tokenizer regexes
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  # header-only
  nlohmann-json3-dev libcli11-dev
  # logging (Debian's spdlog is built against the shared fmt 9)
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  # HMAC-SHA256 for disaggregated serving's peer key
  libssl-dev libssl3
  # tests (GTestConfig.cmake imports the gmock targets too, so both are needed)
  libgtest-dev libgmock-dev
  # pkg-config, in case the device has none
  pkgconf pkgconf-bin libpkgconf3
)

mkdir -p "$dest"
missing=()
for p in "${packages[@]}"; do
  compgen -G "$dest/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fetch_device_deps: downloading ${missing[*]}"
  (cd "$dest" && apt-get download -q "${missing[@]}")
fi

# Every package must be there now (apt-get download fails loudly on an unknown name, but a
# renamed package in a later Debian would show up here).
for p in "${packages[@]}"; do
  compgen -G "$dest/${p}_*.deb" >/dev/null || { echo "fetch_device_deps: $p missing in $dest" >&2; exit 1; }
done
echo "fetch_device_deps: $(ls "$dest"/*.deb | wc -l) .debs, $(du -sh "$dest" | cut -f1) in $dest"
