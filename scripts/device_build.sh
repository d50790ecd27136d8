#!/usr/bin/env bash
# Builds pagoda with CMake on a lent GPU machine: nvcc, CMake, ninja and g++ are there, Debian's
# dev packages (OpenBLAS, PCRE2, nlohmann-json, CLI11, fmt, spdlog, GoogleTest, pkg-config) are
# not, and nothing can be downloaded. They travel as .debs in .device-deps/ (git-ignored, so name
# it in the run tool's carry list):
#   here:   bash scripts/fetch_device_deps.sh
#   there:  bash scripts/device_build.sh pagoda gpu_tests && ./build/gpu_tests
# Usage: bash scripts/device_build.sh [cmake targets...]   (default: pagoda gpu_tests)
# The .debs are unpacked with dpkg-deb -x (no root, nothing installed) into a private prefix;
# CMake finds the packages there, pkg-config reads .pc files rewritten to point there, and the
# binaries get an RPATH into it, so they run without LD_LIBRARY_PATH (as long as the prefix
# exists: it is under /tmp, so re-run this script on a fresh machine).
# Environment (defaults in brackets):
#   PAGODA_DEVICE_DEPS  the folder of .debs [.device-deps]
#   PAGODA_DEPS_PREFIX  where they are unpacked [/tmp/pagoda-deps]
#   PAGODA_BUILD_DIR    the CMake build folder [build]
#   PAGODA_CMAKE_ARGS   extra CMake arguments, split on spaces; they come last and win
#                       (e.g. "-DPAGODA_CUDA=OFF" or "-DCMAKE_CUDA_ARCHITECTURES=80")
#   JOBS                build parallelism [nproc]
set -euo pipefail

cd "$(dirname "$0")/.."
debs=${PAGODA_DEVICE_DEPS:-.device-deps}
prefix=${PAGODA_DEPS_PREFIX:-/tmp/pagoda-deps}
build=${PAGODA_BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
read -r -a extra_args <<<"${PAGODA_CMAKE_ARGS:-}"
targets=("$@")
((${#targets[@]})) || targets=(pagoda gpu_tests)

log() { echo "device_build: $*"; }
die() { echo "device_build: ERROR: $*" >&2; exit 1; }

# ---- checks -------------------------------------------------------------------------------
if [[ ! -d $debs ]] || ! compgen -G "$debs/*.deb" >/dev/null; then
  die "no .debs in '$debs' ($PWD/$debs). Run 'bash scripts/fetch_device_deps.sh' on the dev" \
      "machine first, and carry '.device-deps' to this one (it is git-ignored: the run tool" \
      "copies it only when named in carry)."
fi
[[ $(uname -m) == x86_64 ]] || die "the carried .debs are amd64; this machine is $(uname -m)"
for tool in dpkg-deb cmake ninja; do
  command -v "$tool" >/dev/null || die "'$tool' not found on PATH"
done
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (c++ or g++) on PATH"
[[ $prefix == /* ]] || prefix="$PWD/$prefix"
case $prefix in *[[:space:]\#]*) die "PAGODA_DEPS_PREFIX must not contain spaces or '#'" ;; esac

nvcc=$(command -v nvcc || true)
if [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
nvcc_version=none
if [[ -n $nvcc ]]; then nvcc_version="$nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"; fi
log "cmake $(cmake --version | head -n1 | awk '{print $3}'), ninja $(ninja --version)," \
    "$( (c++ --version || g++ --version) 2>/dev/null | head -n1), nvcc: $nvcc_version"

# ---- 1. unpack the .debs -----------------------------------------------------------------
lib=$prefix/usr/lib/x86_64-linux-gnu
stamp=$(cd "$debs" && stat -c '%n %s' -- *.deb)
if [[ -f $prefix/.pagoda-stamp && $(cat "$prefix/.pagoda-stamp") == "$stamp" ]]; then
  log "deps already unpacked in $prefix"
else
  log "unpacking $(ls "$debs"/*.deb | wc -l) .debs from $debs into $prefix"
  # Only a folder this script made (or an empty one) is cleared: PAGODA_DEPS_PREFIX may be a typo.
  if [[ -d $prefix && -n $(ls -A "$prefix") && ! -f $prefix/.pagoda-stamp ]]; then
    die "$prefix exists and was not made by this script; choose another PAGODA_DEPS_PREFIX"
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do dpkg-deb -x "$f" "$prefix"; done

  # What update-alternatives would have made (dpkg-deb -x runs no maintainer scripts): the
  # generic OpenBLAS names point into openblas-pthread/.
  [[ -e $lib/openblas-pthread/libopenblas.so ]] || die "libopenblas-pthread-dev missing from $debs"
  mkdir -p "$lib/pkgconfig" "$prefix/usr/include/x86_64-linux-gnu"
  for f in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 liblapack.so liblapack.so.3; do
    if [[ -e $lib/openblas-pthread/$f ]]; then ln -sfn "openblas-pthread/$f" "$lib/$f"; fi
  done
  ln -sfn ../openblas-pthread/pkgconfig/openblas.pc "$lib/pkgconfig/openblas.pc"
  ln -sfn ../openblas-pthread/pkgconfig/blas-openblas.pc "$lib/pkgconfig/blas.pc"
  ln -sfn ../openblas-pthread/pkgconfig/lapack-openblas.pc "$lib/pkgconfig/lapack.pc"
  for h in cblas.h f77blas.h openblas_config.h; do
    ln -sfn "openblas-pthread/$h" "$prefix/usr/include/x86_64-linux-gnu/$h"
  done

  # The .pc files say /usr (as prefix=/usr, or as absolute libdir=/usr/... in openblas.pc):
  # point every one of them into the prefix, whatever pkg-config implementation reads them.
  while IFS= read -r -d '' pc; do
    sed -i -E "s#(=[[:space:]]*|-I|-L)/usr(/|[[:space:]]|\$)#\1$prefix/usr\2#g" "$pc"
    if grep -nE '(^|[^[:alnum:]_./-])/usr(/|[[:space:]]|$)' "$pc" | grep -v "$prefix/usr" >&2; then
      die "$pc still points into /usr after rewriting (lines above)"
    fi
  done < <(find "$prefix" -name '*.pc' -type f -print0)

  # pkg-config: a wrapper that sees only the prefix's .pc files. It runs the carried pkgconf
  # (the device may have no pkg-config), or the machine's own if the carried one cannot run.
  mkdir -p "$prefix/bin"
  pcdirs="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
  carried="LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} $prefix/usr/bin/pkgconf"
  real=$carried
  if ! env LD_LIBRARY_PATH="$lib" "$prefix/usr/bin/pkgconf" --version >/dev/null 2>&1; then
    real=$(command -v pkg-config || command -v pkgconf || true)
    [[ -n $real ]] || die "the carried pkgconf does not run here and there is no pkg-config"
    log "the carried pkgconf does not run here; using $real"
  fi
  cat >"$prefix/bin/pkg-config" <<EOF
#!/bin/sh
# Written by scripts/device_build.sh: pkg-config restricted to $prefix.
# PKG_CONFIG_PATH is dropped so that nothing outside the prefix is found.
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
export PKG_CONFIG_LIBDIR=$pcdirs
exec env $real "\$@"
EOF
  chmod +x "$prefix/bin/pkg-config"
  echo "$stamp" >"$prefix/.pagoda-stamp"
fi
pkgconfig=$prefix/bin/pkg-config
for m in libpcre2-8 openblas; do
  "$pkgconfig" --exists "$m" || die "pkg-config cannot find $m in $prefix"
done
log "pkg-config ($("$pkgconfig" --version)): openblas $("$pkgconfig" --modversion openblas)," \
    "libpcre2-8 $("$pkgconfig" --modversion libpcre2-8)"

# ---- 2. configure -------------------------------------------------------------------------
# A cache from another source tree, generator or deps prefix cannot be reused.
cache=$build/CMakeCache.txt
if [[ -f $cache ]] && ! { grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD" "$cache" &&
                          grep -qx "CMAKE_GENERATOR:INTERNAL=Ninja" "$cache" &&
                          grep -qx "PKG_CONFIG_EXECUTABLE:FILEPATH=$pkgconfig" "$cache"; }; then
  log "$cache was configured elsewhere or differently: removing it"
  rm -rf "$cache" "$build/CMakeFiles"
fi

rpath="$lib;$lib/openblas-pthread"
cuda_args=()
if [[ -n $nvcc ]]; then cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc"); fi
# NCCL (the GPU collectives): the CUDA toolkit's if it has one, else the nvidia-nccl pip package's
# (the GPU image carries it for PyTorch). CMake reports which it found.
nccl_root=
cuda_home=$(dirname "$(dirname "${nvcc:-/usr/local/cuda/bin/nvcc}")")
if [[ ! -f $cuda_home/include/nccl.h ]]; then
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null || continue
    site=$("$py" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]) + "/nvidia")' 2>/dev/null) || continue
    header=$(find "$site" -name nccl.h -path '*nccl*' 2>/dev/null | head -n1)
    if [[ -n $header ]]; then nccl_root=$(dirname "$(dirname "$header")"); break; fi
  done
fi
if [[ -n $nccl_root ]]; then
  log "NCCL from $nccl_root"
  cuda_args+=(-DPAGODA_NCCL_ROOT="$nccl_root")
  rpath="$rpath;$nccl_root/lib"
fi
cmake_args=(
  -S . -B "$build" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DPAGODA_CUDA=ON
  "${cuda_args[@]}"
  -DCMAKE_PREFIX_PATH="$prefix/usr"
  -DPKG_CONFIG_EXECUTABLE="$pkgconfig"
  -DPKG_CONFIG_USE_CMAKE_PREFIX_PATH=OFF
  # RPATH into the prefix. DT_RPATH (--disable-new-dtags), not DT_RUNPATH: RUNPATH applies only
  # to the binary's own needs, and libopenblas.so.0 needs libgfortran.so.5 from the prefix too.
  -DCMAKE_BUILD_RPATH="$rpath"
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags
  -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags
  "${extra_args[@]}"
)
log "configuring $build: cmake ${cmake_args[*]}"
cmake "${cmake_args[@]}" || die "CMake configure failed (see above; full log in $build/CMakeFiles/CMakeOutput.log)"

# ---- 3. build -----------------------------------------------------------------------------
log "building ${targets[*]} with $jobs jobs"
cmake --build "$build" -j "$jobs" --target "${targets[@]}" || die "build of ${targets[*]} failed"

# ---- 4. check that the binaries load -----------------------------------------------------
for t in "${targets[@]}"; do
  bin=$build/$t
  [[ -f $bin && -x $bin ]] && command -v ldd >/dev/null || continue
  if ldd "$bin" | grep -q "not found"; then
    ldd "$bin" | grep "not found" >&2
    die "$bin has unresolved libraries (above)"
  fi
  log "$bin links: $(ldd "$bin" | grep -oE "$prefix[^ ]*" | xargs -rn1 basename | sort -u | tr '\n' ' ')"
done
log "done. The binaries find their libraries through RPATH; to run them after moving them:"
log "  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread"
