"""Write the MTP drafter next to the main model: ``mtp.onnx``, its weights, and its genai_config blocks.

The head shares the main model's embedding and lm_head. Its graph references them where the main model
stored them, in ``model.onnx.data`` of the same folder (ORT refuses external data outside the model's
folder, and onnxruntime-genai 0.18's ``shared_initializers`` break CPU loading:
docs/genai-config.md#runtime-pitfalls-the-export-avoids), so the matrices are on disk once; each ORT session
still loads its own copy. The head's own weights go to ``mtp.onnx.data``.
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from . import io_names as io
from .checkpoint import Checkpoint
from .errors import ExportError
from .graph.context import GraphContext
from .graph.decoder import assemble_model
from .graph.paged_attention import PagedLayout
from .graph.mtp import LAYER_PREFIX, MTP_PREFIX, build_mtp_head, head_config
from .weights import Weights, write_external_data

MTP_FILE, MTP_DATA_FILE = "mtp.onnx", "mtp.onnx.data"
MTP_REQUIRED = [f"{MTP_PREFIX}fc.weight", f"{MTP_PREFIX}norm.weight", f"{MTP_PREFIX}pre_fc_norm_embedding.weight",
                f"{MTP_PREFIX}pre_fc_norm_hidden.weight", f"{LAYER_PREFIX}0.input_layernorm.weight"]


def mtp_tensor_count(checkpoint: Checkpoint) -> int:
    return sum(name.startswith(MTP_PREFIX) for name in checkpoint.tensors)


def check_mtp_weights(checkpoint: Checkpoint, depth: int | None) -> None:
    """One MTP layer with every tensor the head needs (onnxruntime-genai 0.18 accepts only depth 1)."""
    if depth not in (None, 1):
        raise ExportError(f"mtp_num_hidden_layers is {depth}; onnxruntime-genai runs one MTP layer only "
                          f"(export with --no-mtp to skip the head)")
    if f"{LAYER_PREFIX}1.input_layernorm.weight" in checkpoint:
        raise ExportError("the checkpoint has more than one MTP layer (mtp.layers.1.*); onnxruntime-genai runs "
                          "one only (export with --no-mtp to skip the head)")
    missing = [name for name in MTP_REQUIRED if name not in checkpoint]
    if missing:
        raise ExportError(f"the checkpoint's MTP head is incomplete, missing {', '.join(missing)} "
                          f"(export with --no-mtp to skip it)")


def write_mtp_head(main: GraphContext, paged: PagedLayout | None, stage: Path) -> None:
    """Build the head with ``main``'s dtype, domain and paged layout and save it into ``stage``, after the
    main model's weights have been written (the shared ones point into its data file)."""
    ctx = GraphContext(config=main.config, weights=Weights(main.weights.checkpoint), act=main.act,
                       np_act=main.np_act, op_domain=main.op_domain, capacity=0, layer_prefix=LAYER_PREFIX,
                       quant=main.quant, kv_cache=main.kv_cache, linear_op=main.linear_op,
                       quantized_linear_op=main.quantized_linear_op)
    ctx.config = head_config(ctx)
    inputs, outputs = build_mtp_head(ctx, paged)
    # The embedding and lm_head recipes (quantized or not) are the main model's: same names, same data.
    shared = {name: ctx.weights.plans.pop(name) for name in list(ctx.weights.plans) if name in main.weights.plans}
    write_external_data(ctx.weights, stage / MTP_DATA_FILE)
    for name, plan in shared.items():
        for value, main_value in zip(plan.values(), main.weights.plans[name].values()):
            value.const_value = main_value.const_value  # model.onnx.data, same offset
        ctx.weights.plans[name] = plan
    ir.save(assemble_model(ctx, inputs, outputs), stage / MTP_FILE)


def mtp_config(main_config: dict, *, paged: bool, max_draft_tokens: int) -> dict:
    """Add ``model.mtp``, the decoder's ``hidden_states`` output and ``speculative`` to a genai_config
    (docs/genai-config.md#mtp-drafter); the head runs with the decoder's session options (custom op library
    included)."""
    model = main_config["model"]
    decoder = model["decoder"]
    decoder["outputs"]["hidden_states"] = io.HIDDEN_STATES
    inputs = {"input_ids": io.INPUT_IDS, "hidden_states": io.HIDDEN_STATES, "position_ids": io.POSITION_IDS,
              "past_key_names": io.PAST_KEY, "past_value_names": io.PAST_VALUE}
    if not paged:
        inputs["attention_mask"] = io.ATTENTION_MASK
    model["mtp"] = {
        "enabled": True, "filename": MTP_FILE, "num_hidden_layers": 1,
        "num_key_value_heads": decoder["num_key_value_heads"], "head_size": decoder["head_size"],
        "main_hidden_states": io.HIDDEN_STATES, "inputs": inputs,
        "outputs": {"logits": io.LOGITS, "hidden_states": io.HIDDEN_STATES_OUT, "present_key_names": io.PRESENT_KEY,
                    "present_value_names": io.PRESENT_VALUE},
        "session_options": dict(decoder["session_options"]),
    }
    main_config["speculative"] = {"max_draft_tokens": max_draft_tokens}
    return main_config


def head_overlay(config: dict) -> dict:
    """The overlay that loads ``mtp.onnx`` as a model of its own from the main folder (og.MtpGenerator,
    docs/genai-config.md#mtp-drafter): ``og.Config(folder)`` + ``config.overlay(json.dumps(head_overlay(...)))``."""
    mtp = config["model"]["mtp"]
    return {"model": {"decoder": {
        "filename": mtp["filename"], "num_hidden_layers": 1, "num_key_value_heads": mtp["num_key_value_heads"],
        "head_size": mtp["head_size"], "inputs": {"hidden_states": mtp["inputs"]["hidden_states"]},
        "outputs": {"hidden_states": mtp["outputs"]["hidden_states"]}}}}

