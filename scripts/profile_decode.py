#!/usr/bin/env python
"""Where a decode step's time goes, export against export, through onnxruntime-genai (issue 30, point 2).

For each export folder, a fresh process runs og.Generator (greedy, batch --batch, a --prompt-token prompt, then
--steps decode steps) with ONNX Runtime's profiler on (``enable_profiling`` in the decoder's session options,
set by og.Config.overlay; the export is not touched). Every model run after the prompt's is a decode step;
per step the table gives the nodes ORT ran (by execution provider), the sum of their times and the run's wall
time, and then the op types that took the most time.

``--prompt-run`` profiles the prompt's run instead (where prefill time goes).

With ``--kernels`` (a GPU and Nsight Compute's ``ncu`` on the PATH) the same process runs twice under
``ncu`` (--steps and 2 x --steps decode steps); the difference over the extra steps is the CUDA kernels one decode
step launches, their GPU time and the DRAM bytes they read and write, by kernel name. ncu serialises every
launch, so these durations are kernel times without overlap or launch gaps; the wall time of a step is the
profiler-free number of scripts/bench_e2e_gpu.py.

    python scripts/profile_decode.py ours=/data/e2e/exports/0.8B_ours-shared builder=/data/e2e/exports/0.8B_builder-fp16
    python scripts/profile_decode.py --kernels --steps 4 ours=... builder=...
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path


def worker(job: dict) -> None:
    """Run the generator of ``job``; with ``profile`` set, ORT writes its trace there when the process ends."""
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(job["model"])
    if job.get("profile"):
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"enable_profiling": job["profile"]}}}}))
    model = og.Model(config)
    vocab = json.loads((Path(job["model"]) / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = np.random.default_rng(0).integers(1, min(vocab, 1000), size=(job["batch"], job["prompt"]), dtype=np.int32)
    params = og.GeneratorParams(model)
    total = job["prompt"] + job["steps"] + 2
    params.set_search_options(do_sample=False, batch_size=job["batch"], max_length=total, min_length=total)
    # A first generator's prompt run takes the one-time costs (weight prepacking, first allocations and page faults),
    # so the profiled prompt run below is a warm one.
    og.Generator(model, params).append_tokens(prompt)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)  # runs the model on the prompt
    for _ in range(job["steps"] + 1):  # the first call picks from the prompt's logits: no model run
        generator.generate_next_token()
    generator.get_next_tokens()


def run_worker(job: dict, prefix: list[str] = ()) -> None:
    done = subprocess.run([*prefix, sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                          text=True, timeout=job.get("timeout", 600))
    if done.returncode:
        raise RuntimeError(f"{job['model']}: worker failed: {done.stderr[-2000:]}")


def model_runs(trace: list[dict]) -> list[list[dict]]:
    """The Node events of each model run (the prompt's first), in order."""
    runs = sorted((e for e in trace if e.get("cat") == "Session" and e["name"] == "model_run"), key=lambda e: e["ts"])
    nodes = sorted((e for e in trace if e.get("cat") == "Node"), key=lambda e: e["ts"])
    steps = []
    for run in runs:
        start, end = run["ts"], run["ts"] + run["dur"]
        steps.append([dict(n, run_dur=run["dur"]) for n in nodes if start <= n["ts"] <= end])
    return steps


def node_profile(model: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "ort_profile")
        run_worker({"model": model, "profile": prefix, "batch": args.batch, "prompt": args.prompt,
                    "steps": args.steps})
        files = list(Path(tmp).glob("ort_profile*.json"))
        if not files:
            raise RuntimeError(f"{model}: onnxruntime wrote no profile")
        trace = json.loads(files[0].read_text())
    runs = [s for s in model_runs(trace) if s][1:]  # the warm-up generator's prompt run goes
    if args.prompt_run:
        steps = runs[:1]
    else:  # the first decode step also allocates; later ones are the steady state
        steps = runs[2:] or runs[1:]
    if not steps:
        raise RuntimeError(f"{model}: no {'prompt' if args.prompt_run else 'decode step'} in the profile")
    per_provider, per_op_us = Counter(), defaultdict(float)
    for step in steps:
        for node in step:
            per_provider[node["args"].get("provider", "?")] += 1
            per_op_us[node["args"].get("op_name", "?")] += node["dur"]
    n = len(steps)
    return {"steps": n, "nodes": sum(per_provider.values()) / n,
            "by_provider": {k: v / n for k, v in per_provider.items()},
            "node_us": sum(per_op_us.values()) / n, "run_us": sum(s[0]["run_dur"] for s in steps) / n,
            "op_us": {k: v / n for k, v in sorted(per_op_us.items(), key=lambda kv: -kv[1])},
            "op_count": {k: v / n for k, v in Counter(node["args"].get("op_name", "?")
                                                      for s in steps for node in s).items()}}


_NCU_METRICS = {"gpu__time_duration.sum": "ns", "dram__bytes_read.sum": "read", "dram__bytes_write.sum": "written"}
_UNITS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def kernel_profile(model: str, args) -> dict:
    """Per kernel name: launches, GPU time (us) and DRAM bytes (read + written) per decode step."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise RuntimeError("--kernels needs Nsight Compute's ncu on the PATH")
    counts = []
    for steps in (args.steps, 2 * args.steps):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "ncu.csv"
            run_worker({"model": model, "batch": args.batch, "prompt": args.prompt, "steps": steps, "timeout": 1200},
                       prefix=[ncu, "--clock-control", "none", "--metrics", ",".join(_NCU_METRICS), "--csv",
                               "--log-file", str(log)])
            rows = [r for r in csv.DictReader(io.StringIO(_csv_part(log.read_text())))
                    if r.get("Metric Name") in _NCU_METRICS]
        launches, totals = Counter(), defaultdict(lambda: defaultdict(float))
        for r in rows:
            name = r["Kernel Name"].split("(")[0].split("<")[0]
            what = _NCU_METRICS[r["Metric Name"]]
            if what == "ns":
                launches[name] += 1
            value = float(r["Metric Value"].replace(",", "")) * _UNITS.get(r.get("Metric Unit", ""), 1.0)
            totals[name]["bytes" if what != "ns" else "ns"] += value
        counts.append((launches, totals))
    (l1, t1), (l2, t2) = counts
    per_kernel = {}
    for k in l2:
        n = (l2[k] - l1[k]) / args.steps
        if n > 0:
            per_kernel[k] = (n, (t2[k]["ns"] - t1[k]["ns"]) / args.steps / 1e3,
                             (t2[k]["bytes"] - t1[k]["bytes"]) / args.steps / 1e9)
    return {"launches": sum(v[0] for v in per_kernel.values()), "gpu_us": sum(v[1] for v in per_kernel.values()),
            "gb": sum(v[2] for v in per_kernel.values()),
            "kernels": dict(sorted(per_kernel.items(), key=lambda kv: -kv[1][1]))}


def _csv_part(text: str) -> str:
    """ncu's log: its own messages (==PROF== ...) then the CSV; the program's output is not in it."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), len(lines))
    return "\n".join(lines[start:])


def report(results: dict[str, dict], args) -> str:
    what = "the prompt's run" if args.prompt_run else "decode steps"
    out = [f"{what} profiled per export: batch {args.batch}, prompt {args.prompt}, eager (no CUDA graph)", "",
           "| export | nodes/step | by provider | node time µs/step | run µs/step |" +
           (" kernels/step | kernel time µs/step | DRAM GB/step | TB/s over kernel time |" if args.kernels else ""),
           "|---|---|---|---|---|" + ("---|---|---|---|" if args.kernels else "")]
    for name, r in results.items():
        nodes = r["nodes"]
        providers = ", ".join(f"{k.replace('ExecutionProvider', '')} {v:.0f}" for k, v in nodes["by_provider"].items())
        row = f"| {name} | {nodes['nodes']:.0f} | {providers} | {nodes['node_us']:.0f} | {nodes['run_us']:.0f} |"
        if args.kernels:
            k = r["kernels"]
            row += f" {k['launches']:.0f} | {k['gpu_us']:.0f} | {k['gb']:.3f} | {_rate(k['gb'], k['gpu_us'])} |"
        out.append(row)
    for name, r in results.items():
        out += ["", f"{name}: op types by time per step (count, µs)", ""]
        nodes = r["nodes"]
        out += [f"- {op}: {nodes['op_count'][op]:.0f}, {us:.0f}" for op, us in list(nodes["op_us"].items())[:args.top]]
        if args.kernels:
            out += ["", f"{name}: kernels by GPU time per step (launches, µs, DRAM GB, TB/s)", ""]
            out += [f"- {k}: {c:.0f}, {us:.1f}, {gb:.4f}, {_rate(gb, us)}"
                    for k, (c, us, gb) in list(r["kernels"]["kernels"].items())[:args.top]]
    return "\n".join(out) + "\n"


def _rate(gb: float, us: float) -> str:
    return f"{gb / us * 1e3:.2f}" if us > 0 else "-"  # GB per us = 1000 TB/s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exports", nargs="*", metavar="NAME=FOLDER")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--steps", type=int, default=8,
                        help="decode steps run (default 8); the first is left out of the averages (allocations)")
    parser.add_argument("--prompt-run", action="store_true",
                        help="profile the prompt's run instead of the decode steps (nodes only)")
    parser.add_argument("--kernels", action="store_true", help="also count CUDA kernels per step with ncu")
    parser.add_argument("--top", type=int, default=12, help="op types / kernels listed per export")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if not args.exports:
        parser.error("name at least one NAME=FOLDER")
    results = {}
    for spec in args.exports:
        name, _, folder = spec.partition("=")
        folder = folder or name
        results[name] = {"nodes": node_profile(os.path.abspath(folder), args)}
        if args.kernels:
            results[name]["kernels"] = kernel_profile(os.path.abspath(folder), args)
    text = report(results, args)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
