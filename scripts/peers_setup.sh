#!/usr/bin/env bash
# Creates (or checks) the Python virtual environment that holds sdpa's CPU peers, for
# scripts/peer_time.py and scripts/peers.sh. Idempotent: a package that already imports is left
# alone, so a second run only prints the versions.
#
#   scripts/peers_setup.sh            PyTorch, ONNX Runtime (+ onnx, numpy): about 3 GB from PyPI
#   scripts/peers_setup.sh --extra    also OpenVINO (binary wheel, ~60 MB) and ggml through
#                                     ggml-python, compiled here for this CPU (~3 min on 2 cores)
#
# Environment: SDPA_PEERS_VENV (default ~/.cache/sdpa-peers) is the venv; SDPA_PEERS_BUILD
# (default ~/.cache/sdpa-peers-build) is ggml's build and temporary directory.
#
# Fairness notes:
# * PyPI's torch wheel for Linux x86-64 is the CUDA build and brings its CUDA libraries (most of
#   the 3 GB); the CPU kernels timed here never use them.
# * ggml is built from source with -DGGML_NATIVE=ON (the -march=native a local llama.cpp build
#   gets) and OpenMP, never from a wheel cache: a wheel compiled for another CPU would be unfair
#   to ggml, and a -march=native wheel must not be reused on a different machine.
set -euo pipefail

venv=${SDPA_PEERS_VENV:-$HOME/.cache/sdpa-peers}
build=${SDPA_PEERS_BUILD:-$HOME/.cache/sdpa-peers-build}
extra=0
for arg in "$@"; do
  case $arg in
    --extra) extra=1 ;;
    # The help is the comment block at the top of this file, whatever its length.
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "peers_setup.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

# Versions of the extra peers (the comparison in docs/peers.md names the ones it used).
OPENVINO_VERSION=2026.4.1
GGML_PYTHON_VERSION=0.0.45 # bundles ggml 0.15.3

py=$venv/bin/python
imports() { [ -x "$py" ] && "$py" -c "$1" >/dev/null 2>&1; }

if ! imports 'import torch, onnxruntime, onnx, numpy'; then
  echo "peers_setup: installing torch, onnxruntime, onnx, numpy into $venv (about 3 GB)" >&2
  [ -x "$py" ] || python3 -m venv "$venv"
  "$py" -m pip install --quiet --upgrade pip
  "$py" -m pip install --quiet torch onnxruntime onnx numpy
  imports 'import torch, onnxruntime, onnx, numpy' \
    || { echo "peers_setup: $venv does not import torch, onnxruntime, onnx, numpy" >&2; exit 1; }
fi

if [ "$extra" = 1 ]; then
  if ! imports 'import openvino'; then
    echo "peers_setup: installing openvino $OPENVINO_VERSION" >&2
    "$py" -m pip install --quiet "openvino==$OPENVINO_VERSION"
  fi
  if ! imports 'import ggml; ggml.ggml_flash_attn_ext'; then
    echo "peers_setup: building ggml-python $GGML_PYTHON_VERSION for this CPU (a few minutes)" >&2
    mkdir -p "$build/tmp"
    started=$SECONDS
    TMPDIR="$build/tmp" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=ON" \
      "$py" -m pip install --quiet --no-cache-dir --no-binary ggml-python \
      -C build-dir="$build/ggml-python" "ggml-python==$GGML_PYTHON_VERSION"
    echo "peers_setup: ggml-python built in $((SECONDS - started)) s" >&2
  fi
fi

"$py" - <<'EOF' >&2
import importlib
found = []
for name in ("torch", "onnxruntime", "openvino", "ggml"):
    try:
        module = importlib.import_module(name)
        found.append(f"{name} {getattr(module, '__version__', '(version unknown)')}")
    except ImportError:
        found.append(f"{name} not installed")
print("peers_setup:", ", ".join(found))
EOF
echo "peers_setup: ready in $venv" >&2
