"""Block-wise round-to-nearest weight quantization in the byte layout of ONNX Runtime's quantized ops.

A weight ``[rows, K]`` is cut along K into blocks of ``block_size`` (the last one zero-padded); each block
of each row gets a scale (and, asymmetric, a zero point) and its values become ``bits``-bit codes:

    dequantized = (code - zero_point) * scale

Symmetric blocks use the ops' default zero point Z = 2^(bits-1) and spend all 2^bits codes, as ONNX Runtime's
own block quantizer (and so onnxruntime-genai's builder) does: the block's value of largest magnitude over -Z is
the scale, so that value lands exactly on code 0 and its sign gets Z steps, the other sign Z - 1; a value of the
other sign beyond Z - 1/2 steps is clipped to code 2^bits - 1 (at most one step off). Against a scale of
max|w| / (Z - 1) (both signs exact, no clipping) the step is (Z - 1) / Z as large, and the codes are the builder's,
so the two exports' accuracy is compared like for like (docs/benchmarks-quantized-cpu.md#accuracy). Asymmetric
blocks span [min(w, 0), max(w, 0)] with ``2^bits - 1`` steps and a rounded zero point.

Codes are packed along K low bits first (two 4-bit codes a byte), which is ``com.microsoft::MatMulNBits`` B
``[N, k_blocks, blob]``, ``QMoE`` ``[E, N, K * bits / 8]`` and ``GatherBlockQuantized`` ``[V, K * bits / 8]``
alike; zero points are packed the same way along the blocks.
Scales are rounded to their stored type before the codes are computed, so the stored scale is the one the
codes were rounded against; the asymmetric zero point comes from the scale before that rounding, and halves round
up. Both as ONNX Runtime's own quantizer does: scales, zero points and codes equal its own bit for bit
(tests/exporter/test_quantize.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BITS = (4, 8)
BLOCK_SIZES = (32, 64, 128)
# How the packed codes of a logical weight are shaped for the op that reads them:
#   matmul   [N, K]    -> MatMulNBits B [N, k_blocks, blob], scales [N, k_blocks], zero points [N, zp_bytes]
#   gather   [V, K]    -> GatherBlockQuantized data [V, k_blocks * blob], scales and zero points as matmul
#   experts  [E, N, K] -> QMoE weights [E, N, k_blocks * blob], scales [E, N, k_blocks], zero points [E, N, zp_bytes]
#   columns  [E, N, K] -> QMoE without block_size (one block spans K): scales [E, N], zero points packed
#                         along N, [E, ceil(N * bits / 8)]
FORMS = ("matmul", "gather", "experts", "columns")


@dataclass(frozen=True)
class QuantSpec:
    bits: int = 4
    block_size: int = 32
    symmetric: bool = True

    def __post_init__(self):
        if self.bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {self.bits}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")

    @property
    def levels(self) -> int:
        return (1 << self.bits) - 1

    @property
    def default_zero_point(self) -> int:
        return 1 << (self.bits - 1)

    def blocks(self, k: int) -> int:
        return -(-k // self.block_size)

    def blob_bytes(self) -> int:
        """Bytes of one packed block (the block size times bits, rounded up to whole bytes)."""
        return -(-self.block_size * self.bits // 8)

    def zero_point_bytes(self, k: int) -> int:
        """Bytes of one row's packed zero points."""
        return -(-self.blocks(k) * self.bits // 8)


def stored_shapes(form: str, shape: tuple[int, ...], spec: QuantSpec
                  ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]:
    """(codes, scales, zero points or None) shapes of the logical weight ``shape`` [..., K] in ``form``."""
    *lead, k = shape
    nb, lead = spec.blocks(k), tuple(lead)
    zero = None if spec.symmetric else lead + (spec.zero_point_bytes(k),)
    if form == "matmul":
        return lead + (nb, spec.blob_bytes()), lead + (nb,), zero
    if form in ("gather", "experts"):
        return lead + (nb * spec.blob_bytes(),), lead + (nb,), zero
    if form == "columns":
        if nb != 1:
            raise ValueError(f"the columns form needs one block spanning K={k}, got block_size {spec.block_size}")
        columns = None if spec.symmetric else lead[:-1] + (-(-lead[-1] * spec.bits // 8),)
        return lead + (spec.blob_bytes(),), lead, columns
    raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")


def columns_zero_points(zero_points: np.ndarray, spec: QuantSpec, n: int) -> np.ndarray:
    """Per-row zero points of one-block rows [E * N, 1 byte] repacked along N: [E, ceil(N * bits / 8)]."""
    return pack(unpack(zero_points, spec.bits, 1).reshape(-1, n), spec.bits)


@dataclass(frozen=True)
class Quantized:
    codes: np.ndarray  # uint8 [rows, k_blocks, blob]
    scales: np.ndarray  # [rows, k_blocks] in the requested scale type
    zero_points: np.ndarray | None  # uint8 [rows, zero_point_bytes]; None when symmetric


def quantize(w: np.ndarray, spec: QuantSpec, scale_dtype=np.float32) -> Quantized:
    """Quantize the rows of ``w`` [rows, K]. The arithmetic is float64 for float64 input, else float32."""
    if w.ndim != 2:
        raise ValueError(f"quantize takes a [rows, K] matrix, got shape {list(w.shape)}")
    work = np.float64 if w.dtype == np.float64 else np.float32
    rows, k = w.shape
    nb, bs = spec.blocks(k), spec.block_size
    blocks = np.zeros((rows, nb * bs), work)
    blocks[:, :k] = w
    blocks = blocks.reshape(rows, nb, bs)
    if spec.symmetric:
        scale = _symmetric_scales(blocks, spec, scale_dtype)
        zero = np.full((rows, nb), spec.default_zero_point, work)
    else:
        lo = np.minimum(blocks.min(axis=-1), 0)
        hi = np.maximum(blocks.max(axis=-1), 0)
        exact = (hi - lo) / spec.levels
        scale = exact.astype(scale_dtype)
        # The zero point from the scale before it is stored, as ONNX Runtime's quantizer computes it.
        zero = np.clip(_round_half_up(-lo / np.where(exact == 0, 1, exact)), 0, spec.levels)
    safe = np.where(scale == 0, 1, scale.astype(work))  # an all-zero block: any scale codes it exactly
    codes = np.clip(_round_half_up(blocks / safe[..., None] + zero[..., None]), 0, spec.levels)
    packed = pack(codes.astype(np.uint8), spec.bits)
    zero_points = None if spec.symmetric else pack(zero.astype(np.uint8), spec.bits)
    return Quantized(packed, scale, zero_points)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    """Nearest integer, halves up: on the non-negative codes, ONNX Runtime's roundf (halves away from 0)."""
    return np.floor(x + 0.5)


def _symmetric_scales(blocks: np.ndarray, spec: QuantSpec, scale_dtype) -> np.ndarray:
    """Per block of ``blocks`` [rows, nb, bs]: the value of largest magnitude (ties: the negative one) over -Z, so
    that it lands on code 0 and its sign gets Z steps, the other sign Z - 1."""
    high, low = blocks.max(axis=-1), blocks.min(axis=-1)
    extreme = np.where(np.abs(high) > np.abs(low), high, low)
    return (extreme / -spec.default_zero_point + 0.0).astype(scale_dtype)  # + 0.0: an all-zero block gets +0


def dequantize(q: Quantized, spec: QuantSpec, k: int) -> np.ndarray:
    """float64 [rows, K] from a :func:`quantize` result (the padding of the last block dropped)."""
    rows, nb = q.scales.shape
    codes = unpack(q.codes, spec.bits, spec.block_size).astype(np.float64)  # [rows, nb, bs]
    if q.zero_points is None:
        zero = np.full((rows, nb), spec.default_zero_point, np.float64)
    else:
        zero = unpack(q.zero_points, spec.bits, nb).astype(np.float64)
    values = (codes - zero[..., None]) * q.scales.astype(np.float64)[..., None]
    return values.reshape(rows, -1)[:, :k]


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes < 2^bits packed along the last axis, low bits first (odd lengths padded with 0)."""
    if bits == 8:
        return np.ascontiguousarray(codes, np.uint8)
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4), np.uint8)


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` codes of each packed last axis."""
    if bits == 8:
        return packed[..., :count]
    both = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))
    return both[..., :count]
