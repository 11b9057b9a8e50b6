"""Python API of the CUDA kernels, with the operator contract's inputs, outputs and attributes.

``feeds`` uses the contract's input names, like an ORT feed dict; arrays live on the GPU (CuPy, or anything
exposing ``__cuda_array_interface__`` / ``__dlpack__``), except ``state_update_active``, which is a host value
(docs/op-contract.md#gateddeltanet-inputs-and-outputs). Shapes are checked with ``contract.resolve_gdn`` /
``resolve_conv`` (same messages).
Nothing here synchronises with the host: offsets and capture counts stay on the device.

``outputs`` may hold preallocated outputs by name (``final_state`` may be ``initial_state`` itself: the kernels
are alias-safe); missing ones are allocated with CuPy. Pass preallocated outputs (and, for GatedDeltaNet, a
``workspace``) when capturing CUDA graphs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..ops import contract
from . import launch, plan
from .tensors import DeviceTensor, as_device_tensor, empty, stream_pointer

_FLOAT_INPUTS = ("decay", "beta", "initial_state", "a_log", "dt_bias")
_INT_INPUTS = ("cu_seqlens", "capture_count")


def _tensors(op: contract.OpSpec, feeds: Mapping[str, Any], host: tuple[str, ...] = ()) -> dict:
    unknown = set(feeds) - {p.name for p in op.inputs}
    if unknown:
        raise KeyError(f"{op.name}: unknown input(s) {sorted(unknown)}")
    return {p.name: (None if feeds.get(p.name) is None or p.name in host else as_device_tensor(feeds[p.name], p.name))
            for p in op.inputs}


def _check_device(op: str, tensors: Mapping[str, DeviceTensor | None], device: int) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{op}: {name} is on device {t.device}, the other inputs on device {device}")


def _check_type(op: str, name: str, t: DeviceTensor | None, expected: tuple[str, ...]) -> None:
    if t is not None and t.dtype not in expected:
        raise TypeError(f"{op}: {name} must be {' or '.join(expected)}, got {t.dtype}")


def _output(outputs: Mapping[str, Any], name: str, shape, dtype: str, device: int, op: str):
    given = outputs.get(name)
    if given is None:
        arr = empty(shape, dtype, device)
        return arr, as_device_tensor(arr, name)
    t = as_device_tensor(given, name)
    if t.shape != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{op}: output {name} must be {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}")
    return given, t


def _ptr(t: DeviceTensor | None) -> int | None:
    return None if t is None else t.ptr


def _host_flag(value: Any) -> int | None:
    if value is None:
        return None
    if hasattr(value, "__cuda_array_interface__") or type(value).__module__.startswith("cupy"):
        raise TypeError("GatedDeltaNet: state_update_active lives in host memory (a Python int or a NumPy "
                        "int32 [1]), got a device array")
    import numpy as np

    arr = np.asarray(value, dtype=np.int32).reshape(-1)
    if arr.shape != (1,):
        raise contract.ContractError(contract.GATED_DELTA_NET.name, "gdn_active_shape", list(arr.shape))
    return int(arr[0])


def _scratch(workspace: Any, nbytes: int, device: int, stream: int) -> DeviceTensor:
    """The chunked engine's workspace: the caller's buffer, or one from CuPy's pool on ``stream`` (the pool
    reuses a freed block only for later work on the same stream, so it may be freed when this call returns)."""
    if workspace is not None:
        t = as_device_tensor(workspace, "workspace")
        if t.nbytes < nbytes or t.device != device:
            raise ValueError(f"GatedDeltaNet: workspace must hold {nbytes} bytes on device {device}, got "
                             f"{t.nbytes} bytes on device {t.device}")
        return t
    import cupy

    with cupy.cuda.Device(device), cupy.cuda.Stream.from_external(_StreamHandle(stream)):
        return as_device_tensor(cupy.empty(-(-nbytes // 4), dtype=cupy.int32), "workspace")


class _StreamHandle:
    """A raw stream handle in the CUDA stream protocol, for CuPy's Stream.from_external (ExternalStream is
    deprecated from CuPy 14)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def gated_delta_net(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None, stream: Any = None,
                    workspace: Any = None, engine: str = "auto", rec_rows: int | None = None,
                    rec_groups: int | None = None, scan_width: int | None = None, prep_heads: int | None = None,
                    **attributes):
    """Run GatedDeltaNet; returns (output, final_state, state_update) as device arrays.

    ``workspace``: a contiguous device array (any element type of the contract) of at least
    ``plan.chunk_workspace_bytes(geometry)`` bytes for the chunked kernels, or None to take one from CuPy's
    pool (not possible inside a CUDA graph capture).
    ``engine`` (auto | chunked | recurrent), ``rec_rows``, ``rec_groups``, ``scan_width`` and ``prep_heads`` are
    test and tuning knobs of ``plan.gdn_plan``."""
    op = contract.GATED_DELTA_NET.name
    attrs = contract.resolve_attributes(contract.GATED_DELTA_NET, attributes)
    t = _tensors(contract.GATED_DELTA_NET, feeds, host=("state_update_active",))
    active = _host_flag(feeds.get("state_update_active"))
    shapes = {name: (None if x is None else x.shape) for name, x in t.items()}
    shapes["state_update_active"] = None if active is None else (1,)
    geo = contract.resolve_gdn(shapes, attrs)

    q = t["query"]
    act_types = ("float32", "float16", "bfloat16")
    _check_type(op, "query", q, act_types)
    for name in ("key", "value"):
        if t[name] is not None and t[name].dtype != q.dtype:
            raise TypeError(f"{op}: {name} must have the query's element type {q.dtype}, got {t[name].dtype}")
    for name in _FLOAT_INPUTS:
        _check_type(op, name, t[name], ("float32",))
    for name in _INT_INPUTS:
        _check_type(op, name, t[name], ("int32",))
    device = q.device
    _check_device(op, t, device)

    outputs = dict(outputs or {})
    out_arr, out_t = _output(outputs, "output", geo.output_shape, q.dtype, device, op)
    state_arr, state_t = _output(outputs, "final_state", geo.state_shape, "float32", device, op)
    cap_arr, cap_t = _output(outputs, "state_update", (geo.batch, geo.capsule_width), "float32", device, op)

    has_decay, has_delta = contract.UPDATE_RULES[attrs["update_rule"]]
    es = 2 if q.dtype != "float32" else 4
    hq, hk, hv, dk, dv = geo.num_heads_q, geo.num_heads_k, geo.num_heads_v, geo.head_size_k, geo.head_size_v
    if geo.packed:
        width = 2 * hq * dk + hv * dv
        qp, kp, vp = q.ptr, q.ptr + hq * dk * es, q.ptr + 2 * hq * dk * es
        qs = ks = vs = width
    else:
        qp, kp, vp = q.ptr, t["key"].ptr, t["value"].ptr
        qs, ks, vs = hq * dk, hk * dk, hv * dv
    scale = attrs["scale"] if attrs["scale"] != 0.0 else 1.0 / math.sqrt(dk)
    params = plan.GdnParams(
        q=qp, k=kp, v=vp, cu_seqlens=_ptr(t["cu_seqlens"]), decay=_ptr(t["decay"]), beta=_ptr(t["beta"]),
        state_in=_ptr(t["initial_state"]), a_log=_ptr(t["a_log"]), dt_bias=_ptr(t["dt_bias"]),
        capture_count=_ptr(t["capture_count"]), out=out_t.ptr, state_out=state_t.ptr,
        capsule=cap_t.ptr if geo.capacity > 0 else None,
        q_stride=qs, k_stride=ks, v_stride=vs, batch=geo.batch, total_tokens=geo.total_tokens,
        uniform_len=0 if geo.token_rows else geo.total_tokens // geo.batch, hk=hk, hv=hv, dk=dk, dv=dv,
        has_decay=int(has_decay), has_delta=int(has_delta), gate_qwen=int(attrs["gate_activation"] == "qwen"),
        beta_sigmoid=int(attrs["beta_activation"] == "sigmoid"), l2norm=int(attrs["qk_l2_norm"] != 0),
        decay_per_key=int(geo.per_key_decay), capacity=geo.capacity,
        capture_active=int(geo.capacity > 0 and (active is None or active != 0)), tail_only=0, row_groups=1,
        scale=scale,
    )
    device_args = dict(arch=launch.device_arch(device), smem_optin=launch.device_smem_optin(device), engine=engine)
    stream_ptr = stream_pointer(stream)
    scratch = None
    if plan.gdn_uses_chunked(geo, q.dtype, params, **device_args) and geo.total_tokens > 0:
        scratch = _scratch(workspace, plan.chunk_workspace_bytes(geo), device, stream_ptr)
        params.workspace = scratch.ptr
    launches = plan.gdn_plan(geo, q.dtype, params, rec_rows=rec_rows, rec_groups=rec_groups, scan_width=scan_width,
                             prep_heads=prep_heads, **device_args)
    launch.run(launches, device, stream_ptr)
    return out_arr, state_arr, cap_arr


def varlen_causal_conv(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None, stream: Any = None,
                       **attributes):
    """Run VarlenCausalConvWithState; returns (output, final_state, state_update) as device arrays."""
    op = contract.VARLEN_CAUSAL_CONV.name
    attrs = contract.resolve_attributes(contract.VARLEN_CAUSAL_CONV, attributes)
    t = _tensors(contract.VARLEN_CAUSAL_CONV, feeds)
    geo = contract.resolve_conv({name: (None if x is None else x.shape) for name, x in t.items()}, attrs)
    x = t["input"]
    _check_type(op, "input", x, ("float32", "float16", "bfloat16"))
    for name in ("weight", "bias", "initial_state"):
        if t[name] is not None and t[name].dtype != x.dtype:
            raise TypeError(f"{op}: {name} must have the input's element type {x.dtype}, got {t[name].dtype}")
    for name in ("cumulative_sequence_length", "capture_count"):
        _check_type(op, name, t[name], ("int32",))
    outputs = dict(outputs or {})
    device = x.device
    _check_device(op, t, device)
    out_arr, out_t = _output(outputs, "output", (geo.total_tokens, geo.channels), x.dtype, device, op)
    st_arr, st_t = _output(outputs, "final_state", (geo.batch, geo.channels, geo.state_length), x.dtype, device, op)
    cap_arr, cap_t = _output(outputs, "state_update", contract.conv_capsule_shape(geo.batch, geo.capacity,
                                                                                    geo.channels), x.dtype, device, op)
    params = plan.ConvParams(
        x=x.ptr, weight=t["weight"].ptr, bias=_ptr(t["bias"]), state_in=t["initial_state"].ptr,
        cu_seqlens=t["cumulative_sequence_length"].ptr, capture_count=_ptr(t["capture_count"]), out=out_t.ptr,
        state_out=st_t.ptr, capsule=cap_t.ptr if geo.capacity > 0 else None, batch=geo.batch,
        total_tokens=geo.total_tokens, channels=geo.channels, kernel_size=geo.kernel_size,
        dilation=attrs["dilation"], state_len=geo.state_length, capacity=geo.capacity,
        silu=int(attrs["activation"] in ("silu", "swish")),
    )
    launch.run(plan.conv_plan(geo, x.dtype, params), device, stream_pointer(stream))
    return out_arr, st_arr, cap_arr


def _accepted(accepted: Any, batch: int, device: int) -> DeviceTensor:
    """``accepted`` as a device tensor (which holds its memory); host values are uploaded with CuPy."""
    if hasattr(accepted, "__cuda_array_interface__") or hasattr(accepted, "__dlpack__"):
        t = as_device_tensor(accepted, "accepted")
        if t.dtype != "int32" or t.shape != (batch,):
            raise ValueError(f"accepted must be int32 [{batch}], got {t.dtype} {list(t.shape)}")
        return t
    import cupy
    import numpy as np

    host = np.asarray(accepted, dtype=np.int32).reshape(-1)
    if host.shape != (batch,):
        raise ValueError(f"accepted must have {batch} entries, got {host.shape[0]}")
    with cupy.cuda.Device(device):
        return as_device_tensor(cupy.asarray(host), "accepted")


def replay_gdn(state: Any, capsule: Any, accepted: Any, capacity: int, *, out: Any = None, stream: Any = None):
    """Replay the first ``accepted[b]`` captured transitions onto the committed ``state`` [B, Hv, Dv, Dk]
    (in place unless ``out`` is given); bit-exact to a shorter run of the recurrent kernel
    (docs/op-contract.md#gateddeltanet-replay).
    ``accepted`` is a device int32 [B] or a host sequence (uploaded through CuPy's current stream, so pass a
    device array when launching on another stream or inside a CUDA graph); values are clamped to [0, capacity]."""
    st = as_device_tensor(state, "state")
    cap = as_device_tensor(capsule, "capsule")
    if st.dtype != "float32" or len(st.shape) != 4 or cap.dtype != "float32":
        raise ValueError(f"replay_gdn: state must be float32 [B, Hv, Dv, Dk] and capsule float32 [B, W]; got "
                         f"{st.dtype} {list(st.shape)}, {cap.dtype} {list(cap.shape)}")
    b, hv, dv, dk = st.shape
    if capacity <= 0 or len(cap.shape) != 2 or cap.shape[0] != b or cap.shape[1] % capacity:
        raise ValueError(f"replay_gdn: capsule must be [{b}, capacity * (Hv + Hk*Dk + Hv*Dv)] with capacity "
                         f"{capacity}, got {list(cap.shape)}")
    per_slot = cap.shape[1] // capacity - hv - hv * dv  # the key block's width gives Hk
    hk = per_slot // dk if dk else 0
    if hk <= 0 or hk * dk != per_slot or hv % hk or contract.gdn_capsule_width(capacity, hv, hk, dk, dv) != cap.shape[1]:
        raise ValueError(f"replay_gdn: capsule width {cap.shape[1]} does not match state {list(st.shape)} "
                         f"with capacity {capacity}")
    dst = st if out is None else as_device_tensor(out, "out")
    if dst.shape != st.shape or dst.dtype != "float32":
        raise ValueError(f"replay_gdn: out must be float32 {list(st.shape)}")
    acc = _accepted(accepted, b, st.device)
    params = plan.GdnReplayParams(state_in=st.ptr, state_out=dst.ptr, capsule=cap.ptr, accepted=acc.ptr, batch=b,
                                  hk=hk, hv=hv, dk=dk, dv=dv, capacity=capacity)
    launch.run(plan.gdn_replay_plan(params), st.device, stream_pointer(stream))
    return state if out is None else out


def replay_conv(state: Any, capsule: Any, accepted: Any, *, out: Any = None, stream: Any = None):
    """Replay accepted conv transitions onto the committed ``state`` [B, Ch, SL] (in place unless ``out``)."""
    st = as_device_tensor(state, "state")
    cap = as_device_tensor(capsule, "capsule")
    if len(st.shape) != 3 or len(cap.shape) != 3 or cap.shape[0] != st.shape[0] or cap.shape[2] != st.shape[1] \
            or cap.dtype != st.dtype:
        raise ValueError(f"replay_conv: state [B, Ch, SL] and capsule [B, capacity, Ch] of one type expected, got "
                         f"{st.dtype} {list(st.shape)} and {cap.dtype} {list(cap.shape)}")
    b, ch, sl = st.shape
    dst = st if out is None else as_device_tensor(out, "out")
    if dst.shape != st.shape or dst.dtype != st.dtype:
        raise ValueError(f"replay_conv: out must be {st.dtype} {list(st.shape)}")
    acc = _accepted(accepted, b, st.device)
    params = plan.ConvReplayParams(state_in=st.ptr, state_out=dst.ptr, capsule=cap.ptr, accepted=acc.ptr, batch=b,
                                   channels=ch, state_len=sl, capacity=cap.shape[1])
    launch.run(plan.conv_replay_plan(st.dtype, params), st.device, stream_pointer(stream))
    return state if out is None else out
