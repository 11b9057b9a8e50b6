#!/usr/bin/env python
"""Export time and peak RSS: our exporter against onnxruntime-genai 0.18's builder, same checkpoint.

Each exporter runs in its own process under ``/usr/bin/time -v`` (wall time, maximum resident set size).
The checkpoint is synthetic (onnx_hybrid_testing.synthetic: real geometry, random bf16 weights) and is
read once before timing so both exporters start from a warm page cache.

    python scripts/bench_export.py --geometry 0.8b --work /tmp/bench              # ours and the builder
    python scripts/bench_export.py --geometry 9b --dtype fp16 --no-builder --cleanup  # ~18 GB in, ~18 GB out
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _checkout  # the test helpers beside the package are not installed

REPO = _checkout.ROOT
GNU_TIME = "/usr/bin/time"  # its -v prints the peak RSS; the shell keyword does not


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS GB) of ``cmd``."""
    if not Path(GNU_TIME).is_file():
        sys.exit(f"{GNU_TIME} not found: install GNU time (Debian/Ubuntu: apt-get install time)")
    proc = subprocess.run([GNU_TIME, "-v", *cmd], capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    seconds = sum(float(part) * 60 ** i for i, part in enumerate(reversed(wall.split(":"))))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return seconds, rss_kb / 1e6


def dir_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e9


def main() -> None:
    from onnx_hybrid_testing.e2e import cpu_model
    from onnx_hybrid_testing.results import write_json
    from onnx_hybrid_testing.synthetic import GEOMETRIES, tensor_shapes, write_checkpoint

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--geometry", choices=list(GEOMETRIES), default="0.8b")
    parser.add_argument("--dtype", default="fp32", help="our export's dtype (the builder runs fp32)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench"))
    parser.add_argument("--no-builder", action="store_true", help="skip onnxruntime-genai's builder")
    parser.add_argument("--cleanup", action="store_true", help="delete checkpoint and outputs at the end")
    parser.add_argument("--json", type=Path, help="also write the rows here (with date, commit, CPU, command)")
    args = parser.parse_args()

    geometry = GEOMETRIES[args.geometry]
    checkpoint = args.work / f"checkpoint_{args.geometry}"
    if not (checkpoint / "config.json").is_file():
        print(f"writing synthetic {args.geometry} checkpoint to {checkpoint} ...", flush=True)
        write_checkpoint(checkpoint, geometry)
    for shard in checkpoint.glob("*.safetensors"):  # warm the page cache for both exporters
        with open(shard, "rb") as f:
            while f.read(64 << 20):
                pass
    itemsize = {"fp32": 4, "fp16": 2, "bf16": 2}[args.dtype]
    largest = max(int.__mul__(*s) if len(s) == 2 else 0 for s in tensor_shapes(geometry).values()) * itemsize / 1e9
    print(f"checkpoint {dir_gb(checkpoint):.2f} GB, largest output tensor {largest:.2f} GB "
          f"(RSS goal {1.5 * largest + 0.3:.2f} GB)", flush=True)

    ours = args.work / f"ours_{args.geometry}_{args.dtype}"
    wall, rss = timed([sys.executable, "-m", "onnx_hybrid.cli", "export", str(checkpoint), "-o", str(ours),
                       "--dtype", args.dtype, "--overwrite", "-q"])
    print(f"ours ({args.dtype}): {wall:.1f} s, peak RSS {rss:.2f} GB, output {dir_gb(ours):.2f} GB", flush=True)
    rows = [{"exporter": "ours", "dtype": args.dtype, "seconds": wall, "peak_rss_gb": rss, "output_gb": dir_gb(ours)}]
    if not args.no_builder:
        builder = args.work / f"builder_{args.geometry}_fp32"
        shutil.rmtree(builder, ignore_errors=True)
        wall_b, rss_b = timed([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint),
                               "-o", str(builder), "-p", "fp32", "-e", "cpu", "-c", str(args.work / "cache")])
        print(f"builder (fp32): {wall_b:.1f} s, peak RSS {rss_b:.2f} GB, output {dir_gb(builder):.2f} GB")
        print(f"ratio ours/builder: time {wall / wall_b:.2f}x, peak RSS {rss / rss_b:.2f}x")
        rows.append({"exporter": "builder", "dtype": "fp32", "seconds": wall_b, "peak_rss_gb": rss_b,
                     "output_gb": dir_gb(builder)})
    print("\n| exporter | seconds | peak RSS GB | output GB |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['exporter']} ({row['dtype']}) | {row['seconds']:.1f} | {row['peak_rss_gb']:.2f} | "
              f"{row['output_gb']:.2f} |")
    write_json(args.json, "bench_export", cpu_model(), rows, geometry=args.geometry, largest_tensor_gb=largest)
    if args.cleanup:
        for path in (checkpoint, ours, args.work / f"builder_{args.geometry}_fp32", args.work / "cache"):
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
