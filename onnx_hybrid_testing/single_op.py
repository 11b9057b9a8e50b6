"""One-node ONNX models of the contract ops, and running them in ONNX Runtime.

Tests, benchmarks and tools build their single-op models here: the node comes from
``contract.make_onnx_node`` (so omitted middle inputs become empty names and default attributes are
left out), the opset imports name the op's domain, and the graph's inputs carry the feeds' types and
shapes. bfloat16 tensors (``ml_dtypes.bfloat16`` arrays) travel as OrtValues, which NumPy feeds cannot.
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

from onnx_hybrid.ops.contract import (DOMAIN, LINEAR, MS_DOMAIN, OPS, OPSET_VERSION, QUANTIZED_LINEAR,
                                      linear_output_names)

AI_ONNX_OPSET = 21
IR_VERSION = 10  # ORT >= 1.20 reads it
_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
               np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16, np.dtype(np.int32): TensorProto.INT32,
               np.dtype(np.uint8): TensorProto.UINT8}
_FIXED_TYPES = {"float": TensorProto.FLOAT, "int32": TensorProto.INT32, "uint8": TensorProto.UINT8}


def _activation_type(op_name: str, feeds: Mapping[str, np.ndarray | None]) -> int:
    first = OPS[op_name].inputs[0].name  # query / input: always present, of type T
    return _ONNX_TYPES[np.asarray(feeds[first]).dtype]


def matmul_nbits_model(codes: np.ndarray, scales: np.ndarray, k: int, *, bits: int, block_size: int,
                       accuracy_level: int = 0, elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """ORT's own com.microsoft::MatMulNBits, Y [M, N] = A [M, k] @ W^T, with a quantized weight's packed codes
    ([N, k_blocks, blob], as exporter.quantize writes them) and scales as initializers; A, Y and the scales in
    ``elem_type``."""
    n = codes.shape[0]
    scale_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain=MS_DOMAIN, K=k, N=n, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "matmul_nbits", [helper.make_tensor_value_info("A", elem_type, ["M", k])],
                              [helper.make_tensor_value_info("Y", elem_type, ["M", n])],
                              [onnx.numpy_helper.from_array(np.ascontiguousarray(codes), "B"),
                               onnx.numpy_helper.from_array(scales.astype(scale_dtype), "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", AI_ONNX_OPSET),
                                                   helper.make_opsetid(MS_DOMAIN, 1)], ir_version=IR_VERSION)


def single_op_model(op_name: str, feeds: Mapping[str, np.ndarray | None], attributes: Mapping[str, Any] | None = None,
                    outputs: Sequence[str] | None = None, domain: str = DOMAIN, *,
                    validate: bool = True, initializers: Sequence[str] = ()) -> onnx.ModelProto:
    """A model with one ``op_name`` node whose graph inputs are the present feeds (None = omitted), except those
    named in ``initializers``, which become initializers (constant inputs, as an export's weights).

    ``outputs``: the op outputs to request by name (default: all; Linear's per its output_features); the others are
    omitted.
    ``validate=False`` skips the contract's node checks (attribute values, input presence rules, input
    element types), to build the invalid nodes that error tests feed to the kernels.
    """
    op = OPS[op_name]
    present = {name: np.asarray(value) for name, value in feeds.items() if value is not None}
    if outputs is not None:
        wanted = list(outputs)
    elif op in (LINEAR, QUANTIZED_LINEAR):  # their outputs follow output_features
        wanted = linear_output_names(dict(attributes or {}).get("output_features", ()))
    else:
        wanted = [p.name for p in op.outputs]
    node = (_node if validate else _unchecked_node)(op_name, present, wanted, attributes, domain)
    t_type = _activation_type(op_name, feeds)
    graph_inputs = [helper.make_tensor_value_info(name, _ONNX_TYPES[value.dtype], list(value.shape))
                    for name, value in present.items() if name not in initializers]
    graph_outputs = [helper.make_tensor_value_info(p.name, t_type if p.type == "T" else _FIXED_TYPES[p.type], None)
                     for p in op.outputs if p.name in wanted]
    constants = [onnx.numpy_helper.from_array(value, name) for name, value in present.items() if name in initializers]
    graph = helper.make_graph([node], f"{op_name}_single", graph_inputs, graph_outputs, constants)
    opsets = [helper.make_opsetid("", AI_ONNX_OPSET), helper.make_opsetid(domain, OPSET_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def _node(op_name, present, wanted, attributes, domain):
    from onnx_hybrid.ops.contract import make_onnx_node

    op = OPS[op_name]
    types = {name: TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(value.dtype)).lower()
             for name, value in present.items()}
    return make_onnx_node(op, {name: name for name in present}, {p.name: p.name for p in op.outputs if p.name in wanted},
                          attributes, domain=domain, types=types)


def _unchecked_node(op_name, present, wanted, attributes, domain):
    op = OPS[op_name]
    inputs = [p.name if p.name in present else "" for p in op.inputs]
    outputs = [p.name if p.name in wanted else "" for p in op.outputs]
    while inputs and not inputs[-1]:
        inputs.pop()
    while outputs and not outputs[-1]:
        outputs.pop()
    return helper.make_node(op_name, inputs, outputs, domain=domain, **dict(attributes or {}))


def make_session(model: onnx.ModelProto, with_library: bool = True, intra_op_threads: int | None = None):
    import onnxruntime as ort

    from onnx_hybrid.ops.library import register

    so = ort.SessionOptions()
    if intra_op_threads is not None:
        so.intra_op_num_threads = intra_op_threads
    if with_library:
        register(so)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def to_ort_value(array: np.ndarray):
    import onnxruntime as ort

    array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def from_ort_value(value) -> np.ndarray:
    if value.data_type() == "tensor(bfloat16)":  # no NumPy type in ORT's binding: copy the raw bits
        shape = value.shape()
        count = int(np.prod(shape))
        raw = (ctypes.c_uint16 * count).from_address(value.data_ptr()) if count else []
        return np.array(raw, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(shape)
    return value.numpy()


def run_session(session, feeds: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """Run with OrtValue feeds (any dtype, bfloat16 included); results by output name."""
    import onnxruntime as ort

    names = [o.name for o in session.get_outputs()]
    values = {name: to_ort_value(np.asarray(v)) for name, v in feeds.items() if v is not None}
    results = session.run_with_ort_values(names, values, ort.RunOptions())
    return {name: from_ort_value(r) for name, r in zip(names, results)}


def run_single_op(op_name: str, feeds: Mapping[str, np.ndarray | None], attributes: Mapping[str, Any] | None = None,
                  domain: str = DOMAIN, with_library: bool = True, outputs: Sequence[str] | None = None,
                  intra_op_threads: int | None = None, validate: bool = True) -> dict[str, np.ndarray]:
    """Build, load and run a one-node model; ``with_library=False`` runs ORT's own kernels (com.microsoft)."""
    model = single_op_model(op_name, feeds, attributes, outputs=outputs, domain=domain, validate=validate)
    session = make_session(model, with_library=with_library, intra_op_threads=intra_op_threads)
    return run_session(session, feeds)


__all__ = ["single_op_model", "make_session", "run_session", "run_single_op", "to_ort_value", "from_ort_value",
           "DOMAIN", "MS_DOMAIN"]
