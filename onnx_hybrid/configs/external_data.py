"""Load rule: every external data file a graph references exists and holds its tensors' bytes.

og.Model reads the weights when it creates the session: a missing file fails with ``External data path
does not exist``, a short one with ``... are out of bounds or can not be read in full``. Both are checked
from the graph's tensor records alone, without reading any weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx

from .findings import LOAD, Finding, Report


@dataclass(frozen=True)
class ExternalTensor:
    name: str
    location: str
    end: int  # offset + length: the file must hold at least this many bytes


def external_tensors(model: onnx.ModelProto) -> Iterator[ExternalTensor]:
    """The tensors of ``model`` (initializers and node attributes, subgraphs included) stored in external files."""
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        offset = int(info.get("offset") or 0)
        length = int(info["length"]) if info.get("length") else _nbytes(tensor)
        yield ExternalTensor(tensor.name, info.get("location", ""), offset + length)


def check_external_data(graph_path: Path, model: onnx.ModelProto, config_path: str, report: Report) -> None:
    """One finding per file that is missing or shorter than the tensors it holds need (``config_path``:
    the genai_config.json entry naming the graph)."""
    by_file: dict[str, list[ExternalTensor]] = {}
    for tensor in external_tensors(model):
        by_file.setdefault(tensor.location, []).append(tensor)
    for location, tensors in by_file.items():
        path = graph_path.parent / location
        first = tensors[0].name
        if not location or not path.is_file():
            report.add(Finding(
                "load.external_data", LOAD, config_path,
                f"External data path does not exist: {path} ({len(tensors)} tensor(s) of {graph_path.name} are "
                f"stored there, e.g. '{first}')", tensor=first, expected="a file", actual="absent"))
            continue
        size = path.stat().st_size
        last = max(tensors, key=lambda t: t.end)
        if last.end > size:
            report.add(Finding(
                "load.external_data", LOAD, config_path,
                f"External data file {path} is too short for {graph_path.name}: tensor '{last.name}' ends at byte "
                f"{last.end}", tensor=last.name, expected=f">= {last.end} bytes", actual=f"{size} bytes"))


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _tensors(subgraph)


# Element types stored two to a byte.
_PACKED = {getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
           if hasattr(onnx.TensorProto, name)}


def _nbytes(tensor: onnx.TensorProto) -> int:
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.data_type in _PACKED:
        return (count + 1) // 2
    return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
