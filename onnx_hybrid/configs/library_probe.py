"""Run as a script (``python library_probe.py LIBRARY GRAPH...``, in a child process of the validator): register
a custom op library with ONNX Runtime as og.Model does, then load each graph's structure with it.

Loading resolves every node against the registered schemas (an unregistered domain or op fails there) but
creates no kernels, so the graphs need no weights (their initializers become inputs) and no execution
provider. The script imports nothing of onnx_hybrid, so a library that crashes or hangs takes down only
this process. It prints one JSON object: {"library": error or null, "graphs": {graph: error or null}}.
"""

from __future__ import annotations

import json
import sys


def weightless(path: str) -> bytes:
    """The graph at ``path`` with its initializers declared as graph inputs instead (no data read)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    declared = {value.name for value in graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in graph.initializer if t.name not in declared)
    del graph.initializer[:]
    return model.SerializeToString()


def probe(library: str, graphs: list[str]) -> dict:
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C  # its InferenceSession loads without initializing

    options = ort.SessionOptions()
    try:
        options.register_custom_ops_library(library)
    except Exception as error:  # ORT raises its own exception types
        return {"library": str(error), "graphs": {}}
    results = {}
    for graph in graphs:
        try:
            C.InferenceSession(options, weightless(graph), False, False)
            results[graph] = None
        except Exception as error:
            results[graph] = str(error)
    return {"library": None, "graphs": results}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2:])))
