# shellcheck shell=bash
# The preamble of the scripts/device_*.sh sessions, sourced by each: where results go, which
# steps run, which Python, which card.
#
# The device tool brings back at most 8 files from $OUT, and a session's logs, JSON and reports
# are more than that: the files beyond the eighth came back missing, silently. So a script
# writes into a staging folder, $out, and calls `deliver` after each step. The summaries it
# names are copied into $OUT as they are, and every file it wrote is packed into $OUT/NAME.tgz.
# A call cut off by its time limit still returns what was delivered before.
#
#   device_init NAME [STEPS]  out (a fresh folder under /tmp) and the archive $OUT/NAME.tgz (OUT
#                             defaults to ./device-out, relative to where the script was started);
#                             then cd to the repository root; steps from $STEPS, else STEPS;
#                             python: the device's torch environment where there is one
#   has STEP                  whether STEP is among the steps
#   gpu_info [FIELDS]         nvidia-smi's csv line per card into $out/gpu.txt and stdout
#                             [name,memory.total,driver_version,clocks.max.sm,clocks.max.mem]
#   flashinfer_install ARG... install FlashInfer from the carried .flashinfer-wheels, with ARG...
#                             (its other wheels), nothing downloaded
#   deliver [FILE...]         FILE: names in $out to copy into $OUT beside the archive (at most 7)

device_init() {
  delivery=$(realpath -m "${OUT:-device-out}")
  mkdir -p "$delivery"
  out=$(mktemp -d "/tmp/$1.XXXXXX")
  archive=$delivery/$1.tgz
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
  steps=" ${STEPS:-${2:-}} "
  python=/opt/torch/.venv/bin/python3
  [[ -x $python ]] || python=python3
}

has() { [[ "$steps" == *" $1 "* ]]; }

gpu_info() {
  nvidia-smi --query-gpu="${1:-name,memory.total,driver_version,clocks.max.sm,clocks.max.mem}" \
    --format=csv,noheader | tee "$out/gpu.txt"
}

flashinfer_install() {
  $python -m pip install -q --no-index --find-links .flashinfer-wheels --no-deps \
    flashinfer-python==0.7.0.post1 "apache-tvm-ffi>=0.1.11,<0.2" "$@"
}

deliver() {
  local file
  (($# <= 7)) || { echo "deliver: $# results and the archive are more than the 8 files that come back" >&2; return 1; }
  for file in "$@"; do
    if [[ -f $out/$file ]]; then cp "$out/$file" "$delivery/"; fi
  done
  # Written aside and renamed, so the archive in $OUT is always a whole one.
  tar czf "$delivery/.partial.tgz" -C "$out" . && mv "$delivery/.partial.tgz" "$archive"
}
