"""Initializers as recipes over checkpoint tensors, written to external data block by block.

The graph builder never holds weight data. It asks :class:`Weights` for an initializer described as
row segments of checkpoint tensors (a fused projection is several whole tensors one after another; a
Qwen3-Next de-interleave is many small row ranges), an optional ``1 + w`` offset and a target dtype.
The writer then streams every recipe into the external data file in blocks of at most
``BLOCK_BYTES``, so peak memory is one block plus whatever one source slice maps, never the model.
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

BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of ``checkpoint[source][lead]``, flattened in row-major order."""

    source: str
    start: int
    stop: int
    lead: tuple[int, ...] = ()


@dataclass
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    segments: list[Segment]
    add_one: bool = False  # zero-centred RMSNorm weight: store 1 + w (computed in fp32)
    interleave_pairs: bool = False  # segments (a, b), (c, d), ... written as rows a0 b0 a1 b1 ... c0 d0 ...
    value: ir.Value = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


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

    def add(self, plan: TensorPlan) -> ir.Value:
        if plan.name in self.plans:
            return self.plans[plan.name].value
        plan.value = ir.Value(name=plan.name, shape=ir.Shape(plan.shape), type=ir.TensorType(ir_dtype(plan.dtype)))
        self.plans[plan.name] = plan
        return plan.value


def write_external_data(weights: Weights, path: Path, on_tensor: Callable[[TensorPlan], None] = lambda p: None) -> None:
    """Write every recipe to ``path`` and attach an ``ir.ExternalTensor`` to its value."""
    offset = 0
    with open(path, "wb") as out:
        for plan in weights.plans.values():
            offset = _align(out, offset)
            written = _write_plan(weights.checkpoint, plan, out)
            if written != plan.nbytes:
                raise ExportError(f"{plan.name}: wrote {written} bytes, expected {plan.nbytes} for shape "
                                  f"{list(plan.shape)}")
            plan.value.const_value = ir.ExternalTensor(
                path.name, offset, written, ir_dtype(plan.dtype), shape=ir.Shape(plan.shape), name=plan.name,
                base_dir=path.parent)
            offset += written
            on_tensor(plan)


def _align(out: BinaryIO, offset: int, alignment: int = 64) -> int:
    pad = -offset % alignment
    out.write(b"\0" * pad)
    return offset + pad


def _write_plan(checkpoint: Checkpoint, plan: TensorPlan, out: BinaryIO) -> int:
    written = 0
    groups = (list(zip(plan.segments[::2], plan.segments[1::2])) if plan.interleave_pairs
              else [(seg,) for seg in plan.segments])
    for group in groups:
        first = group[0]
        stored = checkpoint.get(first.source)
        row_bytes = math.prod(stored.shape[len(first.lead) + 1:]) * max(plan.dtype.itemsize, 4) * len(group)
        step = max(1, BLOCK_BYTES // max(row_bytes, 1))
        for offset in range(0, first.stop - first.start, step):
            blocks = [checkpoint.read(seg.source, seg.lead + (slice(seg.start + offset,
                                                                    min(seg.start + offset + step, seg.stop)),))
                      for seg in group]
            block = blocks[0] if len(blocks) == 1 else np.stack(blocks, axis=1)  # rows a0 b0 a1 b1 ...
            if plan.add_one:
                block = block.astype(np.float32) + np.float32(1.0)
            data = np.ascontiguousarray(block.astype(plan.dtype, copy=False))
            out.write(data.view(np.uint8).data)  # a byte view: buffers cannot carry bf16
            written += data.nbytes
    return written
