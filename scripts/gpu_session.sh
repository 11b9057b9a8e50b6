#!/bin/bash
# One device-machine session: install carried wheels (FLA), GPU tests, compute-sanitizer on malformed
# offsets, benchmarks. Logs go to $OUT (device tool) or ./out. STEPS picks steps (test,sanitize,bench,conv);
# BENCH_ARGS is passed to scripts/bench_gpu.py through the shell (quote case names with spaces); conv runs
# scripts/bench_gpu_conv_replay.py (the conv and both replays against their byte floors).
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L
STEPS=${STEPS:-test,sanitize,bench,conv}
[[ $STEPS == *test* ]] && timeout 300 python3 -m pytest -q -p no:cacheprovider -rf tests/test_cuda_ops_gpu.py 2>&1 | tee "$OUT/pytest.log" | tail -40
[[ $STEPS == *sanitize* ]] && timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/gpu_check.py 2>&1 | tee "$OUT/sanitizer.log" | tail -8
[[ $STEPS == *bench* ]] && eval "timeout ${BENCH_TIMEOUT:-240} python3 scripts/bench_gpu.py ${BENCH_ARGS}" 2>&1 | tee "$OUT/bench.log"
[[ $STEPS == *conv* ]] && timeout 200 python3 scripts/bench_gpu_conv_replay.py 2>&1 | tee "$OUT/bench_conv_replay.log"
exit 0
