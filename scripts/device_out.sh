# shellcheck shell=bash
# Sourced by the device_*.sh scripts: where their files go. The device tool brings back at most 8
# files from $OUT, and a session's logs, JSON and reports are more than that: the files beyond the
# eighth came back missing, silently. So a script writes into a staging folder, $out, and calls
# `deliver` after each step. The summaries it names are copied into $OUT as they are, and every
# file it wrote is packed into $OUT/NAME.tgz. A call cut off by its time limit still returns what
# was delivered before.
#   device_out_init NAME   sets out (a fresh folder under /tmp) and the archive $OUT/NAME.tgz;
#                          OUT defaults to ./device-out
#   deliver [FILE...]      FILE: names in $out to copy into $OUT beside the archive (at most 7)

device_out_init() {
  delivery=$(realpath -m "${OUT:-device-out}")
  mkdir -p "$delivery"
  out=$(mktemp -d "/tmp/$1.XXXXXX")
  archive=$delivery/$1.tgz
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
