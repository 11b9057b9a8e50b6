"""The library's C entry points outside ONNX Runtime (native/ort/c_api.h), mirrored for ctypes.

* The shape checks of each op on input shapes alone, and the checks of host-resident offsets (and PagedAttention's
  past lengths and block table): the library's (``native/shapes/``), which ORT's kernels run too, so
  :func:`resolve_gdn` / :func:`resolve_conv` / :func:`resolve_paged_attention` / :func:`check_offsets` /
  :func:`check_paged_rows` here and in ``contract`` give the kernels' verdicts and messages by construction.
* The call structs of ``onnx_hybrid.cuda_ops`` (GatedDeltaNet and the conv on arrays the caller owns).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
from typing import Any, Mapping, Sequence

from . import contract, library

MAX_RANK = 8  # OH_MAX_RANK
CONTRACT_VIOLATION = -2  # the entry points' code for a contract rejection (its message in onnx_hybrid_last_error)
GDN_LAYOUTS = ("ragged", "uniform", "rank4", "packed_ragged", "packed_uniform", "packed_rank3")


ELEMENT_TYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}  # OhArray.elem_type and the calls' type
# The same codes by ONNX element type name (float for float32).
ONNX_TYPE_CODES = {"float" if name == "float32" else name: code for name, code in ELEMENT_TYPE_CODES.items()}


class Array(ctypes.Structure):  # OhArray
    _fields_ = [("data", ctypes.c_void_p), ("dims", ctypes.c_int64 * MAX_RANK), ("rank", ctypes.c_int32),
                ("elem_type", ctypes.c_int32)]

    def set(self, shape: Sequence[int] | None, data: int | None = None, elem_type: int = 0) -> None:
        """Present (``data``, or a non-null stand-in when only the shape matters) with ``shape`` and element type
        (ELEMENT_TYPE_CODES; read only for the ports that allow more than one), or absent."""
        if shape is None:
            self.data = None
            return
        if len(shape) > MAX_RANK:
            raise ValueError(f"a shape of rank {len(shape)} (at most {MAX_RANK})")
        self.data = data or 1
        self.elem_type = elem_type
        self.rank = len(shape)
        for i, d in enumerate(shape):
            self.dims[i] = d


class GdnCall(ctypes.Structure):  # OhGdnCall
    _fields_ = [("inputs", Array * len(contract.GATED_DELTA_NET.inputs)), ("type", ctypes.c_int32),
                ("engine", ctypes.c_int32), ("rec_rows", ctypes.c_int32), ("rec_groups", ctypes.c_int32),
                ("scan_width", ctypes.c_int32), ("prep_heads", ctypes.c_int32), ("only_kernels", ctypes.c_char_p),
                ("update_rule", ctypes.c_char_p), ("gate_activation", ctypes.c_char_p),
                ("beta_activation", ctypes.c_char_p), ("scale", ctypes.c_float), ("qk_l2_norm", ctypes.c_int64),
                ("chunk_size", ctypes.c_int64), ("state_update_capacity", ctypes.c_int64),
                ("outputs", ctypes.c_void_p * 3), ("stream", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_int64), ("output_dims", (ctypes.c_int64 * 4) * 3),
                ("output_ranks", ctypes.c_int32 * 3), ("workspace_needed", ctypes.c_int64)]

    def set_attributes(self, attrs: Mapping[str, Any]) -> None:
        """The resolved attributes (contract.resolve_attributes)."""
        self.update_rule = attrs["update_rule"].encode()
        self.gate_activation = attrs["gate_activation"].encode()
        self.beta_activation = attrs["beta_activation"].encode()
        self.scale = attrs["scale"]
        self.qk_l2_norm, self.chunk_size = attrs["qk_l2_norm"], attrs["chunk_size"]
        self.state_update_capacity = attrs["state_update_capacity"]


class ConvCall(ctypes.Structure):  # OhConvCall
    _fields_ = [("inputs", Array * len(contract.VARLEN_CAUSAL_CONV.inputs)), ("type", ctypes.c_int32),
                ("only_kernels", ctypes.c_char_p), ("activation", ctypes.c_char_p), ("dilation", ctypes.c_int64),
                ("state_update_capacity", ctypes.c_int64), ("outputs", ctypes.c_void_p * 3),
                ("stream", ctypes.c_void_p), ("output_dims", (ctypes.c_int64 * 4) * 3),
                ("output_ranks", ctypes.c_int32 * 3)]

    def set_attributes(self, attrs: Mapping[str, Any]) -> None:
        self.activation = attrs["activation"].encode()
        self.dilation, self.state_update_capacity = attrs["dilation"], attrs["state_update_capacity"]


class PagedAttentionCall(ctypes.Structure):  # OhPagedAttentionCall
    _fields_ = [("inputs", Array * len(contract.PAGED_ATTENTION.inputs)), ("num_heads", ctypes.c_int64),
                ("kv_num_heads", ctypes.c_int64), ("scale", ctypes.c_float)]


class GdnGeometryOut(ctypes.Structure):  # OhGdnGeometry
    _fields_ = [("layout", ctypes.c_int32), ("per_key_decay", ctypes.c_int32), ("capacity", ctypes.c_int32),
                ("output_rank", ctypes.c_int32)] + [
        (name, ctypes.c_int64) for name in ("batch", "total_tokens", "num_heads_q", "num_heads_k", "num_heads_v",
                                            "head_size_k", "head_size_v", "capsule_width")] + [
        ("output_dims", ctypes.c_int64 * 4)]


class ConvGeometryOut(ctypes.Structure):  # OhConvGeometry
    _fields_ = [(name, ctypes.c_int64) for name in ("batch", "total_tokens", "channels", "kernel_size",
                                                    "state_length", "capacity")]


class PagedAttentionGeometryOut(ctypes.Structure):  # OhPagedAttentionGeometry
    _fields_ = [(name, ctypes.c_int64) for name in ("batch", "num_tokens", "num_heads", "kv_num_heads", "head_size",
                                                    "num_blocks", "block_size", "max_num_blocks")] + [
        ("scale", ctypes.c_float)]  # the kernels' float; resolve_paged_attention keeps the double


def _shapes(call, op: contract.OpSpec, shapes: Mapping[str, Sequence[int] | None]) -> None:
    for i, port in enumerate(op.inputs):
        shape = shapes.get(port.name)
        call.inputs[i].set(None if shape is None else tuple(int(d) for d in shape))


def _resolve(entry, call, out, op: str):
    _raise_on(entry(ctypes.byref(call), ctypes.byref(out)), op)
    return out


def resolve_gdn(shapes: Mapping[str, Sequence[int] | None], attributes: Mapping[str, Any],
                types: Mapping[str, str | None] | None = None) -> contract.GdnGeometry:
    """GatedDeltaNet's geometry from input shapes (None or missing: absent) and resolved attributes, or the
    library's ContractError. ``types`` (ONNX element type names): where the query's is an activation type, the
    gate ports' are checked against it (a gate of unknown type is taken to agree with the other)."""
    call = GdnCall()
    _shapes(call, contract.GATED_DELTA_NET, shapes)
    call.set_attributes(attributes)
    activation = ONNX_TYPE_CODES.get((types or {}).get("query"))
    if activation is not None:
        call.type = activation
        gates = {p.index: types.get(p.name) for p in contract.GATED_DELTA_NET.inputs if p.type == "gate"}
        fallback = next((t for t in gates.values() if t is not None), "float")
        for index, name in gates.items():
            call.inputs[index].elem_type = ONNX_TYPE_CODES.get(name or fallback, -1)
    g = _resolve(library.control().onnx_hybrid_resolve_gdn, call, GdnGeometryOut(), contract.GATED_DELTA_NET.name)
    return contract.GdnGeometry(
        layout=GDN_LAYOUTS[g.layout], batch=g.batch, total_tokens=g.total_tokens, num_heads_q=g.num_heads_q,
        num_heads_k=g.num_heads_k, num_heads_v=g.num_heads_v, head_size_k=g.head_size_k, head_size_v=g.head_size_v,
        per_key_decay=bool(g.per_key_decay), capacity=g.capacity,
        output_shape=tuple(g.output_dims[:g.output_rank]),
        state_shape=(g.batch, g.num_heads_v, g.head_size_v, g.head_size_k), capsule_width=g.capsule_width)


def resolve_conv(shapes: Mapping[str, Sequence[int] | None], attributes: Mapping[str, Any]) -> contract.ConvGeometry:
    call = ConvCall()
    _shapes(call, contract.VARLEN_CAUSAL_CONV, shapes)
    call.set_attributes(attributes)
    g = _resolve(library.control().onnx_hybrid_resolve_conv, call, ConvGeometryOut(), contract.VARLEN_CAUSAL_CONV.name)
    return contract.ConvGeometry(batch=g.batch, total_tokens=g.total_tokens, channels=g.channels,
                                 kernel_size=g.kernel_size, state_length=g.state_length, capacity=g.capacity)


def resolve_paged_attention(shapes: Mapping[str, Sequence[int] | None],
                            attributes: Mapping[str, Any]) -> contract.PagedAttentionGeometry:
    call = PagedAttentionCall()
    _shapes(call, contract.PAGED_ATTENTION, shapes)
    call.num_heads, call.kv_num_heads, call.scale = (attributes["num_heads"], attributes["kv_num_heads"],
                                                     attributes["scale"])
    g = _resolve(library.control().onnx_hybrid_resolve_paged_attention, call, PagedAttentionGeometryOut(),
                 contract.PAGED_ATTENTION.name)
    return contract.PagedAttentionGeometry(
        batch=g.batch, num_tokens=g.num_tokens, num_heads=g.num_heads, kv_num_heads=g.kv_num_heads,
        head_size=g.head_size, num_blocks=g.num_blocks, block_size=g.block_size, max_num_blocks=g.max_num_blocks,
        scale=attributes["scale"] or 1.0 / math.sqrt(g.head_size))  # in double precision, for the reference


def check_offsets(op: str, offsets: Sequence[int], total_tokens: int) -> list[tuple[int, int]]:
    """Host-resident offsets of GatedDeltaNet or the conv checked as the CPU kernels check them; (start, length) per
    request."""
    arr = np.ascontiguousarray(offsets, dtype=np.int32).reshape(-1)
    batch = len(arr) - 1
    if batch < 1:
        raise ValueError(f"{op}: offsets must hold at least 2 values, got {len(arr)}")
    rows = np.empty(2 * max(batch, 0), dtype=np.int64)
    code = library.control().onnx_hybrid_check_offsets(op.encode(), arr.ctypes.data, batch, total_tokens,
                                                       rows.ctypes.data)
    _raise_on(code, op)
    return [(int(rows[2 * b]), int(rows[2 * b + 1])) for b in range(batch)]


def check_paged_rows(geo: contract.PagedAttentionGeometry, offsets: Sequence[int], past: Sequence[int],
                     block_table) -> list[tuple[int, int, int]]:
    """PagedAttention's offsets, past lengths and the block_table columns each request reaches, checked as its CPU
    kernel checks them; (start, length, past) per request."""
    g = PagedAttentionGeometryOut(geo.batch, geo.num_tokens, geo.num_heads, geo.kv_num_heads, geo.head_size,
                                  geo.num_blocks, geo.block_size, geo.max_num_blocks, geo.scale)
    arrays = [np.ascontiguousarray(offsets, dtype=np.int32), np.ascontiguousarray(past, dtype=np.int32),
              np.ascontiguousarray(block_table, dtype=np.int32).reshape(geo.batch, geo.max_num_blocks)]
    rows = np.empty(3 * geo.batch, dtype=np.int64)
    code = library.control().onnx_hybrid_check_paged_rows(ctypes.addressof(g), *(a.ctypes.data for a in arrays),
                                                          rows.ctypes.data)
    _raise_on(code, contract.PAGED_ATTENTION.name)
    return [tuple(int(v) for v in rows[3 * b:3 * b + 3]) for b in range(geo.batch)]


def _raise_on(code: int, op: str) -> None:
    if code == CONTRACT_VIOLATION:
        raise contract.ContractError.from_library(op)
    if code != 0:
        raise ValueError(library.control().onnx_hybrid_last_error().decode())
