"""The declared inputs and outputs of an ONNX graph, read without its weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # ONNX element type name in lower case: "float", "float16", "int32", ...
    shape: tuple[int, ...] | None  # None: rank unknown; -1: symbolic or unknown dimension
    dim_names: tuple[str, ...] = ()  # symbolic names ("" for static or unnamed)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def runtime_dims(self) -> str:
        """The shape as onnxruntime-genai prints it in messages: [-1, 2, 3] (-1 for symbolic)."""
        return "[" + ", ".join(str(d) for d in self.shape or ()) + "]"

    def describe(self) -> str:
        if self.shape is None:
            return f"{self.dtype}[?]"
        dims = [name or (str(d) if d >= 0 else "?") for d, name in zip(self.shape, self.dim_names)]
        return f"{self.dtype}[{', '.join(dims)}]"


@dataclass(frozen=True)
class GraphIO:
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    # Producer of each graph output: (op_type, domain, attributes) of the node that writes it.
    producers: dict[str, tuple[str, str, dict]]

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> "GraphIO":
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        inputs = {v.name: _info(v) for v in graph.input if v.name not in initializers}
        outputs = {v.name: _info(v) for v in graph.output}
        producers = {}
        for node in graph.node:
            for out in node.output:
                if out in outputs:
                    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                    producers[out] = (node.op_type, node.domain, attrs)
        return cls(inputs, outputs, producers)

    @classmethod
    def load(cls, path: str | Path) -> "GraphIO":
        """Reads the graph structure only: external weight files are not opened."""
        return cls.from_model(onnx.load(str(path), load_external_data=False))


def _info(value: onnx.ValueInfoProto) -> TensorInfo:
    tensor = value.type.tensor_type
    dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()  # "float", "float16", "int32", ...
    if not tensor.HasField("shape"):
        return TensorInfo(value.name, dtype, None)
    dims, names = [], []
    for d in tensor.shape.dim:
        static = d.HasField("dim_value")
        dims.append(d.dim_value if static else -1)
        names.append("" if static else d.dim_param)
    return TensorInfo(value.name, dtype, tuple(dims), tuple(names))

