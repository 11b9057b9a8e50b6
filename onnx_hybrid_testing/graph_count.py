"""Nodes one decode step runs: the saved graph's, and what ONNX Runtime's CPU optimizer leaves of it (each
remaining node is one kernel call; issue 30's per-step count). Every node of these graphs runs every step."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort


def decode_step_nodes(model_path, optimized_path) -> dict:
    """``{"graph": n, "optimized": m, "optimized_ops": Counter}`` of ``model_path``; the optimized graph is written
    to ``optimized_path`` (its initializers beside it), with our kernel library registered when the graph uses it."""
    from onnx_hybrid.ops import contract, library

    model_path, optimized_path = Path(model_path), Path(optimized_path)
    graph = onnx.load(str(model_path), load_external_data=False).graph
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # the warning that an ENABLE_ALL model is hardware specific: a count only
    options.optimized_model_filepath = str(optimized_path)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                     optimized_path.name + ".data")
    if any(node.domain == contract.DOMAIN for node in graph.node):
        library.register(options)
    ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(optimized_path), load_external_data=False).graph
    return {"graph": len(graph.node), "optimized": len(optimized.node),
            "optimized_ops": Counter(node.op_type for node in optimized.node)}
