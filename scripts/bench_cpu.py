"""Our CPU GatedDeltaNet kernels against ONNX Runtime's own com.microsoft CPU kernels, same nodes.

0.8B geometry (Hk = Hv = 16, Dk = Dv = 128), fp32, qwen gate, sigmoid beta, qk_l2_norm, 2 intra-op
threads (spec/performance.md, "CPU kernels"). Each case first checks that both produce the same
outputs, then reports the median of --runs timed runs after warm-up, and the ratio ORT / ours.

Usage: python scripts/bench_cpu.py [--runs 30] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import onnxruntime as ort

from onnx_hybrid.ops import single_op, testing
from onnx_hybrid.ops.contract import DOMAIN, MS_DOMAIN

GEOMETRY = dict(num_heads_q=16, num_heads_v=16, head_size_k=128, head_size_v=128)
CASES = [  # name, lengths, capacity
    ("prefill 1x512", [512], 0),
    ("prefill 4x128 (ragged)", [128] * 4, 0),
    ("decode B=1", [1], 0),
    ("decode B=8", [1] * 8, 0),
    ("verify 4 tokens, B=8, capacity 4", [4] * 8, 4),
]
GOALS = {"prefill": 5.0, "decode": 2.0, "verify": 2.0}  # required ORT / ours


def timed(session, names, values, runs: int) -> tuple[float, float]:
    """Median wall time and median process CPU time (all threads) of one run. CPU time is the steadier
    number on a shared machine: other processes stretch wall time, not the work done."""
    options = ort.RunOptions()
    for _ in range(max(3, runs // 5)):
        session.run_with_ort_values(names, values, options)
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        session.run_with_ort_values(names, values, options)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def bench_case(lengths, capacity, runs: int, threads: int):
    rng = np.random.default_rng(0)
    case = testing.random_gdn_case(rng, lengths, capacity=capacity, **GEOMETRY)
    results, sessions = {}, {}
    for who, domain, library in (("ours", DOMAIN, True), ("ort", MS_DOMAIN, False)):
        model = single_op.single_op_model("GatedDeltaNet", case.feeds, case.attributes, domain=domain)
        sessions[who] = single_op.make_session(model, with_library=library, intra_op_threads=threads)
        results[who] = single_op.run_session(sessions[who], case.feeds)
    for name in results["ours"]:
        a, b = results["ours"][name], results["ort"][name]
        if not np.allclose(a, b, rtol=1e-3, atol=1e-4):
            raise AssertionError(f"{lengths}: {name} differs from ORT by {np.abs(a - b).max():.3e}")
    values = {n: single_op.to_ort_value(v) for n, v in case.feeds.items()}
    times = {}
    for who, session in sessions.items():
        names = [o.name for o in session.get_outputs()]
        times[who] = timed(session, names, values, runs)
    return times["ours"], times["ort"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from onnx_hybrid.ops.library import cpu_isa

    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op threads, kernels: {cpu_isa()}, "
          f"median of {args.runs} runs")
    print(f"{platform.processor() or platform.machine()}; load average {os.getloadavg()[0]:.2f} at start")
    print("| case | ours | ORT 1.32 com.microsoft | ORT / ours | ours CPU | ORT CPU | CPU ratio | goal |")
    print("|---|---|---|---|---|---|---|---|")
    for name, lengths, capacity in CASES:
        (ours, ours_cpu), (theirs, theirs_cpu) = bench_case(lengths, capacity, args.runs, args.threads)
        goal = GOALS[name.split()[0]]
        ratio = theirs / ours
        mark = "met" if ratio >= goal else f"missed ({ratio / goal:.0%} of goal)"
        print(f"| {name} | {ours * 1e3:.3f} ms | {theirs * 1e3:.3f} ms | {ratio:.2f}x | {ours_cpu * 1e3:.3f} ms | "
              f"{theirs_cpu * 1e3:.3f} ms | {theirs_cpu / ours_cpu:.2f}x | >= {goal:.0f}x: {mark} |", flush=True)


if __name__ == "__main__":
    main()
