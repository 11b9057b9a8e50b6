#!/usr/bin/env bash
# Checks a built wheel (`make wheel`) on a GPU host the way a user gets it: a fresh virtual environment without
# CuPy, the wheel, onnxruntime-gpu and onnxruntime-genai-cuda installed from local wheels (no network), then one
# pytest file run in a fresh process from outside the checkout, with compilers shadowed by failing stand-ins, so
# that `onnx_hybrid` is the installed wheel's and CUDA sessions take their kernels from the images beside its
# library.
#
#   scripts/check_wheel_gpu.sh WHEEL WHEELHOUSE TEST_FILE [PYTEST_ARGS...]
#
# WHEELHOUSE: a folder of wheels for onnxruntime-gpu, onnxruntime-genai-cuda, pytest and every dependency of them
# and of the package, e.g. made on a host with network (for the GPU host's Python version) by
#   pip download -d WHEELHOUSE --only-binary=:all: --python-version 3.12 WHEEL onnxruntime-gpu \
#       onnxruntime-genai-cuda pytest
# RUNTIME_REQUIREMENTS: the runtimes to install (default "onnxruntime-gpu onnxruntime-genai-cuda"; pin versions here).
# EXTRA_REQUIREMENTS: more requirements the test file needs (space-separated, also from WHEELHOUSE).
# PYTHON: the interpreter the environment is made from (default python3). KEEP_VENV=1 keeps the environment.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,/^set /p' "$0" | sed '$d' >&2
    exit 2
fi
for path in "$1" "$3"; do
    [ -f "$path" ] || { echo "check_wheel_gpu: $path: no such file" >&2; exit 2; }
done
[ -d "$2" ] || { echo "check_wheel_gpu: $2: no such folder (the wheelhouse)" >&2; exit 2; }
WHEEL=$(realpath "$1"); WHEELHOUSE=$(realpath "$2"); TEST=$(realpath "$3"); shift 3
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check_wheel_gpu.XXXXXX")
if [ "${KEEP_VENV:-0}" = 1 ]; then echo "check_wheel_gpu: environment kept in $WORK/venv"; else trap 'rm -rf "$WORK"' EXIT; fi
VENV=$WORK/venv
PY=$VENV/bin/python

# Nothing of the caller's environment may steer where the package, its library or its kernel images come from.
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV ONNX_HYBRID_LIBRARY ONNX_HYBRID_CUDA_IMAGES ONNX_HYBRID_KERNEL_CACHE

"${PYTHON:-python3}" -m venv "$VENV"
# shellcheck disable=SC2086  # the requirement variables are lists
"$PY" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELHOUSE" \
    "$WHEEL" ${RUNTIME_REQUIREMENTS:-onnxruntime-gpu onnxruntime-genai-cuda} pytest ${EXTRA_REQUIREMENTS:-}

# A compiler call anywhere below fails loudly: the installed package must need none.
mkdir "$WORK/no-compilers"
for tool in cc c++ gcc g++ clang clang++ nvcc; do
    printf '#!/bin/sh\necho "check_wheel_gpu: %s called ($*): the installed wheel must not need a compiler" >&2\nexit 127\n' \
        "$tool" > "$WORK/no-compilers/$tool"
    chmod +x "$WORK/no-compilers/$tool"
done
export PATH="$WORK/no-compilers:$VENV/bin:$PATH"

cd "$WORK"  # and -P: the checkout's onnx_hybrid is never on sys.path
"$PY" -P - <<'EOF'
import importlib.metadata, importlib.util, os, sys

import onnxruntime as ort
import onnxruntime_genai

import onnx_hybrid
from onnx_hybrid.ops import library


def installed(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


problems = []
if importlib.util.find_spec("cupy") is not None:
    problems.append("CuPy is installed in the environment: this check is for hosts without it")
if installed("onnxruntime"):
    problems.append(f"the CPU onnxruntime {installed('onnxruntime')} is installed: it provides the same module as onnxruntime-gpu")
if not onnx_hybrid.__file__.startswith(sys.prefix):
    problems.append(f"onnx_hybrid comes from {onnx_hybrid.__file__}, not from the environment {sys.prefix}")
if "CUDAExecutionProvider" not in ort.get_available_providers():
    problems.append(f"onnxruntime {ort.__version__} offers no CUDAExecutionProvider: {ort.get_available_providers()}")
folder = os.path.join(os.path.dirname(library.library_path()), library.IMAGE_FOLDER)
missing = [n for n in map(library.image_file_name, library.DEFAULT_CUDA_ARCHS) if not os.path.isfile(os.path.join(folder, n))]
if missing:
    problems.append(f"kernel images missing from {folder}: {missing}")
print(f"check_wheel_gpu: onnx_hybrid {installed('onnx-hybrid')} from {os.path.dirname(onnx_hybrid.__file__)}, "
      f"onnxruntime {ort.__version__} ({ort.__file__}), onnxruntime-genai {onnxruntime_genai.__version__}, "
      f"images {sorted(os.listdir(folder)) if os.path.isdir(folder) else 'none'}")
if problems:
    sys.exit("check_wheel_gpu: " + "\ncheck_wheel_gpu: ".join(problems))
EOF

"$PY" -P -m pytest -p no:cacheprovider --rootdir "$REPO" -c "$REPO/pyproject.toml" "$TEST" "$@"
