"""How the released GPU binaries round the GatedDeltaNet state update, read from their SASS (no GPU needed).

    python scripts/gpu_rounding_from_wheels.py --genai onnxruntime_genai_cuda-0.18.0-...whl \\
        --ort onnxruntime_gpu-1.31.1-...whl [--arch sm_90]

Needs ``cuobjdump`` and ``nvdisasm`` on PATH (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels carry them
under nvidia/cu13/bin). For onnxruntime-genai-cuda's device replay kernels and onnxruntime-gpu's GatedDeltaNet
recurrent kernels it prints the float multiply, fused multiply-add and add counts (about 12 s). A replay kernel with FMUL and
FFMA but no FADD computes ``S = fma(k, delta, fl(S * decay))`` (the CUDA rule of our kernels); one with FADD rounds
the product and the add separately, and then our fused kernels (and ORT 1.31.1's) are no longer bit-exact under
its replay (docs/lossless-speculative.md).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (wheel, library inside it, symbol pattern, is a replay kernel) of the kernels whose rounding decides replay
# exactness. A replay kernel does nothing but the update, so its counts alone tell the rule; the op kernels also
# reduce (FADD), so for them the counts are a fingerprint and docs/lossless-speculative.md quotes the update.
KERNELS = (
    ("genai", "libonnxruntime-genai-cuda.so", r"ReplayGatedDeltaNetKernel", True),
    ("genai", "libonnxruntime-genai-cuda.so", r"ReplayStateUpdatesKernel", True),
    ("ort", "libonnxruntime_providers_cuda.so", r"GatedDeltaNetDecodeWarpKernelIfLi128", False),
    ("ort", "libonnxruntime_providers_cuda.so", r"GatedDeltaNetRecurrentKernelIfLi256", False),
)


def extract(wheel: Path, name: str, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith("/" + name)]
        if not members:
            raise SystemExit(f"{wheel}: no {name} inside (members ending in .so: "
                             f"{[m for m in archive.namelist() if '.so' in m]})")
        return Path(archive.extract(members[0], into))


def sass_counts(library: Path, pattern: str, arch: str) -> list[tuple[str, dict]]:
    symbols = subprocess.run(["cuobjdump", "-symbols", str(library)], capture_output=True, text=True, check=True)
    names = sorted({m.group(0) for m in re.finditer(r"_Z\S*" + pattern + r"\S*", symbols.stdout)})
    found = []
    for name in names:
        dump = subprocess.run(["cuobjdump", "-sass", "-arch", arch, "-fun", name, str(library)],
                              capture_output=True, text=True, check=True).stdout
        body = dump.split("Function :", 1)[-1] if "Function :" in dump else ""
        if body:
            found.append((name, {op: len(re.findall(rf"\b{op}\b", body)) for op in ("FMUL", "FFMA", "FADD")}))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--genai", type=Path, help="an onnxruntime-genai-cuda wheel")
    parser.add_argument("--ort", type=Path, help="an onnxruntime-gpu wheel")
    parser.add_argument("--arch", default="sm_90", help="SASS architecture (ORT ships sm_90a: give sm_90a for it; "
                                                        "default sm_90, tried as sm_90a too)")
    args = parser.parse_args(argv)
    if not (args.genai or args.ort):
        parser.error("give --genai and/or --ort")
    missing = [tool for tool in ("cuobjdump", "nvdisasm") if shutil.which(tool) is None]
    if missing:
        parser.error(f"{', '.join(missing)} not on PATH (pip download nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, "
                     "unzip, add nvidia/cu13/bin to PATH)")
    wheels = {"genai": args.genai, "ort": args.ort}
    for flag, wheel in wheels.items():
        if wheel is not None and not wheel.is_file():
            parser.error(f"--{flag}: no such wheel file: {wheel}")
    with tempfile.TemporaryDirectory() as tmp:
        for which, library_name, pattern, is_replay in KERNELS:
            if wheels[which] is None:
                continue
            library = extract(wheels[which], library_name, Path(tmp))
            rows = []
            for arch in dict.fromkeys((args.arch, args.arch + "a" if not args.arch.endswith("a") else args.arch)):
                rows = sass_counts(library, pattern, arch)
                if rows:
                    break
            if not rows:
                print(f"{wheels[which].name}: no {pattern} kernel with {args.arch} SASS")
            for name, counts in rows:
                if not is_replay:
                    verdict = "op kernel (its FADDs are reductions): fingerprint only"
                elif counts["FADD"] == 0 and counts["FFMA"] and counts["FMUL"]:
                    verdict = "fused: S = fma(k, delta, fl(S * decay))"
                else:
                    verdict = "has FADD: the product and the add may be rounded separately; read the SASS"
                print(f"{wheels[which].name} {pattern} [{name[:60]}...]: {counts} -> {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
