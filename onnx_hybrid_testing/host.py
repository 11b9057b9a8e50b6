"""What the test host's CPU is, as far as the kernels under test choose by it."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags Linux reports (/proc/cpuinfo); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return frozenset()


def matmul_nbits_isa() -> str | None:
    """The key of ``CPU_ROW_INVARIANT_BY_ISA`` (exporter/graph/quantized.py) whose kernels ONNX Runtime's CPU
    MatMulNBits runs here: "AVX-512" (with VNNI), "AVX2" (with FMA, no AVX-512 and no AVX-VNNI), or None for
    CPUs whose kernels were not measured."""
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        return "AVX-512"
    if {"avx2", "fma"} <= flags and not flags & {"avx512f", "avx_vnni"}:
        return "AVX2"
    return None
