"""Print the C++ header with the launch constants of onnx_hybrid/cuda_ops/plan.py.

plan.py is the one place that states block sizes, shared memory and which kernel variants exist; the
library's C++ launcher must not restate them, so the build reads the module-level constants out of plan.py
(``ast.literal_eval``: plan.py imports the package, which is not installed yet at build time) and the
launcher includes the result. The parameter structs themselves are shared as a header
(ops/native/cuda/kernels/params.cuh); tests/cuda/test_native_cuda_cpu.py checks the launcher's plans against plan.py's.

Usage: python gen_cuda_plan_header.py > HEADER   (the build writes it only when it changed)
"""

from __future__ import annotations

import ast
import pathlib
import sys

PLAN_PATH = pathlib.Path(__file__).resolve().parents[3] / "cuda_ops" / "plan.py"
# plan.TYPE_SUFFIX keys in the order of the library's ElemType enum (kFloat, kFloat16, kBFloat16).
ELEM_TYPES = ("float32", "float16", "bfloat16")


def plan_constants(source: str) -> dict[str, object]:
    """Module-level UPPER_CASE assignments whose values are literals (tuple targets unpacked)."""
    found = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        if isinstance(target, ast.Name) and target.id.isupper():
            found[target.id] = value
        elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            found.update(zip((e.id for e in target.elts), value))
    return found


def ints(values) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def render(c: dict[str, object]) -> str:
    keys = tuple(c["REC_KEY_SIZES"])
    for name in ("REC_ROW_VARIANTS", "REC_ROWS_LARGE", "REC_ROWS_SMALL", "REC_BLOCK_TOKENS"):
        if tuple(c[name]) != keys:
            raise SystemExit(f"plan.py: {name} keys {tuple(c[name])} differ from REC_KEY_SIZES {keys}")
    decode = c["REC_DECODE_ROWS"]
    if not set(decode) <= set(keys):
        raise SystemExit(f"plan.py: REC_DECODE_ROWS keys {tuple(decode)} are not all in REC_KEY_SIZES {keys}")
    widest = max(len(v) for v in c["REC_ROW_VARIANTS"].values())

    def padded(rows):
        return ints(tuple(rows) + (0,) * (widest - len(rows)))
    variants = ", ".join(padded(v) for v in c["REC_ROW_VARIANTS"].values())
    decode_rows = ", ".join(padded(decode.get(k, ())) for k in keys)
    scalars = ("REC_WARPS", "REC_MIN_BLOCKS", "CHUNK_D", "CHUNK_VT", "CHUNK_THREADS", "CHUNK_TOKENS",
               "CHUNK_VT_WIDE", "CHUNK_NARROW_MAX_BLOCKS", "CHUNK_SMEM_BYTES", "CHUNK_WIDE_SMEM_BYTES",
               "CHUNK_WGMMA_ARCH", "CHUNK_WGMMA_SMEM_BYTES", "CHUNK_WGMMA_WIDE_SMEM_BYTES",
               "CHUNK_WGMMA_PRODUCER_THREADS",
               "CHUNK_PREP_SMEM_BYTES", "CHUNK_PREP_SHARED_MIN_BLOCKS",
               "CONV_THREADS", "CONV_TOKENS", "CONV_MEDIUM_TOKENS", "CONV_LONG_TOKENS",
               "CONV_SHORT_TOKENS", "CONV_ROW_TOKENS", "CONV_VECTOR_BYTES", "REC_MAX_WARP_ROWS", "REPLAY_WARPS",
               "REPLAY_ROWS")
    lines = [
        "// Generated from onnx_hybrid/cuda_ops/plan.py by gen_cuda_plan_header.py. Do not edit.",
        "#pragma once",
        "",
        "namespace onnx_hybrid {",
        "namespace cuda_plan {",
        "",
        *(f"inline constexpr int k{''.join(p.capitalize() for p in n.split('_'))} = {int(c[n])};" for n in scalars),
        f"inline constexpr int kRecKeySizes[] = {ints(keys)};",
        "// Per key size (kRecKeySizes order): the instantiated rows per warp (0 = none) and the defaults.",
        f"inline constexpr int kRecRowVariants[][{widest}] = {{{variants}}};",
        f"inline constexpr int kRecRowsLarge[] = {ints(c['REC_ROWS_LARGE'].values())};",
        f"inline constexpr int kRecRowsSmall[] = {ints(c['REC_ROWS_SMALL'].values())};",
        "// Per key size: the most tokens per row whose prologue a general kernel's block runs in one pass.",
        f"inline constexpr int kRecBlockTokens[] = {ints(c['REC_BLOCK_TOKENS'].values())};",
        "// Per key size: the rows per warp with a `_decode` instantiation (0 = none), for the types marked 1 in",
        "// kRecDecodeTypes (ElemType order).",
        f"inline constexpr int kRecDecodeRows[][{widest}] = {{{decode_rows}}};",
        f"inline constexpr int kRecDecodeTypes[] = {ints(t in c['REC_DECODE_TYPES'] for t in ELEM_TYPES)};",
        "// Kernel name suffix per ElemType (kFloat, kFloat16, kBFloat16).",
        "inline constexpr const char* kTypeSuffix[] = {"
        + ", ".join(f'"{c["TYPE_SUFFIX"][t]}"' for t in ELEM_TYPES) + "};",
        "",
        "}  // namespace cuda_plan",
        "}  // namespace onnx_hybrid",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    sys.stdout.write(render(plan_constants(PLAN_PATH.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
