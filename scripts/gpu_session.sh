#!/bin/bash
# The GPU checks and benchmarks of this repository, on any host with an NVIDIA GPU, after
#   pip install -e ".[gpu,test]" onnxruntime-genai-cuda==0.18.0   (and flash-linear-attention for the FLA peer)
# Logs go to $OUT (default ./out). STEPS picks the steps, comma-separated (default test,sanitize,bench,conv):
#   test      tests/cuda/test_cuda_ops_gpu.py: the CUDA kernels on GPU arrays against the float64 reference and FLA
#   sanitize  compute-sanitizer (memcheck) over every kernel on malformed offsets (scripts/gpu_check.py)
#   sanitize-linear  compute-sanitizer (memcheck) over the Linear and QuantizedLinear tests in ORT sessions (the
#             one-row kernels' plain loads must stay inside their tensors at every in_features and row count)
#   bench     scripts/bench_gpu.py (BENCH_ARGS is passed through the shell: quote case names with spaces)
#   conv      scripts/bench_gpu_conv_replay.py: the conv and both replays against their byte floors
#   ort       tests/cuda/test_cuda_ep.py and tests/cuda/test_native_cuda_cpu.py: our CUDA nodes in onnxruntime-gpu sessions
#   ort-bench scripts/bench_cuda_ep.py: our CUDA nodes against ORT's com.microsoft ones, in sessions
#   genai     tests/genai/test_genai_cuda.py: every layout exported -e cuda through onnxruntime-genai-cuda
#   paged     the paged export on ORT's own CUDA kernels (scripts/paged_greedy.py --compare, see paged_step)
# PYTEST_ARGS goes to every pytest step (e.g. PYTEST_ARGS="-k graph -x").
set -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import onnx_hybrid" || { echo "onnx_hybrid is not installed: pip install -e '.[gpu,test]'"; exit 1; }

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

pytest_step() {  # NAME FILES...
  local name=$1; shift
  timeout "${PYTEST_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -rfEs ${PYTEST_ARGS} "$@" 2>&1 \
      | tee "$OUT/$name.log" | tail -60
}

STEPS=${STEPS:-test,sanitize,bench,conv}
status=0
for step in ${STEPS//,/ }; do
  case "$step" in
    test) pytest_step pytest tests/cuda/test_cuda_ops_gpu.py ;;
    sanitize) timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/gpu_check.py 2>&1 \
                  | tee "$OUT/sanitizer.log" | tail -8 ;;
    sanitize-linear) timeout "${PYTEST_TIMEOUT:-540}" compute-sanitizer --tool memcheck --error-exitcode 9 \
                         python3 -m pytest -q -p no:cacheprovider -k "not graph" ${PYTEST_ARGS} \
                         tests/cuda/test_cuda_linear.py tests/cuda/test_cuda_quantized_linear.py 2>&1 \
                  | tee "$OUT/sanitizer_linear.log" | tail -12 ;;
    bench) eval "timeout ${BENCH_TIMEOUT:-240} python3 scripts/bench_gpu.py ${BENCH_ARGS}" 2>&1 | tee "$OUT/bench.log" ;;
    conv) timeout 200 python3 scripts/bench_gpu_conv_replay.py 2>&1 | tee "$OUT/bench_conv_replay.log" ;;
    ort) pytest_step pytest_cuda_ep tests/cuda/test_cuda_ep.py tests/cuda/test_native_cuda_cpu.py ;;
    ort-bench) eval "timeout ${BENCH_TIMEOUT:-240} python3 scripts/bench_cuda_ep.py ${BENCH_ARGS}" 2>&1 \
                   | tee "$OUT/bench_cuda_ep.log" ;;
    genai) pytest_step pytest_genai_cuda tests/genai/test_genai_cuda.py ;;
    paged) paged_step 2>&1 | tee "$OUT/paged_greedy.log" ;;
    *) echo "unknown step '$step' (test, sanitize, sanitize-linear, bench, conv, ort, ort-bench, genai, paged)"; exit 2 ;;
  esac || status=1
done
exit $status
