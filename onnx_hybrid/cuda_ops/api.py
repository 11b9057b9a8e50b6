"""Python API of the CUDA kernels, with the operator contract's inputs, outputs and attributes.

``feeds`` uses the contract's input names, like an ORT feed dict; arrays live on the GPU (CuPy, or anything
exposing ``__cuda_array_interface__`` / ``__dlpack__``), except ``state_update_active``, which is a host value
(docs/op-contract.md#gateddeltanet-inputs-and-outputs). Each call goes through the custom-op library's C entry
points (native/ort/c_api.h): the shape checks (same messages), parameters, launch plan and launches that ORT
sessions run, on the given stream. Nothing here synchronises with the host: offsets and capture counts stay on
the device.

``outputs`` may hold preallocated outputs by name (``final_state`` may be ``initial_state`` itself: the kernels
are alias-safe); missing ones are allocated with CuPy. Pass preallocated outputs (and, for GatedDeltaNet, a
``workspace``) when capturing CUDA graphs.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import threading
from typing import Any, Mapping

from ..ops import contract, library
from ..ops.c_api import ELEMENT_TYPE_CODES, Array, ConvCall, GdnCall
from .tensors import DeviceTensor, as_device_tensor, empty, pointers_and_keys, stream_pointer


class PlanError(ValueError):
    """No kernel can serve the call as asked (a shape no kernel is instantiated for, or a knob's value)."""


_ENGINES = {"auto": 0, "chunked": 1, "recurrent": 2}
_LAUNCHED, _NEEDS_MEMORY, _OUTPUT_SHAPES, _CONTRACT_VIOLATION, _BAD_KNOB = 0, 1, 2, -2, -3
_OUTPUT_NAMES = ("output", "final_state", "state_update")
_given_outputs = operator.itemgetter(*_OUTPUT_NAMES)  # the outputs as a tuple, in the contract's order
_prepared: set[int] = set()  # devices whose kernel image the library has


def _library(device: int) -> ctypes.CDLL:
    """The library, with a kernel image for ``device``'s architecture handed over (once per device)."""
    lib = library.control()
    if device not in _prepared:
        import cupy

        arch = int(cupy.cuda.Device(device).compute_capability)
        if not library.has_cuda_image(arch):
            library.prepare_cuda(arch=arch)
        _prepared.add(device)
    return lib


def _run(entry, call, device: int, stream: int, op: str, *args) -> int:
    """``entry(*args)``, or ``entry(byref(call))``; the library launches in the context of the stream, which for the
    legacy default stream (0) is the current device's, so ``device`` is made current for that one."""
    arguments = args or (ctypes.byref(call),)
    if stream:
        return _check(entry(*arguments), op)
    import cupy

    with cupy.cuda.Device(device):
        return _check(entry(*arguments), op)


def _check(code: int, op: str) -> int:
    """The entry point's result, or its error as this API raises it."""
    if code >= 0:
        return code
    if code == _CONTRACT_VIOLATION:
        raise contract.ContractError.from_library(op)
    message = library.control().onnx_hybrid_last_error().decode()
    if code == _BAD_KNOB:
        raise PlanError(message)
    raise RuntimeError(message)


def _set_array(slot: Array, t: DeviceTensor | None) -> None:
    if t is None:
        slot.set(None)
    else:
        slot.set(t.shape, t.ptr, ELEMENT_TYPE_CODES.get(t.dtype, -1))


@functools.lru_cache(maxsize=64)
def _attributes(op_name: str, given: tuple) -> dict:
    """contract.resolve_attributes of the keyword attributes (cached: they rarely change between calls)."""
    return contract.resolve_attributes(contract.OPS[op_name], dict(given))


_FLOAT_INPUTS = ("initial_state", "a_log", "dt_bias")
_GATE_INPUTS = ("decay", "beta")  # float32, or both of the query's type (the library checks which)
_INT_INPUTS = ("cu_seqlens", "capture_count")


_INPUT_NAMES: dict[str, tuple] = {}  # by op name: hashing an OpSpec costs ~3 us


def _input_names(op: contract.OpSpec) -> tuple[tuple[str, ...], frozenset, tuple[str, ...], tuple[str, ...]]:
    """The op's input names in order; as a set; in order with the host-memory inputs (the contract's, e.g.
    state_update_active) blanked to a name no feed has; and that, then the output names (_reuse_key's arrays)."""
    names = _INPUT_NAMES.get(op.name)
    if names is None:
        ordered = tuple(p.name for p in op.inputs)
        device = tuple(" host" if p.host_memory else p.name for p in op.inputs)
        names = _INPUT_NAMES[op.name] = (ordered, frozenset(ordered), device, ordered + _OUTPUT_NAMES)
    return names


def _tensors(op: contract.OpSpec, feeds: Mapping[str, Any]) -> dict:
    """The op's inputs by name as device tensors; None where absent or a host-memory input (read by the caller)."""
    names, known, device, _ = _input_names(op)
    if not known.issuperset(feeds):
        raise KeyError(f"{op.name}: unknown input(s) {sorted(set(feeds) - known)}")
    tensors = {}
    for name, device_name in zip(names, device):
        x = feeds.get(device_name)
        tensors[name] = None if x is None else as_device_tensor(x, name)
    return tensors


def _check_device(op: str, tensors: Mapping[str, DeviceTensor | None], device: int) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{op}: {name} is on device {t.device}, the other inputs on device {device}")


def _check_type(op: str, name: str, t: DeviceTensor | None, expected: tuple[str, ...]) -> None:
    if t is not None and t.dtype not in expected:
        raise TypeError(f"{op}: {name} must be {' or '.join(expected)}, got {t.dtype}")


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


def _pool_workspace(nbytes: int, device: int, stream: int) -> DeviceTensor:
    """The chunked engine's workspace from CuPy's pool on ``stream`` (the pool reuses a freed block only for later
    work on the same stream, so it may be freed when this call returns)."""
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


def _output_tensors(outputs: Mapping[str, Any]) -> list[DeviceTensor] | None:
    """The three outputs as device tensors when all are given, else None."""
    given = [outputs.get(name) for name in _OUTPUT_NAMES]
    if any(g is None for g in given):
        return None
    return [as_device_tensor(g, name) for g, name in zip(given, _OUTPUT_NAMES)]


def _set_given_outputs(outs: list[DeviceTensor] | None, call, dtypes: tuple[str, ...]) -> bool:
    """All three outputs given with the expected types: their pointers and shapes into ``call``, which the library
    checks in the call that launches (one call instead of two). Else False: the library first reports the shapes,
    then _allocate fills in what is missing."""
    if outs is None or any(t.dtype != dtype or len(t.shape) > 4 for t, dtype in zip(outs, dtypes)):
        return False
    call.outputs[:] = [t.ptr or 1 for t in outs]  # a present output, even when it holds no element
    call.output_ranks[:] = [len(t.shape) for t in outs]
    for dims, t in zip(call.output_dims, outs):
        dims[:len(t.shape)] = t.shape
    return True


def _allocate(outputs: Mapping[str, Any], call, names: tuple[str, ...], dtypes: tuple[str, ...], device: int,
              op: str) -> list:
    """The outputs, given (checked against the shapes the library resolved) or new, into ``call.outputs``."""
    arrays = []
    for i, (name, dtype) in enumerate(zip(names, dtypes)):
        shape = tuple(call.output_dims[i][:call.output_ranks[i]])
        given = outputs.get(name)
        if given is None:
            arr = empty(shape, dtype, device)
            t = as_device_tensor(arr, name)
        else:
            arr, t = given, as_device_tensor(given, name)
            if t.shape != shape or t.dtype != dtype:
                raise ValueError(f"{op}: output {name} must be {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}")
        call.outputs[i] = t.ptr or 1  # a present output, even when it holds no element
        arrays.append(arr)
    return arrays


def gated_delta_net(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None, stream: Any = None,
                    workspace: Any = None, engine: str = "auto", rec_rows: int | None = None,
                    rec_groups: int | None = None, scan_width: int | None = None, prep_heads: int | None = None,
                    only_kernels: tuple[str, ...] | None = None, **attributes):
    """Run GatedDeltaNet; returns (output, final_state, state_update) as device arrays.

    ``workspace``: a contiguous device array (any element type of the contract) of at least
    ``gdn_workspace_bytes(...)`` bytes for the chunked kernels, or None to take one from CuPy's pool (not
    possible inside a CUDA graph capture).
    ``engine`` (auto | chunked | recurrent), ``rec_rows``, ``rec_groups``, ``scan_width`` and ``prep_heads`` are
    test and tuning knobs of the library's plan; ``only_kernels`` launches only the plan's kernels whose names
    start with one of these prefixes (per-kernel timing)."""
    return _gdn(feeds, outputs, stream, workspace, engine, (rec_rows, rec_groups, scan_width, prep_heads),
                only_kernels, attributes)[0]


def _gdn(feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None, stream: Any, workspace: Any, engine: str,
         knobs: tuple, only_kernels: tuple[str, ...] | None, attributes: dict,
         binding: bool = False) -> tuple[tuple, _PreparedCall | None]:
    """gated_delta_net's work; also returns the checked call it ran (None where the outputs were not all given).
    ``binding``: a missing workspace is an error, not one from CuPy's pool (the bound call launches again later)."""
    rec_rows, rec_groups, scan_width, prep_heads = knobs
    op = contract.GATED_DELTA_NET.name
    if engine not in _ENGINES:
        raise ValueError(f"engine must be auto, chunked or recurrent, got {engine!r}")
    given_attributes = tuple(attributes.items())  # in the caller's order: the reuse key, not the rule
    active = _host_flag(feeds.get("state_update_active"))
    # A call like an earlier one (same shapes, types, devices, attributes and knobs, outputs given) reuses its
    # checked and filled call struct: only pointers, the stream and the active flag change.
    reuse = _reuse_key(contract.GATED_DELTA_NET, feeds, outputs or {}, given_attributes,
                       (engine, rec_rows, rec_groups, scan_width, prep_heads, only_kernels, active is None))
    prepared = _prepared_calls().get(reuse[0]) if reuse and not binding else None
    if prepared is not None:
        return _run_prepared(prepared, reuse[1], outputs, active, stream, workspace, op), prepared
    outputs = dict(outputs or {})  # a copy: the outputs this call allocates go into it, not into the caller's
    t = _tensors(contract.GATED_DELTA_NET, feeds)
    outs = _output_tensors(outputs)
    attrs = _attributes(op, tuple(sorted(given_attributes)))
    q = t["query"]
    act_types = ("float32", "float16", "bfloat16")
    _check_type(op, "query", q, act_types)
    for name in ("key", "value"):
        if t[name] is not None and t[name].dtype != q.dtype:
            raise TypeError(f"{op}: {name} must have the query's element type {q.dtype}, got {t[name].dtype}")
    for name in _FLOAT_INPUTS:
        _check_type(op, name, t[name], ("float32",))
    gate_types = tuple(dict.fromkeys(("float32", q.dtype)))  # float32, or the query's type
    for name in _GATE_INPUTS:
        _check_type(op, name, t[name], gate_types)
    for name in _INT_INPUTS:
        _check_type(op, name, t[name], ("int32",))
    device = q.device
    _check_device(op, t, device)
    lib = _library(device)

    call, active_host = _gdn_call(t, active, engine, attrs, stream)
    call.rec_rows, call.rec_groups = rec_rows or 0, rec_groups or 0
    call.scan_width, call.prep_heads = scan_width or 0, prep_heads or 0
    call.only_kernels = _kernel_filter(only_kernels)
    scratch = None
    if workspace is not None:
        scratch = as_device_tensor(workspace, "workspace")
        if scratch.device != device:
            raise ValueError(f"{op}: workspace must be on device {device}, got device {scratch.device}")
        call.workspace, call.workspace_bytes = scratch.ptr, scratch.nbytes
    dtypes = (q.dtype, "float32", "float32")
    given = _set_given_outputs(outs, call, dtypes)
    arrays = [outputs[name] for name in _OUTPUT_NAMES] if given else None
    code = _run(lib.onnx_hybrid_cuda_gated_delta_net, call, device, call.stream, op)
    if not given or code == _OUTPUT_SHAPES:  # the library reported the outputs' shapes
        arrays = _allocate(outputs, call, _OUTPUT_NAMES, dtypes, device, op)
        code = _run(lib.onnx_hybrid_cuda_gated_delta_net, call, device, call.stream, op)
    if code == _NEEDS_MEMORY:
        if binding and workspace is None:
            raise ValueError(f"{op}: this call runs the chunked kernels; bind it with a workspace of at least "
                             f"{call.workspace_needed} bytes (gdn_workspace_bytes)")
        _launch_with_workspace(lib.onnx_hybrid_cuda_gated_delta_net, call, device, workspace, scratch, op)
    prepared = None
    if reuse and given:
        prepared = _PreparedCall(call, active_host, device, lib.onnx_hybrid_cuda_gated_delta_net, t)
        _prepared_calls()[reuse[0]] = prepared
    return tuple(arrays), prepared


def _kernel_filter(only_kernels: tuple[str, ...] | None) -> bytes | None:
    """The library's kernel filter: None launches the whole plan, an empty tuple none of it."""
    return None if only_kernels is None else ",".join(only_kernels).encode()


def _gdn_call(tensors: Mapping[str, DeviceTensor | None], active: int | None, engine: str, attrs: Mapping[str, Any],
              stream: Any) -> tuple[GdnCall, ctypes.c_int32 | None]:
    """A GdnCall with the inputs, element type, engine, attributes and stream, and the host int its
    state_update_active points at (kept alive by the caller)."""
    call = GdnCall()
    active_host = None
    for i, (name, t) in enumerate(tensors.items()):
        if name != "state_update_active":
            _set_array(call.inputs[i], t)
        elif active is not None:
            active_host = ctypes.c_int32(active)
            call.inputs[i].set((1,), ctypes.addressof(active_host))
    call.type, call.engine = ELEMENT_TYPE_CODES[tensors["query"].dtype], _ENGINES[engine]
    call.set_attributes(attrs)
    call.stream = stream_pointer(stream)
    return call, active_host


def _launch_with_workspace(entry, call, device: int, workspace: Any, scratch: DeviceTensor | None, op: str) -> None:
    """The call asked for a workspace: the given one was too small (an error), or one from CuPy's pool."""
    needed = call.workspace_needed
    if workspace is not None:
        raise ValueError(f"{op}: workspace must hold {needed} bytes on device {device}, got "
                         f"{scratch.nbytes} bytes on device {scratch.device}")
    scratch = _pool_workspace(needed, device, call.stream or 0)  # ctypes reads a null c_void_p as None
    call.workspace, call.workspace_bytes = scratch.ptr, scratch.nbytes
    _run(entry, call, device, call.stream, op)
    call.workspace, call.workspace_bytes = None, 0  # the pool's block is not the next call's


class _PreparedCall:
    """A GdnCall that passed the checks once, with the host int its state_update_active points at and its present
    input slots (views into the struct, so writing a slot's pointer writes the call)."""

    __slots__ = ("call", "ref", "active", "device", "entry", "slots")

    def __init__(self, call, active, device: int, entry, tensors: Mapping[str, DeviceTensor | None]):
        self.call, self.active, self.device, self.entry = call, active, device, entry
        self.ref = ctypes.byref(call)  # the entry point's argument, made once
        self.slots = [(i, call.inputs[i]) for i, x in enumerate(tensors.values()) if x is not None]


_local = threading.local()  # each thread fills its own call structs


def _prepared_calls() -> dict:
    calls = getattr(_local, "calls", None)
    if calls is None:
        calls = _local.calls = {}
    elif len(calls) > 64:  # shapes that vary from call to call (prefill of many lengths) do not pile up
        calls.clear()
    return calls


def _reuse_key(op: contract.OpSpec, feeds: Mapping[str, Any], outputs: Mapping[str, Any], attributes: tuple,
               knobs: tuple) -> tuple[tuple, list[int]] | None:
    """The key of what the checks and the call struct depend on besides pointers (shapes, types, devices, the
    attributes as given, knobs), and the pointers of the inputs then the outputs (0 where absent); None unless every
    output is given (a call that allocates its outputs is not the one a decode loop repeats)."""
    _, known, device_names, array_names = _input_names(op)
    if not known.issuperset(feeds):
        return None  # _tensors names the unknown input
    arrays = [feeds.get(name) for name in device_names]  # state_update_active, a host value, read as absent
    for name in _OUTPUT_NAMES:
        x = outputs.get(name)
        if x is None:
            return None
        arrays.append(x)
    pointers, keys = pointers_and_keys(arrays, array_names)
    keys += (op.name, attributes, knobs)
    return tuple(keys), pointers


def _run_prepared(prepared: _PreparedCall, pointers: list[int], outputs: Mapping[str, Any], active: int | None,
                  stream: Any, workspace: Any, op: str) -> tuple:
    call = prepared.call
    if prepared.active is not None:
        prepared.active.value = active
    for i, slot in prepared.slots:
        slot.data = pointers[i] or 1  # 1: a present input that holds no element
    n = len(call.inputs)
    call.outputs[:] = [pointers[n] or 1, pointers[n + 1] or 1, pointers[n + 2] or 1]
    call.stream = stream_handle = stream_pointer(stream)
    scratch = None
    if workspace is not None:
        scratch = as_device_tensor(workspace, "workspace")
        if scratch.device != prepared.device:
            raise ValueError(f"{op}: workspace must be on device {prepared.device}, got device {scratch.device}")
        call.workspace, call.workspace_bytes = scratch.ptr, scratch.nbytes
    elif isinstance(call, GdnCall):  # the conv takes none
        call.workspace, call.workspace_bytes = None, 0
    if _run(prepared.entry, call, prepared.device, stream_handle, op, prepared.ref) == _NEEDS_MEMORY:
        _launch_with_workspace(prepared.entry, call, prepared.device, workspace, scratch, op)
    return _given_outputs(outputs)


def gdn_workspace_bytes(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any], engine: str = "auto",
                        stream: Any = None, **attributes) -> int:
    """The workspace a gated_delta_net call with these feeds, outputs and engine needs on the device of
    ``stream`` (0 without the chunked kernels): what to preallocate before capturing the call in a CUDA graph.
    Launches nothing."""
    op = contract.GATED_DELTA_NET.name
    t = _tensors(contract.GATED_DELTA_NET, feeds)
    attrs = _attributes(op, tuple(sorted(attributes.items())))
    q = t["query"]
    lib = _library(q.device)
    call, _ = _gdn_call(t, None, engine, attrs, stream)
    call.only_kernels = b""  # plan, launch none
    _run(lib.onnx_hybrid_cuda_gated_delta_net, call, q.device, call.stream, op)
    _allocate(dict(outputs), call, _OUTPUT_NAMES, (q.dtype, "float32", "float32"), q.device, op)
    _run(lib.onnx_hybrid_cuda_gated_delta_net, call, q.device, call.stream, op)  # asks for the workspace, if any
    return int(call.workspace_needed)


def varlen_causal_conv(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None, stream: Any = None,
                       only_kernels: tuple[str, ...] | None = None, **attributes):
    """Run VarlenCausalConvWithState; returns (output, final_state, state_update) as device arrays."""
    return _conv(feeds, outputs, stream, only_kernels, attributes)[0]


def _conv(feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None, stream: Any,
          only_kernels: tuple[str, ...] | None, attributes: dict) -> tuple[tuple, _PreparedCall | None]:
    """varlen_causal_conv's work; also returns the checked call it ran (None where the outputs were not all given)."""
    op = contract.VARLEN_CAUSAL_CONV.name
    given_attributes = tuple(attributes.items())
    reuse = _reuse_key(contract.VARLEN_CAUSAL_CONV, feeds, outputs or {}, given_attributes, (only_kernels,))
    prepared = _prepared_calls().get(reuse[0]) if reuse else None
    if prepared is not None:
        return _run_prepared(prepared, reuse[1], outputs, None, stream, None, op), prepared
    outputs = dict(outputs or {})  # a copy: the outputs this call allocates go into it, not into the caller's
    t = _tensors(contract.VARLEN_CAUSAL_CONV, feeds)
    outs = _output_tensors(outputs)
    attrs = _attributes(op, tuple(sorted(given_attributes)))
    x = t["input"]
    _check_type(op, "input", x, ("float32", "float16", "bfloat16"))
    for name in ("weight", "bias", "initial_state"):
        if t[name] is not None and t[name].dtype != x.dtype:
            raise TypeError(f"{op}: {name} must have the input's element type {x.dtype}, got {t[name].dtype}")
    for name in ("cumulative_sequence_length", "capture_count"):
        _check_type(op, name, t[name], ("int32",))
    device = x.device
    _check_device(op, t, device)
    lib = _library(device)
    call = ConvCall()
    for i, port in enumerate(contract.VARLEN_CAUSAL_CONV.inputs):
        _set_array(call.inputs[i], t[port.name])
    call.type = ELEMENT_TYPE_CODES[x.dtype]
    call.only_kernels = _kernel_filter(only_kernels)
    call.set_attributes(attrs)
    call.stream = stream_pointer(stream)
    dtypes = (x.dtype,) * 3
    given = _set_given_outputs(outs, call, dtypes)
    arrays = [outputs[name] for name in _OUTPUT_NAMES] if given else None
    code = _run(lib.onnx_hybrid_cuda_varlen_causal_conv, call, device, call.stream, op)
    if not given or code == _OUTPUT_SHAPES:  # the library reported the outputs' shapes
        arrays = _allocate(outputs, call, _OUTPUT_NAMES, dtypes, device, op)
        _run(lib.onnx_hybrid_cuda_varlen_causal_conv, call, device, call.stream, op)
    prepared = None
    if reuse and given:
        prepared = _PreparedCall(call, None, device, lib.onnx_hybrid_cuda_varlen_causal_conv, t)
        _prepared_calls()[reuse[0]] = prepared
    return tuple(arrays), prepared


class BoundCall:
    """An operator call checked and planned once over fixed arrays; calling it launches that call again on its
    stream, for about one library call of host time (a decode loop that writes each step's inputs into the same
    buffers). Returns the outputs, like the call it binds. The bound arrays are kept alive; their memory and shapes
    must not change while it is in use. ``state_update_active`` (GatedDeltaNet bound with that input) sets the host
    flag for this launch and the next ones."""

    __slots__ = ("_call", "_entry", "_device", "_stream", "_op", "_active", "_results", "_arrays")

    def __init__(self, prepared: _PreparedCall, results: tuple, op: str, feeds: Mapping[str, Any]):
        # A struct of its own: later calls of the unbound API that reuse the prepared one write theirs.
        self._call = type(prepared.call).from_buffer_copy(prepared.call)
        self._call.only_kernels = None
        self._entry, self._device, self._stream, self._op = prepared.entry, prepared.device, self._call.stream, op
        self._active = None
        if prepared.active is not None:
            self._active = ctypes.c_int32(prepared.active.value)
            self._call.inputs[_ACTIVE_INPUT].set((1,), ctypes.addressof(self._active))
        self._results, self._arrays = results, dict(feeds)

    def __call__(self, state_update_active: int | None = None) -> tuple:
        if state_update_active is not None:
            if self._active is None:
                raise ValueError(f"{self._op}: bound without state_update_active")
            self._active.value = state_update_active
        _run(self._entry, self._call, self._device, self._stream, self._op)
        return self._results


_ACTIVE_INPUT = next(p.index for p in contract.GATED_DELTA_NET.inputs if p.name == "state_update_active")


def bind_gated_delta_net(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any], stream: Any = None,
                         workspace: Any = None, engine: str = "auto", **attributes) -> BoundCall:
    """gated_delta_net over these arrays, checked and planned now, launched by each call of the result. All three
    outputs must be given, and a ``workspace`` where the plan runs the chunked kernels (``gdn_workspace_bytes``).
    Launches nothing."""
    op = contract.GATED_DELTA_NET.name
    _require_outputs(op, outputs)
    results, prepared = _gdn(feeds, outputs, stream, workspace, engine, (None,) * 4, (), attributes, binding=True)
    return BoundCall(prepared, results, op, {**feeds, **outputs, "workspace": workspace})


def bind_varlen_causal_conv(feeds: Mapping[str, Any], *, outputs: Mapping[str, Any], stream: Any = None,
                            **attributes) -> BoundCall:
    """varlen_causal_conv over these arrays, checked and planned now, launched by each call of the result (all
    three outputs given). Launches nothing."""
    op = contract.VARLEN_CAUSAL_CONV.name
    _require_outputs(op, outputs)
    results, prepared = _conv(feeds, outputs, stream, (), attributes)
    return BoundCall(prepared, results, op, {**feeds, **outputs})


def _require_outputs(op: str, outputs: Mapping[str, Any]) -> None:
    missing = [name for name in _OUTPUT_NAMES if outputs.get(name) is None]
    if missing:
        raise ValueError(f"{op}: a bound call needs all three outputs; missing {', '.join(missing)}")


def _accepted(accepted: Any, batch: int, device: int) -> DeviceTensor:
    """``accepted`` as a device tensor (which holds its memory); host values are uploaded with CuPy."""
    if isinstance(accepted, DeviceTensor) or hasattr(accepted, "__cuda_array_interface__") or \
            hasattr(accepted, "__dlpack__"):
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
    lib, s = _library(st.device), stream_pointer(stream)
    _run(lib.onnx_hybrid_cuda_replay_gdn, None, st.device, s, "replay_gdn", st.ptr, dst.ptr, cap.ptr, acc.ptr, b, hk,
         hv, dk, dv, capacity, s)
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
    lib, s = _library(st.device), stream_pointer(stream)
    _run(lib.onnx_hybrid_cuda_replay_conv, None, st.device, s, "replay_conv", ELEMENT_TYPE_CODES[st.dtype], st.ptr,
         dst.ptr, cap.ptr, acc.ptr, b, ch, sl, cap.shape[1], s)
    return state if out is None else out
