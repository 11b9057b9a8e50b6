"""Paged exports prepared for onnxruntime-genai 0.18's Engine as the tests drive it (``genai_driver.run_engine``):
``set_eos`` makes runs reach their length, and ``tamper_capsules`` is the negative control of speculative
decoding, the same model with every GDN capsule multiplied by zero.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx

from onnx_hybrid.ops import contract


def set_eos(package: Path, token: int) -> None:
    """Make ``token`` the only EOS and the pad id, so runs that never produce it reach their length."""
    path = Path(package) / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"].update(eos_token_id=[token], pad_token_id=token)
    path.write_text(json.dumps(config, indent=4) + "\n")


def tamper_capsules(package: Path, directory: Path) -> Path:
    """A copy of ``package`` whose GatedDeltaNet capsules are zeroed by a Mul after the op: names, types and
    shapes stay, so the config validates and the Engine loads it, but every replay rebuilds a zero state."""
    shutil.copytree(package, directory)
    model = onnx.load(str(directory / "model.onnx"))
    for node in [n for n in model.graph.node if n.op_type == contract.GATED_DELTA_NET.name]:
        capsule = node.output[2]
        node.output[2] = capsule + ".untampered"
        model.graph.node.append(onnx.helper.make_node("Mul", [node.output[2], "tamper.zero"], [capsule]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros([1], np.float32), "tamper.zero"))
    onnx.save(model, str(directory / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return directory

