#!/bin/bash
# Our custom-op library's CUDA variants inside onnxruntime-gpu 1.31.1 sessions on the device machine:
# tests/test_cuda_ep.py, then scripts/bench_cuda_ep.py. Logs go to $OUT (device tool) or ./out.
#
# The onnxruntime-gpu wheel (cp312, ~255 MB) reaches the device machine in five git-ignored parts,
# .ortgpu0/part0 (with .ortgpu0/SHA256) ... .ortgpu4/part4, because one device call carries at most
# 64 MiB. Make the five calls back to back on one warm machine (/tmp survives between calls only while
# the machine stays held):
#
#   run(command="bash scripts/gpu_ort_session.sh part 0", carry=[".ortgpu0"])
#   run(command="bash scripts/gpu_ort_session.sh part 1", carry=[".ortgpu1"])
#   run(command="bash scripts/gpu_ort_session.sh part 2", carry=[".ortgpu2"])
#   run(command="bash scripts/gpu_ort_session.sh part 3", carry=[".ortgpu3"])
#   run(command="bash scripts/gpu_ort_session.sh part 4", timeout_s=600,
#       carry=[".ortgpu4", "onnx_hybrid/ops/_native", "build/ort-headers", "build/generated"])
#
#   run(command="STEPS=bench bash scripts/gpu_ort_session.sh run", timeout_s=400)
#   run(command="STEPS=paged bash scripts/gpu_ort_session.sh run", timeout_s=400)
#
# The parts are git-ignored, so a new checkout has none: make them on the CPU host first with
#   bash scripts/gpu_ort_session.sh split
# (downloads the wheel from PyPI for cp312 / manylinux_2_28 and splits it into .ortgpu0 ... .ortgpu4).
#
# "part N" copies the part to /tmp/ortgpu-parts. Part 4 then joins the parts, checks the sha256,
# installs the wheel with `pip install --no-deps --target /tmp/ortgpu`, and runs the check and test
# steps (one call is limited to 10 minutes, so the benchmark gets its own call). `run` repeats steps on
# the same warm machine: STEPS=check,test,bench picks them (default: all three), BENCH_ARGS goes to
# bench_cuda_ep.py, PYTEST_ARGS to pytest (e.g. PYTEST_ARGS="-k graph -x"). STEPS=paged (never a default)
# runs scripts/paged_greedy.py --compare on ORT's own CUDA kernels (paged_step below).
#
# The library is compiled here from this tree with g++ and the carried ORT headers (the device machine has
# no network to fetch them); without g++, the copy built on the CPU host (carried as onnx_hybrid/ops/_native,
# rebuild it first with `pip install --no-deps -e .`) is used.
set -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
PARTS=/tmp/ortgpu-parts
SITE=/tmp/ortgpu
WHEEL_NAME=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
LIBRARY=onnx_hybrid/ops/_native/libonnx_hybrid_ortops.so

copy_part() {
  local n=$1
  mkdir -p "$PARTS"
  cp ".ortgpu$n/part$n" "$PARTS/part$n" || { echo "no .ortgpu$n/part$n: carry .ortgpu$n"; exit 1; }
  [ "$n" = 0 ] && cp .ortgpu0/SHA256 "$PARTS/SHA256"
  ls -l "$PARTS"
}

install_wheel() {
  local wheel=/tmp/ortgpu-wheel/$WHEEL_NAME
  for n in 0 1 2 3 4; do
    [ -f "$PARTS/part$n" ] || { echo "missing $PARTS/part$n: the machine was released between calls; start over at part 0"; exit 1; }
  done
  mkdir -p /tmp/ortgpu-wheel
  cat "$PARTS"/part0 "$PARTS"/part1 "$PARTS"/part2 "$PARTS"/part3 "$PARTS"/part4 > "$wheel"
  local want got
  want=$(cut -d' ' -f1 "$PARTS/SHA256"); got=$(sha256sum "$wheel" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "sha256 mismatch: $got, expected $want"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$wheel" || exit 1
  rm -f "$wheel" "$PARTS"/part*
}

build_library() {
  if ! command -v g++ >/dev/null || [ ! -f build/ort-headers/onnxruntime_c_api.h ]; then
    python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$LIBRARY" || { echo "no g++ or headers here, and the carried $LIBRARY does not load"; exit 1; }
    echo "library: the carried build ($LIBRARY; no g++ or ORT headers here)"
    return
  fi
  echo "library: compiling it from this tree with g++"
  python3 setup.py -q build_ext --inplace --force --parallel "$(nproc)" || exit 1  # the package build, all cores
}

run_steps() {
  [ -d "$SITE/onnxruntime" ] || { echo "onnxruntime-gpu is not installed in $SITE: run the five part calls first"; exit 1; }
  if ls .whl/*.whl >/dev/null 2>&1; then  # other carried wheels (e.g. onnx, ml_dtypes if the machine lacks them)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=$PWD:$SITE:/tmp/site:$PYTHONPATH PYTHONUNBUFFERED=1
  build_library
  nvidia-smi -L
  STEPS=${STEPS:-check,test,bench}
  if [[ $STEPS == *check* ]]; then
    python3 - <<'PY' 2>&1 | tee "$OUT/check.log"
import importlib
for name in ("numpy", "onnx", "ml_dtypes", "cupy", "onnxruntime"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')} {getattr(m, '__file__', '')}")
    except Exception as e:
        print(f"{name}: MISSING ({e})")
import onnxruntime as ort
if hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
print("providers", ort.get_available_providers())
from onnx_hybrid.ops import library
print("library", library.library_path(), "prepared archs", library.prepare_cuda())
PY
  fi
  [[ $STEPS == *test* ]] && timeout 420 python3 -m pytest -q -p no:cacheprovider -rfEs ${PYTEST_ARGS} \
      tests/test_cuda_ep.py tests/test_native_cuda_cpu.py 2>&1 | tee "$OUT/pytest_cuda_ep.log" | tail -60
  [[ $STEPS == *bench* ]] && eval "timeout ${BENCH_TIMEOUT:-240} python3 scripts/bench_cuda_ep.py ${BENCH_ARGS}" \
      2>&1 | tee "$OUT/bench_cuda_ep.log"
  [[ $STEPS == *paged* ]] && paged_step 2>&1 | tee "$OUT/paged_greedy.log"
  return 0
}

# A tiny checkpoint exported paged with ORT's com.microsoft ops (PagedAttention, GatedDeltaNet, the conv; no
# library in the graph), non-paged fp16 the same way, and fp32 with our ops (the CPU reference): the paged
# driver's greedy tokens must equal the non-paged export's on this GPU, its logits fp32's within fp16 tolerance.
# ORT's verbose log (node placements: which nodes, if any, fell back to CPU) goes to paged_ort_verbose.log.
paged_step() {
  local dir=/tmp/paged-greedy export="python3 -m onnx_hybrid.cli export -q --overwrite"
  python3 scripts/make_tiny_checkpoint.py "$dir/checkpoint" --seed 1 >/dev/null || return 1
  $export "$dir/checkpoint" -o "$dir/paged_fp16" --paged --block-size 16 --op-domain com.microsoft --dtype fp16 || return 1
  $export "$dir/checkpoint" -o "$dir/fp16" --op-domain com.microsoft --dtype fp16 || return 1
  $export "$dir/checkpoint" -o "$dir/fp32" || return 1
  timeout 300 python3 scripts/paged_greedy.py "$dir/paged_fp16" --provider cuda --new-tokens 10 --compare "$dir/fp16" \
      --reference "$dir/fp32" --ort-verbose 2> "$OUT/paged_ort_verbose.log"
  local status=$?
  grep VerifyEachNodeIsAssignedToAnEp "$OUT/paged_ort_verbose.log" | cut -d']' -f2- | head -80
  grep -v "^20..-..-.. " "$OUT/paged_ort_verbose.log" | tail -20  # Python errors, not ORT's log lines
  return $status
}

split_wheel() {
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d "$tmp" onnxruntime-gpu==1.31.1 || exit 1
  (cd "$tmp" && sha256sum "$WHEEL_NAME" > SHA256 && split -b 60000000 -d -a 1 "$WHEEL_NAME" part) || exit 1
  for n in 0 1 2 3 4; do mkdir -p ".ortgpu$n" && mv "$tmp/part$n" ".ortgpu$n/"; done
  mv "$tmp/SHA256" .ortgpu0/
  rm -rf "$tmp"
  ls -l .ortgpu*/
}

case "$1" in
  split) split_wheel ;;
  part)
    [[ "$2" =~ ^[0-4]$ ]] || { echo "usage: $0 part 0|1|2|3|4"; exit 2; }
    copy_part "$2"
    if [ "$2" = 4 ]; then install_wheel; STEPS=${STEPS:-check,test} run_steps; fi ;;
  run) run_steps ;;
  *) echo "usage: $0 split | part N | run   (the procedure is at the top of this file)"; exit 2 ;;
esac
exit 0
