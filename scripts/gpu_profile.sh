#!/bin/bash
# Nsight Compute on bench_gpu.py cases (any GPU host with the package installed, see gpu_session.sh): one report
# with source-level counters, a details page and per-instruction samples (scripts/ncu_hotspots.py reads them), in
# $OUT (default ./out).
#
#   CASES='prefill 1x8192' KERNELS='regex:gdn_chunk' NAME=prefill bash scripts/gpu_profile.sh
#
# CASES: bench_gpu.py --cases (substrings, comma-separated); KERNELS: ncu --kernel-name filter; COUNT: launches
# profiled (bench_gpu.py --once runs each case twice: the first launch of each kernel also loads the module).
# The SM clock is left free (--clock-control none), so durations read like the benchmark's, not ncu's base clock.
set -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
NAME=${NAME:-profile}
rep="$OUT/$NAME"
timeout ${PROFILE_TIMEOUT:-300} ncu --set full --import-source yes --clock-control none \
    --kernel-name "${KERNELS:-regex:gdn_}" --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-4}" \
    -f -o "$rep" python3 scripts/bench_gpu.py --once --no-fla --dtype "${DTYPE:-float16}" --cases "$CASES" \
    > "$OUT/$NAME.ncu.log" 2>&1 || { tail -30 "$OUT/$NAME.ncu.log"; exit 1; }
ncu --import "$rep.ncu-rep" --page details > "$OUT/$NAME.details.txt" 2>&1
grep -E "^  [a-z_0-9]+|Duration|Registers Per|Achieved Occupancy|Issued Warp|Eligible Warps|Active Warps Per|No Eligible|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|Shared Memory Config|Warp Cycles Per Issued" \
    "$OUT/$NAME.details.txt" | head -120
# Per-instruction samples (warp stall reasons) as CSV: the hot lines are what the kernel waits on.
ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/$NAME.sass.csv" 2>&1 ||
  echo "no source page from this ncu (see $NAME.sass.csv)"
gzip -f "$OUT/$NAME.sass.csv"  # 9-18 MB as text: over what one file may bring back
ls -l "$OUT"
