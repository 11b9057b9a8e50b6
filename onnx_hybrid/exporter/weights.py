"""Initializers as recipes over checkpoint tensors, written to external data block by block.

The graph builder never holds weight data. It asks :class:`Weights` for an initializer described as
row segments of checkpoint tensors (a fused projection is several whole tensors one after another; a
Qwen3-Next de-interleave is many small row ranges), an optional ``1 + w`` offset and a target dtype.
The writer then streams every recipe into the external data file in blocks of at most
``BLOCK_BYTES``, so peak memory is one block plus whatever one source slice maps, never the model.
A quantized recipe (``quant``) is quantized block by block as it streams: its packed codes are written as
they come, its scales and zero points (at most a quarter of the codes' bytes) after them. A recipe may pad
with zeros, exactly (``Segment.zeros`` rows, ``pad_columns``), where an op's layout needs whole blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

import numpy as np
import onnx_ir as ir

from .checkpoint import Checkpoint
from .errors import ExportError
from .quantize import QuantSpec, columns_zero_points, quantize, stored_shapes

BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of ``checkpoint[source][lead]``, flattened in row-major order; the ``ZERO_ROWS``
    source gives ``stop - start`` rows of zeros as long as the recipe's last axis."""

    source: str
    start: int
    stop: int
    lead: tuple[int, ...] = ()

    @classmethod
    def zeros(cls, rows: int) -> Segment:
        return cls(ZERO_ROWS, 0, rows)


ZERO_ROWS = ""


@dataclass
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    segments: list[Segment]
    add_one: bool = False  # zero-centred RMSNorm weight: store 1 + w (computed in fp32)
    interleave_pairs: bool = False  # segments (a, b), (c, d), ... written as rows a0 b0 a1 b1 ... c0 d0 ...
    pad_columns: bool = False  # source rows shorter than the last axis, zero-filled at their end
    value: ir.Value = field(default=None, repr=False)
    # Block-quantized rows along the last axis of ``shape``: ``value`` holds the packed codes, ``dtype`` is the
    # scales' type, ``form`` the op layout (quantize.FORMS).
    quant: QuantSpec | None = None
    form: str = "matmul"
    scales: ir.Value = field(default=None, repr=False)
    zero_points: ir.Value = field(default=None, repr=False)

    def values(self) -> list[ir.Value]:
        """The initializers this recipe writes, in file order."""
        return [v for v in (self.value, self.scales, self.zero_points) if v is not None]


@dataclass(frozen=True)
class QuantizedWeight:
    """A block-quantized [..., N, K] weight as initializers: packed codes, scales, zero points (asymmetric)."""

    codes: ir.Value
    scales: ir.Value
    zero_points: ir.Value | None
    spec: QuantSpec
    shape: tuple[int, ...]  # the logical weight's shape
    form: str  # quantize.FORMS


_IR_DTYPES = {np.dtype(np.float32): ir.DataType.FLOAT, np.dtype(np.float16): ir.DataType.FLOAT16}


def ir_dtype(dtype: np.dtype) -> ir.DataType:
    if dtype in _IR_DTYPES:
        return _IR_DTYPES[dtype]
    return ir.DataType.from_numpy(dtype)


class Weights:
    """Collects initializer recipes; checks every source tensor's shape when a recipe is added."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint
        self.plans: dict[str, TensorPlan] = {}

    def require(self, source: str, shape: Iterable[int]) -> None:
        stored = self.checkpoint.get(source)
        if stored.shape != tuple(shape):
            raise ExportError(f"tensor {source!r} has shape {list(stored.shape)}, expected {list(shape)}")

    def tensor(self, name: str, source: str, shape: Iterable[int], dtype, *, add_one: bool = False,
               stored_shape: Iterable[int] | None = None) -> ir.Value:
        """A whole checkpoint tensor (``stored_shape`` when the graph views it with another shape)."""
        shape = tuple(shape)
        self.require(source, shape if stored_shape is None else stored_shape)
        rows = self.checkpoint.get(source).shape[0]
        return self.add(TensorPlan(name, shape, np.dtype(dtype), [Segment(source, 0, rows)], add_one))

    def rows(self, name: str, segments: list[Segment], shape: Iterable[int], dtype, *,
             interleave_pairs: bool = False) -> ir.Value:
        """Row segments of (already shape-checked) tensors, concatenated (or interleaved pairwise)."""
        return self.add(TensorPlan(name, tuple(shape), np.dtype(dtype), segments, interleave_pairs=interleave_pairs))

    def quantized(self, name: str, segments: list[Segment], shape: Iterable[int], scale_dtype, spec: QuantSpec,
                  form: str = "matmul", *, interleave_pairs: bool = False, pad_columns: bool = False
                  ) -> QuantizedWeight:
        """Row segments of (already shape-checked) tensors, concatenated (or interleaved pairwise) as for
        :meth:`rows`, zero-filled to the last axis of ``shape`` with ``pad_columns``, then block-quantized along
        the last axis; ``name`` gets suffixes per initializer."""
        shape = tuple(shape)
        codes_name = f"{name}_Q{spec.bits}"
        if codes_name not in self.plans:
            plan = TensorPlan(codes_name, shape, np.dtype(scale_dtype), segments, interleave_pairs=interleave_pairs,
                              pad_columns=pad_columns, quant=spec, form=form)
            codes, scales, zeros = stored_shapes(form, shape, spec)
            plan.value = _value(codes_name, codes, ir.DataType.UINT8)
            plan.scales = _value(f"{name}_scales", scales, ir_dtype(plan.dtype))
            plan.zero_points = None if zeros is None else _value(f"{name}_zero_points", zeros, ir.DataType.UINT8)
            self.plans[codes_name] = plan
        plan = self.plans[codes_name]
        return QuantizedWeight(plan.value, plan.scales, plan.zero_points, spec, shape, form)

    def add(self, plan: TensorPlan) -> ir.Value:
        if plan.name in self.plans:
            return self.plans[plan.name].value
        plan.value = _value(plan.name, plan.shape, ir_dtype(plan.dtype))
        self.plans[plan.name] = plan
        return plan.value


def _value(name: str, shape, dtype: ir.DataType) -> ir.Value:
    return ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype))


def write_external_data(weights: Weights, path: Path, on_tensor: Callable[[TensorPlan], None] = lambda p: None) -> None:
    """Write every recipe to ``path`` and attach an ``ir.ExternalTensor`` to its value."""
    offset = 0
    with open(path, "wb") as out:
        for plan in weights.plans.values():
            offset = _align(out, offset)
            if plan.quant is None:
                offset = _attach(plan.value, path, offset, _write_plan(weights.checkpoint, plan, out))
            else:
                written, extras = _write_quantized(weights.checkpoint, plan, out)
                offset = _attach(plan.value, path, offset, written)
                for value, data in extras:
                    offset = _align(out, offset)
                    offset = _attach(value, path, offset, _write(out, data))
            on_tensor(plan)


def _nbytes(value: ir.Value) -> int:
    return int(math.prod(value.shape.numpy()) * value.dtype.itemsize)


def _attach(value: ir.Value, path: Path, offset: int, written: int) -> int:
    """Point ``value`` at the ``written`` bytes at ``offset`` of ``path``; return the offset after them."""
    if written != _nbytes(value):
        raise ExportError(f"{value.name}: wrote {written} bytes, expected {_nbytes(value)} for shape "
                          f"{list(value.shape.numpy())}")
    value.const_value = ir.ExternalTensor(path.name, offset, written, value.dtype, shape=value.shape,
                                          name=value.name, base_dir=path.parent)
    return offset + written


def _align(out: BinaryIO, offset: int, alignment: int = 64) -> int:
    pad = -offset % alignment
    out.write(b"\0" * pad)
    return offset + pad


def _write(out: BinaryIO, data: np.ndarray) -> int:
    data = np.ascontiguousarray(data)
    out.write(data.view(np.uint8).data)  # a byte view: buffers cannot carry bf16
    return data.nbytes


def _blocks(checkpoint: Checkpoint, plan: TensorPlan, element_bytes: int):
    """The recipe's rows in order, a block of at most BLOCK_BYTES (at ``element_bytes`` per element) at a time."""
    groups = (list(zip(plan.segments[::2], plan.segments[1::2])) if plan.interleave_pairs
              else [(seg,) for seg in plan.segments])
    for group in groups:
        first = group[0]
        if first.source == ZERO_ROWS:
            yield np.zeros((first.stop - first.start, len(group) * plan.shape[-1]), np.float32)
            continue
        stored = checkpoint.get(first.source)
        row_bytes = math.prod(stored.shape[len(first.lead) + 1:]) * element_bytes * len(group)
        step = max(1, BLOCK_BYTES // max(row_bytes, 1))
        for offset in range(0, first.stop - first.start, step):
            blocks = [checkpoint.read(seg.source, seg.lead + (slice(seg.start + offset,
                                                                    min(seg.start + offset + step, seg.stop)),))
                      for seg in group]
            block = blocks[0] if len(blocks) == 1 else np.stack(blocks, axis=1)  # rows a0 b0 a1 b1 ...
            if plan.add_one:
                block = block.astype(np.float32) + np.float32(1.0)
            if plan.pad_columns:
                block = np.pad(block.astype(np.float32, copy=False),
                               [(0, 0)] * (block.ndim - 1) + [(0, plan.shape[-1] - block.shape[-1])])
            yield block


def _write_plan(checkpoint: Checkpoint, plan: TensorPlan, out: BinaryIO) -> int:
    return sum(_write(out, block.astype(plan.dtype, copy=False))
               for block in _blocks(checkpoint, plan, max(plan.dtype.itemsize, 4)))


# Bytes per weight element while a block is quantized: the fp32 rows, their padded copy and the codes' temporaries.
QUANTIZE_ELEMENT_BYTES = 16


def _write_quantized(checkpoint: Checkpoint, plan: TensorPlan, out: BinaryIO
                     ) -> tuple[int, list[tuple[ir.Value, np.ndarray]]]:
    """Stream the packed codes of a quantized recipe into ``out``; return their byte count and the scales and
    zero points collected meanwhile, to be written after them."""
    k, scales, zeros, written = plan.shape[-1], [], [], 0
    for block in _blocks(checkpoint, plan, QUANTIZE_ELEMENT_BYTES):
        q = quantize(np.asarray(block, np.float32).reshape(-1, k), plan.quant, plan.dtype)
        written += _write(out, q.codes)
        scales.append(q.scales)
        if q.zero_points is not None:
            zeros.append(q.zero_points)
    extras = [(plan.scales, np.concatenate(scales))]
    if plan.zero_points is not None:
        zero_points = np.concatenate(zeros)
        if plan.form == "columns":
            zero_points = columns_zero_points(zero_points, plan.quant, plan.shape[-2])
        extras.append((plan.zero_points, zero_points))
    return written, extras
