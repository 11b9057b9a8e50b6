"""Shared pieces of the genai_config tests: the fixture folders and I/O-only graphs that match them.

The graphs declare the tensors onnxruntime-genai's synthetic models (and its builder's exports) declare for the
configs in fixtures/genai_configs; every output is a Cast of ``input_ids``, which is all a validator that reads
declared I/O needs.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from onnx_hybrid.ops.contract import gdn_capsule_width

FIXTURES = Path(__file__).parent / "fixtures" / "genai_configs"

F32, F16, I32, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64

# tensor name -> (element type, shape); strings are symbolic dims.
Tensors = dict[str, tuple[int, list]]


def _paged_kv(layers, block_size, kv_heads, head_size, io=F32) -> tuple[Tensors, Tensors]:
    shape = ["num_blocks", block_size, kv_heads, head_size]
    inputs = {f"past_key_values.{i}.{r}": (io, shape) for i in layers for r in ("key", "value")}
    outputs = {f"present.{i}.{r}": (io, shape) for i in layers for r in ("key", "value")}
    return inputs, outputs


def _packed_inputs() -> Tensors:
    return {
        "input_ids": (I64, ["num_tokens"]),
        "block_table": (I32, ["batch_size", "max_num_blocks"]),
        "cumulative_sequence_lengths": (I32, ["batch_size_plus_1"]),
        "past_sequence_lengths": (I32, ["batch_size"]),
        "attention_metadata": (I32, [3]),
    }


def _fixed(conv, recurrent, conv_names, rec_names, *, channels, width, hv, dv, dk, hk, capacity, io=F32,
           capsule_fmt="state_update.{}.recurrent_capsule", value_fmt="state_update.{}.conv_value",
           active=True) -> tuple[Tensors, Tensors]:
    (past_conv, present_conv), (past_rec, present_rec) = conv_names, rec_names
    inputs, outputs = {}, {}
    for i in conv:
        inputs[past_conv.format(i)] = (io, ["batch_size", channels, width])
        outputs[present_conv.format(i)] = (io, ["batch_size", channels, width])
    for i in recurrent:
        inputs[past_rec.format(i)] = (F32, ["batch_size", hv, dv, dk])
        outputs[present_rec.format(i)] = (F32, ["batch_size", hv, dv, dk])
    if capacity:
        inputs["state_update_capture_count"] = (I32, ["batch_size"])
        if active:
            inputs["state_update_active"] = (I32, [1])
        for i in conv:
            outputs[value_fmt.format(i)] = (io, ["batch_size", capacity, channels])
        for i in recurrent:
            outputs[capsule_fmt.format(i)] = (F32, ["batch_size", gdn_capsule_width(capacity, hv, hk, dk, dv)])
    return inputs, outputs


def synthetic_paged_io() -> tuple[Tensors, Tensors]:
    kv_in, kv_out = _paged_kv((1, 4), block_size=4, kv_heads=1, head_size=1)
    outputs = {"logits": (F32, ["num_tokens", 64]), "hidden_states": (F32, ["num_tokens", 1]), **kv_out}
    return {**_packed_inputs(), **kv_in}, outputs


def synthetic_hybrid_io() -> tuple[Tensors, Tensors]:
    inputs = {"input_ids": (I64, ["batch_size", "sequence_length"]),
              "attention_mask": (I64, ["batch_size", "total_sequence_length"]),
              "position_ids": (I64, ["batch_size", "sequence_length"])}
    st_in, st_out = _fixed((0, 3), (2, 5), ("past_conv.{}", "present_conv.{}"),
                           ("past_recurrent.{}", "present_recurrent.{}"),
                           channels=2, width=3, hv=2, dv=2, dk=2, hk=1, capacity=3)
    return {**inputs, **st_in}, {"logits": (F32, ["batch_size", "sequence_length", 16]), **st_out}


def synthetic_composite_io() -> tuple[Tensors, Tensors]:
    kv_in, kv_out = _paged_kv((1, 4), block_size=4, kv_heads=1, head_size=1)
    # The composite generator writes no state_update_active input (optional in the #2454 schema).
    st_in, st_out = _fixed((0, 3), (2, 5), ("past_conv.{}", "present_conv.{}"),
                           ("past_recurrent.{}", "present_recurrent.{}"),
                           channels=2, width=3, hv=2, dv=2, dk=2, hk=1, capacity=3, active=False)
    inputs = {**_packed_inputs(), "position_ids": (I64, ["num_tokens"]), **kv_in, **st_in}
    return inputs, {"logits": (F32, ["num_tokens", 64]), **kv_out, **st_out}


def builder_paged_io() -> tuple[Tensors, Tensors]:
    """The 0.18.0 builder's fp16 paged export of a 4-layer [linear x3, full] Qwen3.5 (Hk 2, Hv 4,
    Dk = Dv 16, conv channels 2*2*16 + 4*16 = 128, K = 4), capacity 3."""
    kv_in, kv_out = _paged_kv((3,), block_size=16, kv_heads=2, head_size=16, io=F16)
    st_in, st_out = _fixed((0, 1, 2), (0, 1, 2), ("past.{}.conv", "present.{}.conv"),
                           ("past.{}.recurrent", "present.{}.recurrent"),
                           channels=128, width=3, hv=4, dv=16, dk=16, hk=2, capacity=3, io=F16)
    inputs = {**_packed_inputs(), "position_ids": (I64, [3, "num_tokens"]), **kv_in, **st_in}
    return inputs, {"logits": (F16, ["num_tokens", 256]), **kv_out, **st_out}


GRAPHS = {
    "synthetic_paged_released": synthetic_paged_io,
    "synthetic_paged_bindings": synthetic_paged_io,
    "synthetic_hybrid_released": synthetic_hybrid_io,
    "synthetic_hybrid_bindings": synthetic_hybrid_io,
    "synthetic_composite_released": synthetic_composite_io,
    "synthetic_composite_bindings": synthetic_composite_io,
    "builder_paged_released": builder_paged_io,
    "builder_paged_bindings": builder_paged_io,
}
RELEASED_FIXTURES = sorted(n for n in GRAPHS if n.endswith("_released"))
BINDINGS_FIXTURES = sorted(n for n in GRAPHS if n.endswith("_bindings"))


def io_only_model(inputs: Tensors, outputs: Tensors) -> onnx.ModelProto:
    """A graph that declares ``inputs`` and ``outputs``.

    Each output is the Identity of an extra input ``source.<output>`` of the same type and shape, so that
    ONNX Runtime's inferred output shapes equal the declared ones (onnxruntime-genai reads those).
    """
    sources = {f"source.{name}": spec for name, spec in outputs.items()}
    nodes = [helper.make_node("Identity", [f"source.{name}"], [name]) for name in outputs]
    graph = helper.make_graph(
        nodes, "io_only",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in {**inputs, **sources}.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name / "genai_config.json").read_text())


def write_export(directory: Path, config: dict, inputs: Tensors, outputs: Tensors) -> Path:
    """A folder with ``genai_config.json`` and the I/O-only graph under ``decoder.filename``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "genai_config.json").write_text(json.dumps(config, indent=2))
    onnx.save(io_only_model(inputs, outputs), str(directory / config["model"]["decoder"]["filename"]))
    return directory


def fixture_export(directory: Path, name: str) -> Path:
    inputs, outputs = GRAPHS[name]()
    return write_export(directory, load_fixture(name), inputs, outputs)


def copy_export(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def mutated(config: dict, edit) -> dict:
    out = copy.deepcopy(config)
    edit(out)
    return out
