#!/usr/bin/env python
"""End-to-end speed on one GPU through onnxruntime-genai: our exports against onnxruntime-genai's builder.

Every export comes from the same synthetic checkpoint (real Qwen3.5 geometry, random bf16 weights, see
onnx_hybrid_testing.synthetic; a random MTP head is added for the paged exports) and is measured in a fresh
process per (export, CUDA graph on/off), so memory and CUDA state never leak from one row to the next.

Exports (names used in row ids):
  ours            export-hybrid -e cuda, fp16 (fp32 on --device cpu), our GatedDeltaNet / conv kernels; on
                  CUDA its defaults: GroupQueryAttention over shared KV buffers, enable_cuda_graph on
  ours-gemm       ours with --no-linear-op: ONNX's Gemm for the projections instead of our Linear
  ours-ms         the same with --op-domain com.microsoft (ONNX Runtime's own kernels)
  ours-int4       ours with --weights int4 (block 32, symmetric; ORT's MatMulNBits for the 4-bit products)
  ours-int4-head  ours-int4 with --quantize-lm-head (the builder's int4 export quantizes its lm_head too)
  ours-int4-qlinear ours-int4-head with --linear-op: our QuantizedLinear for the 4-bit products
  builder-fp16    onnxruntime-genai's builder, -p fp16 (fp32 on --device cpu)
  builder-int4    the builder, -p int4 (MatMulNBits weights)
  ours-paged      export-hybrid --paged --state-update-capacity C, with the MTP head (og.Engine)
  builder-paged   the builder with use_paged_attention=true, with the MTP head (og.Engine)
  ours-int4-paged ours-paged with --weights int4 --quantize-lm-head (QuantizedLinear, the paged int4 default)
  builder-int4-paged the builder, -p int4, use_paged_attention=true, with the MTP head (og.Engine)

Measurements (row id SIZE/EXPORT/GRAPH/MEASURE, GRAPH = eager or graph, i.e. enable_cuda_graph off or on, or
graph-2buf: on, with onnxruntime-genai's recurrent states double-buffered instead of updated in place, i.e.
ORTGENAI_SHARE_RECURRENT_STATE_UNDER_GRAPH_CAPTURE=0 in the worker's environment):
  prefill-P       og.Generator, batch 1: append_tokens of a P-token prompt (includes the first logits), ms
  decode-bB       og.Generator, batch B, a --decode-prompt-token prompt, --new-tokens greedy tokens: tokens/s
                  of all rows together over the whole run (og.Generator's batch limit is 32), and the steady
                  rate, B over the median step after the first decode step (with CUDA graphs onnxruntime-genai
                  captures each new generator's step again in it and backs up the recurrent states around the
                  capture: its time is first_step_ms)
  engine-R        og.Engine, R concurrent greedy requests, --new-tokens each: tokens/s (paged exports)
  engine-R-mtp    the same with the export's MTP head drafting (random head: acceptance near 0; the
                  acceptance rate is in the table)
and once per export SIZE/EXPORT/weights (bytes a decode step reads: every initializer but the embedding
table and rotary caches) and once per run copy-rate (a large device-to-device copy, read + write bytes /
s). The "bound b1" column is copy rate / weight bytes per token: the decode rate at batch 1 if reading the
weights once per token were all a step cost.

Results are merged into --json (default WORK/results.json) after every worker, and the markdown table of
everything in it is printed at the end and written next to it (.md): run in pieces with --only / --skip
(comma-separated shell patterns on row ids, see --list), each piece within a 10-minute call; checkpoints
and exports stay in --work and are reused. A failing row (graph capture unsupported, an export the builder
refuses, a timeout) shows the first line of its error instead of a number, and the run goes on.

CUDA notes. Our exports are written with -e cuda (fp16, the CUDA provider for the decoder and the MTP head,
our kernel images for --cuda-arch beside the library, ORT's CUDA PagedAttention when paged), the builder's
with -e cuda. enable_cuda_graph is the decoder's CUDA provider option (og.Config
set_provider_option); og 0.18 refuses graph capture where search.past_present_share_buffer is false. Disk:
the 9B checkpoint is 18 GB and each fp16 export about as much, so a 64 GB disk holds the checkpoint and two
exports: measure 9B one export at a time with --drop-exports. A quick GPU smoke run: --sizes tiny.

    python scripts/bench_e2e_gpu.py --work /data/e2e --list
    python scripts/bench_e2e_gpu.py --work /data/e2e --only '0.8B/*'
    python scripts/bench_e2e_gpu.py --work /data/e2e --sizes 9B --only '9B/ours/*' --drop-exports
    python scripts/bench_e2e_gpu.py --device cpu --work /tmp/e2e      # tiny CPU smoke run of everything
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _checkout  # the test helpers beside the package are not installed
import numpy as np

from onnx_hybrid_testing.e2e import cpu_model
from onnx_hybrid_testing.results import provenance

# This script, its workers and the export processes all use the package of the repository it is in.
REPO = _checkout.ROOT

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
SIZES = {"0.8B": "0.8b", "9B": "9b", "tiny": "tiny"}  # --sizes name: onnx_hybrid_testing.synthetic geometry
# The prefill speed-up of ours wanted over each export, at the longest prompt.
GOALS = {"builder-fp16": 2.0, "builder-fp32": 2.0, "builder-int4": 2.0, "ours-ms": 1.5}
# Defaults per device: the GPU run is the benchmark, the CPU run a smoke test of the whole pipeline.
DEFAULTS = {
    "cuda": dict(sizes="0.8B,9B", prefill="512,8192", decode_prompt=128, new_tokens=64, batches="1,16,32",
                 engine_requests=16, engine_prompt=128, repeats=3, capacity=3, num_blocks=None, block_size=None),
    "cpu": dict(sizes="tiny", prefill="32,128", decode_prompt=16, new_tokens=8, batches="1,4",
                engine_requests=4, engine_prompt=16, repeats=1, capacity=3, num_blocks=256, block_size=16),
}


@dataclass(frozen=True)
class Export:
    name: str
    builder: bool
    paged: bool = False
    precision: str = ""  # builder -p
    options: tuple[str, ...] = ()  # export-hybrid arguments, or builder extra options (k=v)


@dataclass
class Row:
    id: str
    size: str
    export: str
    graph: str = ""  # eager | graph; "" for the per-export and per-run rows
    measure: str = ""  # prefill-P | decode-bB | engine-R[-mtp] | weights | copy-rate
    params: dict = field(default_factory=dict)


def exports(args) -> list[Export]:
    cuda = args.device == "cuda"
    float_type = "fp16" if cuda else "fp32"
    paged = ["--paged", "--state-update-capacity", str(args.capacity)]  # -e cuda: ORT's CUDA PagedAttention
    if args.num_blocks:
        paged += ["--num-blocks", str(args.num_blocks)]
    if args.block_size:
        paged += ["--block-size", str(args.block_size)]
    builder_paged = {"use_paged_attention": "true"}
    if args.num_blocks:
        builder_paged["num_blocks"] = str(args.num_blocks)
    if args.block_size:
        builder_paged["paged_block_size"] = str(args.block_size)
    if args.no_builder_mtp:
        builder_paged["exclude_mtp"] = "true"
    extra = dict(kv.split("=", 1) for kv in args.builder_option)
    return [
        Export("ours", False, options=("--dtype", float_type, "--no-mtp")),
        Export("ours-gemm", False, options=("--dtype", float_type, "--no-mtp", "--no-linear-op")),
        Export("ours-int4", False, options=("--dtype", float_type, "--no-mtp", "--weights", "int4")),
        Export("ours-int4-head", False, options=("--dtype", float_type, "--no-mtp", "--weights", "int4",
                                                 "--quantize-lm-head")),
        Export("ours-int4-qlinear", False, options=("--dtype", float_type, "--no-mtp", "--weights", "int4",
                                                    "--quantize-lm-head", "--linear-op")),
        Export("ours-ms", False, options=("--dtype", float_type, "--no-mtp", "--op-domain", "com.microsoft")),
        Export(f"builder-{float_type}", True, precision=float_type, options=_kv({**extra, "exclude_mtp": "true"})),
        Export("builder-int4", True, precision="int4", options=_kv({**extra, "exclude_mtp": "true"})),
        Export("ours-paged", False, paged=True, options=("--dtype", float_type, *paged)),
        Export("builder-paged", True, paged=True, precision=float_type, options=_kv({**extra, **builder_paged})),
        Export("ours-int4-paged", False, paged=True, options=("--dtype", float_type, *paged, "--weights", "int4",
                                                              "--quantize-lm-head")),
        Export("builder-int4-paged", True, paged=True, precision="int4", options=_kv({**extra, **builder_paged})),
    ]


def _kv(options: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"{k}={v}" for k, v in options.items())


# onnxruntime-genai 0.18 updates recurrent states in place under CUDA graphs and so backs them up through pinned host
# memory around each new generator's capture; with this variable at 0 it keeps two buffers and two graphs instead.
DOUBLE_BUFFER_ENV = {"ORTGENAI_SHARE_RECURRENT_STATE_UNDER_GRAPH_CAPTURE": "0"}


def graph_modes(device: str) -> list[str]:
    return ["eager", "graph", "graph-2buf"] if device == "cuda" else ["eager"]


def all_rows(args) -> list[Row]:
    rows = [Row("copy-rate", "", "", measure="copy-rate")]
    for size in args.sizes:
        for e in exports(args):
            rows.append(Row(f"{size}/{e.name}/weights", size, e.name, measure="weights"))
            for graph in graph_modes(args.device):
                def add(measure, **params):
                    rows.append(Row(f"{size}/{e.name}/{graph}/{measure}", size, e.name, graph, measure, params))
                if graph == "graph-2buf":  # changes only the generator's decode steps
                    if not e.paged:
                        for batch in args.batches:
                            add(f"decode-b{batch}", batch=batch)
                    continue
                if e.paged:
                    add(f"engine-{args.engine_requests}", mtp=False)
                    add(f"engine-{args.engine_requests}-mtp", mtp=True)
                    continue
                for length in args.prefill:
                    add(f"prefill-{length}", length=length)
                for batch in args.batches:
                    add(f"decode-b{batch}", batch=batch)
    return rows


def select(rows: list[Row], only: list[str], skip: list[str]) -> list[Row]:
    def hit(row, patterns):
        return any(fnmatch.fnmatchcase(row.id, p) for p in patterns)
    return [r for r in rows if (not only or hit(r, only)) and not hit(r, skip)]


# ---------------------------------------------------------------------------------------------------- exports

def export_command(e: Export, checkpoint: Path, out: Path, args) -> list[str]:
    from onnx_hybrid_testing.e2e import builder_command

    if e.builder:
        provider = "cuda" if args.device == "cuda" else "cpu"
        options = dict(kv.split("=", 1) for kv in e.options)
        return builder_command(checkpoint, out, e.precision, provider, args.work / "cache", options)
    command = [sys.executable, "-m", "onnx_hybrid.cli", "export", str(checkpoint), "-o", str(out), "-q",
               "-e", args.device, *e.options]
    for arch in args.cuda_arch:
        command += ["--cuda-arch", str(arch)]
    return command


def checkpoint_for(size: str, mtp: bool, args) -> Path:
    from onnx_hybrid_testing.e2e import synthetic_checkpoint, with_mtp_head
    from onnx_hybrid_testing.synthetic import GEOMETRIES

    base = args.work / f"checkpoint_{size}"
    if not (base / "config.json").is_file():
        print(f"writing the synthetic {size} checkpoint to {base}", flush=True)
    synthetic_checkpoint(base, GEOMETRIES[SIZES[size]])
    return with_mtp_head(base, args.work / f"checkpoint_{size}_mtp") if mtp else base


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def ensure_export(e: Export, size: str, args) -> Path:
    """The export folder, made unless it holds a complete export of the same command (bench_export.json)."""
    out = args.work / "exports" / f"{size}_{e.name}"
    partial = out.with_name(out.name + ".partial")  # the builder writes in place: never leave a half export as out
    checkpoint = checkpoint_for(size, e.paged, args)
    command = export_command(e, checkpoint, partial, args)
    stamp = out / "bench_export.json"
    if stamp.is_file() and json.loads(stamp.read_text())["command"] == command:
        return out
    # Rough output size: fp16 weights are the bf16 checkpoint's size, fp32 twice it, int4 under a third.
    dtype = e.precision or ("fp32" if "fp32" in e.options else "fp16")
    need = {"fp32": 2.0, "int4": 0.35}.get(dtype, 1.0) * _folder_bytes(args.work / f"checkpoint_{size}") + (1 << 30)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    free = shutil.disk_usage(args.work).free
    if free < need:
        raise RuntimeError(f"not enough disk for {out.name}: needs ~{need / 1e9:.0f} GB, {free / 1e9:.0f} GB free in "
                           f"{args.work} (--drop-exports, or delete folders under {args.work / 'exports'})")
    print(f"exporting {out.name}: {shlex.join(command)}", flush=True)
    t0 = time.perf_counter()
    try:
        run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=args.export_timeout, cwd=REPO, env=ENV)
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"export timed out after {args.export_timeout} s") from None
    out.with_name(out.name + ".log").write_text(f"{shlex.join(command)}\n{run.stdout}")
    if run.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"export failed (status {run.returncode}): {_last_error(run.stdout)}")
    partial.rename(out)
    stamp.write_text(json.dumps({"command": command, "seconds": time.perf_counter() - t0}, indent=1))
    return out


def _last_error(text: str) -> str:
    """The most telling line of a failed process's output: the last one naming an error, else the last one."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line:
            return line
    return lines[-1] if lines else "(no output)"


# ----------------------------------------------------------------------------------------- worker processes

def measure(model, row: dict, spec: dict) -> dict:
    from onnx_hybrid_testing.e2e import generator_run
    from onnx_hybrid_testing.genai_driver import run_engine

    rng = np.random.default_rng(0)
    vocab = spec["vocab"]
    kind, params = row["measure"], row["params"]
    if kind.startswith("prefill-"):
        prompt = rng.integers(1, vocab, (1, params["length"]), dtype=np.int32)
        r = generator_run(model, prompt, 1, spec["repeats"])
        return {"prefill_ms": r["prefill_ms"]}
    if kind.startswith("decode-"):
        prompts = rng.integers(1, vocab, (params["batch"], spec["decode_prompt"]), dtype=np.int32)
        r = generator_run(model, prompts, spec["new_tokens"], spec["repeats"])
        return {key: r[key] for key in ("decode_tok_s", "decode_steady_tok_s", "first_step_ms")}
    if kind.startswith("engine-"):
        prompts = rng.integers(1, vocab, (spec["engine_requests"], spec["engine_prompt"])).tolist()
        run_engine(model, prompts, 4)  # warm-up: first allocations, prepacking, graph capture
        best = None
        for _ in range(spec["repeats"]):
            run = run_engine(model, prompts, spec["new_tokens"])
            if best is None or run.seconds < best.seconds:
                best = run
        tokens = sum(map(len, best.tokens))
        result = {"engine_tok_s": tokens / best.seconds, "tokens": tokens}
        if params["mtp"]:
            stats = best.stats
            if not stats.get("rounds"):
                raise RuntimeError("the Engine drafted nothing: the export's MTP head did not run")
            result["acceptance"] = stats["acceptance_rate"]
        return result
    raise ValueError(f"unknown measurement {kind!r}")


def copy_rate(device: str) -> dict:
    """Read + write bytes per second of a large copy in device memory, and the device's name (CUDA: a 1 GiB
    device-to-device copy, median of 10: onnx_hybrid_testing.device_rates; CPU: 256 MiB, best of 5)."""
    if device == "cpu":
        a = np.ones(1 << 28, np.uint8)
        b = np.empty_like(a)
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            np.copyto(b, a)
            times.append(time.perf_counter() - t0)
        return {"bytes_per_s": 2 * a.nbytes / min(times[1:]), "device_name": cpu_model()}
    from onnx_hybrid_testing.device_rates import copy_rate as device_copy_rate, device_name

    return {"bytes_per_s": device_copy_rate(), "device_name": device_name()}


def worker(spec_path: Path) -> None:
    """Run one spec: the copy rate, or every row of one export and graph mode on one loaded model; each
    result is appended to spec["out"] as a JSON line as soon as it is known."""
    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])

    def emit(row_id, result):
        with out.open("a") as f:
            f.write(json.dumps({"id": row_id, **result}) + "\n")

    if spec["kind"] == "copy":
        emit("copy-rate", copy_rate(spec["device"]))
        return
    os.environ.update(spec.get("env", {}))  # read by onnxruntime-genai when it makes a generator's states
    from onnx_hybrid_testing.e2e import load_model

    threads = spec["threads"] if spec["device"] == "cpu" else None
    # One model on the device at a time: at 9B two exports (the plain one and the one with the MTP head) with
    # their Engine pools do not fit an 80 GB card together. Spinning off: the Engine rows run a decoder and an
    # MTP head on the same cores.
    loaded = {}
    for row in spec["rows"]:
        plain = row["measure"].startswith("engine-") and not row["params"]["mtp"]
        package = spec["plain_package"] if plain else spec["package"]
        try:
            if package not in loaded:
                loaded.clear()
                gc.collect()
                loaded[package] = load_model(Path(package), graph=spec["graph"], threads=threads, spinning=False)
            result = measure(loaded[package], row, spec)
        except Exception as error:  # the row shows the error, the next row still runs
            result = {"error": _first_line(error)}
        emit(row["id"], result)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def run_worker(spec: dict, rows: list[str], args) -> dict[str, dict]:
    """Run a worker process on ``spec``; rows it did not report get the reason (status, timeout)."""
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "results.jsonl"
        spec_path.write_text(json.dumps({**spec, "out": str(out)}))
        log = Path(tmp) / "log"
        with log.open("w") as log_file:
            process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
                                       stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=ENV)
            try:
                status = process.wait(timeout=args.timeout)
                reason = None if status == 0 else f"worker exited with status {status}"
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                reason = f"timed out after {args.timeout} s"
        results = {}
        if out.is_file():
            for line in out.read_text().splitlines():
                entry = json.loads(line)
                results[entry.pop("id")] = entry
        if reason:
            reason += f": {_last_error(log.read_text())}"
            for row_id in rows:
                results.setdefault(row_id, {"error": reason})
        return results


# ------------------------------------------------------------------------------------------------ results

def load_results(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"runs": [], "rows": {}}


def save_results(path: Path, results: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(results, indent=1))
    temporary.replace(path)  # a killed run never leaves a truncated file


def _cell(entry: dict | None, key: str, fmt: str) -> str:
    if entry is None:
        return ""
    if "error" in entry:
        return "✗ " + entry["error"][:90].replace("|", "/")
    value = entry.get(key)
    return "" if value is None else format(value, fmt)


def _decode_cell(entry: dict | None) -> str:
    """The run's rate, and the steady rate in parentheses where it was measured (older results lack it)."""
    cell = _cell(entry, "decode_tok_s", ".1f")
    if entry and "decode_steady_tok_s" in entry:
        cell += f" ({entry['decode_steady_tok_s']:.0f})"
    return cell


def _best_prefill(rows: dict, prefix: str, lengths: list[int]) -> tuple[int, float] | None:
    """(length, ms) of the longest prefill measured under ``prefix`` (SIZE/EXPORT/GRAPH/)."""
    for length in sorted(lengths, reverse=True):
        entry = rows.get(f"{prefix}prefill-{length}")
        if entry and "prefill_ms" in entry:
            return length, entry["prefill_ms"]
    return None


def markdown(results: dict, args) -> str:
    rows, runs = results["rows"], results["runs"]
    last = runs[-1] if runs else {}
    copy = rows.get("copy-rate", {})
    lines = [f"# End-to-end through onnxruntime-genai ({args.device})", "",
             f"- device: {copy.get('device_name', 'not measured')}",
             f"- date: {last.get('date', '')}; git commit: {last.get('commit', '')}",
             f"- command: `{last.get('command', '')}`"]
    if len(runs) > 1:
        commits = ", ".join(sorted({r["commit"] for r in runs}))
        lines.append(f"- rows gathered over {len(runs)} runs (commits {commits})")
    rate = copy.get("bytes_per_s")
    lines.append(f"- device copy rate: {rate / 1e12:.3f} TB/s (read + write)" if rate else
                 f"- device copy rate: {copy.get('error', 'not measured')}")
    lines.append("")
    lengths = sorted({int(k.rsplit("prefill-", 1)[1]) for k in rows if "/prefill-" in k})
    batches = sorted({int(k.rsplit("decode-b", 1)[1]) for k in rows if "/decode-b" in k})
    engines = sorted({k.split("/")[-1] for k in rows if "/engine-" in k}, key=lambda m: (len(m), m))
    longest = lengths[-1] if lengths else None
    header = (["size", "export", "graph"] + [f"prefill {n} ms" for n in lengths]
              + ([f"ours × (prefill {longest})"] if longest else []) + [f"decode b{b} tok/s" for b in batches]
              + ["bound b1 tok/s", "weights/token GB"] + [f"{m} tok/s" for m in engines])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    keys = sorted({tuple(k.split("/")[:3]) for k in rows if k.count("/") == 3},
                  key=lambda k: (list(SIZES).index(k[0]) if k[0] in SIZES else 9, _export_order(k[1]), k[2]))
    for size, export, graph in keys:
        prefix = f"{size}/{export}/{graph}/"
        weights = rows.get(f"{size}/{export}/weights")
        cells = [size, export, graph] + [_cell(rows.get(f"{prefix}prefill-{n}"), "prefill_ms", ".1f") for n in lengths]
        if longest:
            ours = rows.get(f"{size}/ours/{graph}/prefill-{longest}")
            mine = rows.get(f"{prefix}prefill-{longest}")
            ratio = ""
            if ours and mine and "prefill_ms" in ours and "prefill_ms" in mine:
                speed_up = mine["prefill_ms"] / ours["prefill_ms"]
                ratio = f"{speed_up:.2f}x"
                if export in GOALS:
                    ratio += " ✓" if speed_up >= GOALS[export] else f" (goal {GOALS[export]}x)"
            cells.append(ratio)
        cells += [_decode_cell(rows.get(f"{prefix}decode-b{b}")) for b in batches]
        bound = ""
        if weights and "per_token" in weights and rate:
            bound = f"{rate / weights['per_token']:.0f}"
        cells += [bound, _cell(weights and {**weights, "per_token": weights.get("per_token", 0) / 1e9}, "per_token",
                               ".3f")]
        for m in engines:
            entry = rows.get(f"{prefix}{m}")
            cell = _cell(entry, "engine_tok_s", ".1f")
            if entry and "acceptance" in entry:
                cell += f" (acc {entry['acceptance']:.2f})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"ours × = this row's prefill time over ours' (same size and graph mode): the goal is ours ≥ "
              f"{GOALS['builder-int4']}x faster than the builder's exports and ≥ {GOALS['ours-ms']}x faster than "
              f"ours-ms at the longest prompt; ✓ marks a goal met. Paged rows (og.Engine) are ours-paged "
              f"(--paged, com.microsoft PagedAttention on CUDA) and builder-paged (use_paged_attention=true), and "
              f"their int4 exports ours-int4-paged and builder-int4-paged; "
              f"the MTP heads are random, so their acceptance is near 0 and engine-…-mtp shows the cost of "
              f"drafting, not its gain. Decode cells: tokens/s over the whole run of --new-tokens tokens a row "
              f"(the first decode step included: with CUDA graphs onnxruntime-genai captures each new generator's "
              f"step there and backs up the recurrent states around it, first_step_ms in the JSON), and in parentheses the steady rate, batch over the "
              f"median step after it."]
    return "\n".join(lines) + "\n"


def _export_order(name: str) -> int:
    order = ["ours", "ours-gemm", "ours-int4", "ours-int4-head", "ours-int4-qlinear", "ours-ms", "builder-fp16",
             "builder-fp32", "builder-int4", "ours-paged", "builder-paged", "ours-int4-paged", "builder-int4-paged"]
    return order.index(name) if name in order else len(order)


# --------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=list(DEFAULTS), default="cuda",
                        help="cuda: the benchmark (CUDA provider, fp16); cpu: CPU provider, fp32, small defaults "
                             "(a smoke test of the whole pipeline)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_e2e"),
                        help="checkpoints, exports and results; reused between runs (default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="results file, merged into (default WORK/results.json)")
    parser.add_argument("--sizes", help=f"comma-separated, of {', '.join(SIZES)} (cuda: 0.8B,9B; cpu: tiny)")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERNS",
                        help="run only rows whose id matches one of these comma-separated shell patterns "
                             "(repeatable), e.g. '9B/ours*/eager/*,copy-rate'")
    parser.add_argument("--skip", action="append", default=[], metavar="PATTERNS",
                        help="skip rows whose id matches one of these comma-separated patterns, e.g. '*/graph/*'")
    parser.add_argument("--list", action="store_true", help="print the selected row ids and exit")
    parser.add_argument("--table", action="store_true", help="print the table of --json and exit (runs nothing)")
    parser.add_argument("--prefill", help="comma-separated prompt lengths of the prefill rows (cuda: 512,8192)")
    parser.add_argument("--decode-prompt", type=int, help="prompt length of the decode rows (cuda: 128)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per row in decode and Engine rows (cuda: 64)")
    parser.add_argument("--batches", help="comma-separated og.Generator batch sizes of the decode rows, at most 32 "
                                          "(cuda: 1,16,32)")
    parser.add_argument("--engine-requests", type=int, help="concurrent og.Engine requests (cuda: 16)")
    parser.add_argument("--engine-prompt", type=int, help="prompt length of each Engine request (cuda: 128)")
    parser.add_argument("--repeats", type=int, help="timed runs per row after one warm-up run; the best is kept "
                                                    "(cuda: 3)")
    parser.add_argument("--capacity", type=int, help="--state-update-capacity of ours-paged (3)")
    parser.add_argument("--num-blocks", type=int, help="KV blocks of the paged exports (cuda: the runtime's choice; "
                                                       "cpu: 256)")
    parser.add_argument("--block-size", type=int, help="tokens per KV block of the paged exports (cuda: the "
                                                       "exporters' default 256; cpu: 16)")
    parser.add_argument("--builder-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option for every builder export (repeatable), e.g. prune_lm_head=true; "
                             "changes re-export those folders")
    parser.add_argument("--cuda-arch", type=int, action="append", default=[], metavar="CC",
                        help="--cuda-arch of our CUDA exports (repeatable; default: export-hybrid's, which "
                             "includes 90 for H100/H200)")
    parser.add_argument("--no-builder-mtp", action="store_true",
                        help="builder-paged without its MTP head (exclude_mtp=true), if the builder refuses it")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads on --device cpu (default 2)")
    parser.add_argument("--timeout", type=int, default=540, help="seconds per worker process (default %(default)s)")
    parser.add_argument("--export-timeout", type=int, default=570, help="seconds per export (default %(default)s)")
    parser.add_argument("--drop-exports", action="store_true",
                        help="delete each export once its selected rows are measured (the 9B exports do not "
                             "all fit a 64 GB disk)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, value in DEFAULTS[args.device].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.sizes = _split(args.sizes, str)
    args.prefill = _split(args.prefill, int)
    args.batches = _split(args.batches, int)
    args.only = [p for group in args.only for p in _split(group, str)]
    args.skip = [p for group in args.skip for p in _split(group, str)]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; known: {', '.join(SIZES)}")
    if any(b < 1 or b > 32 for b in args.batches):
        parser.error(f"--batches: each must be 1..32 (og.Generator's limit), got {args.batches}")
    if any(n < 1 for n in args.prefill) or min(args.decode_prompt, args.new_tokens, args.engine_requests,
                                               args.engine_prompt, args.repeats) < 1:
        parser.error("lengths, token counts, requests and repeats must be positive")
    bad = [kv for kv in args.builder_option if "=" not in kv]
    if bad:
        parser.error(f"--builder-option: expected KEY=VALUE, got {', '.join(bad)}")
    args.json = args.json or args.work / "results.json"
    return args


def _split(text: str, kind):
    return [kind(part.strip()) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(Path(argv[1]))
        return 0
    args = parse_args(argv)
    from onnx_hybrid_testing.e2e import weight_bytes, without_mtp
    from onnx_hybrid_testing.synthetic import GEOMETRIES

    rows = select(all_rows(args), args.only, args.skip)
    if args.list:
        print("\n".join(r.id for r in rows))
        return 0
    results = load_results(args.json)
    if args.table:
        print(markdown(results, args), end="")
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    results["runs"].append({**provenance(args.device, argv), "rows": [r.id for r in rows]})

    def record(new: dict[str, dict]) -> None:
        # "run" indexes results["runs"]: the date, commit and command line a row was measured with
        results["rows"].update({row_id: {**entry, "run": len(results["runs"]) - 1} for row_id, entry in new.items()})
        save_results(args.json, results)
        for row_id, entry in new.items():
            print(f"{row_id}: {json.dumps(entry)}", flush=True)

    if any(r.measure == "copy-rate" for r in rows):
        record(run_worker({"kind": "copy", "device": args.device}, ["copy-rate"], args))
    by_export = {}
    for r in rows:
        if r.export:
            by_export.setdefault((r.size, r.export), []).append(r)
    catalogue = {e.name: e for e in exports(args)}
    for (size, name), export_rows in by_export.items():
        e = catalogue[name]
        try:
            package = ensure_export(e, size, args)
            plain = None
            if e.paged and any(r.measure.startswith("engine-") and not r.params["mtp"] for r in export_rows):
                plain = without_mtp(package, package.with_name(package.name + "_plain"))
        except Exception as error:  # every row of this export shows why
            record({r.id: {"error": _first_line(error)} for r in export_rows})
            continue
        for r in export_rows:
            if r.measure == "weights":
                record({r.id: weight_bytes(package / "model.onnx")})
        for graph in graph_modes(args.device):
            measured = [r for r in export_rows if r.graph == graph]
            if not measured:
                continue
            spec = {"kind": "measure", "device": args.device,
                    "graph": graph != "eager" if args.device == "cuda" else None, "package": str(package),
                    "env": DOUBLE_BUFFER_ENV if graph == "graph-2buf" else {},
                    "plain_package": str(plain) if plain else None, "threads": args.threads,
                    "vocab": GEOMETRIES[SIZES[size]].vocab, "repeats": args.repeats,
                    "decode_prompt": args.decode_prompt, "new_tokens": args.new_tokens,
                    "engine_requests": args.engine_requests, "engine_prompt": args.engine_prompt,
                    "rows": [{"id": r.id, "measure": r.measure, "params": r.params} for r in measured]}
            record(run_worker(spec, [r.id for r in measured], args))
        if args.drop_exports:
            shutil.rmtree(package, ignore_errors=True)
            if plain:
                shutil.rmtree(plain, ignore_errors=True)
    table = markdown(results, args)
    args.json.with_suffix(".md").write_text(table)
    print()
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
