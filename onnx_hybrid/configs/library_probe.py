"""Run as a script (``python library_probe.py LIBRARY MODEL...``, in a child process of the validator): register
a custom op library with ONNX Runtime as og.Model does, then load each serialized model with it.

Loading resolves every node against the registered schemas (an unregistered domain or op fails there) but
creates no kernels, so the models need no weights (the validator passes them with their initializers turned
into inputs) and no execution provider. The script imports only onnxruntime, so a library that crashes or
hangs takes down only this process. It prints one JSON object: {"library": error or null, "models": [error or
null for each MODEL]}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def probe(library: str, models: list[str]) -> dict:
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C  # its InferenceSession loads without initializing

    options = ort.SessionOptions()
    try:
        options.register_custom_ops_library(library)
    except Exception as error:  # ORT raises its own exception types
        return {"library": str(error), "models": []}
    results = []
    for model in models:
        try:
            C.InferenceSession(options, Path(model).read_bytes(), False, False)
            results.append(None)
        except Exception as error:
            results.append(str(error))
    return {"library": None, "models": results}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2:])))
