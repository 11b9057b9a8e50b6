"""The multi-token-prediction head as its own graph, ``mtp.onnx`` (docs/model.md#mtp-head; its config:
docs/genai-config.md#mtp-drafter).

    e      = RMSNorm(embed_tokens[input_ids]; pre_fc_norm_embedding)
    g      = RMSNorm(hidden_states;           pre_fc_norm_hidden)     # the main decoder's post-norm hidden
    x      = concat(e, g) @ fc^T                                      # embedding half first
    y      = one full-attention decoder layer (mtp.layers.0.*: the main layers' code and math)
    h_out  = RMSNorm(y; mtp.norm)                                     # -> hidden_states_out
    logits = h_out @ lm_head^T                                        # the main model's lm_head

The head is a one-layer decoder to onnxruntime-genai: its KV cache is ``past_key_values.0.*``, fed like the
main model's (non-paged ``[B, Hkv, P, D]`` with ``attention_mask``, or the paged pool with the packed-batch
metadata). Norm weights are exported as 1 + w like every other norm.
"""

from __future__ import annotations

from dataclasses import replace

import onnx_ir as ir

from .. import io_names as io
from ..model_config import FULL, ModelConfig
from .context import GraphContext
from .decoder import (decoder_layer, full_attention_mixer, graph_input, graph_output, kv_cache_io, packed_inputs,
                      packed_preamble, preamble, token_inputs)
from .paged_attention import PagedLayout

MTP_PREFIX = "mtp."
LAYER_PREFIX = "mtp.layers."


def head_config(ctx: GraphContext) -> ModelConfig:
    """The main config reduced to the head's one full-attention layer, with an MoE block when the
    checkpoint's head has a router (MoE releases), else a dense MLP."""
    moe = f"{LAYER_PREFIX}0.mlp.gate.weight" in ctx.weights.checkpoint
    return replace(ctx.config, num_layers=1, layer_types=(FULL,), moe_layers=(moe,))


def build_mtp_head(ctx: GraphContext, paged: PagedLayout | None) -> tuple[list[ir.Value], list[ir.Value]]:
    """Emit the head onto ``ctx.tape`` (``ctx.config`` must be :func:`head_config`'s), paged like the main
    model when ``paged`` is given; return the graph I/O."""
    cfg, act = ctx.config, ctx.act
    h = cfg.hidden_size
    past_key, past_value, present_key, present_value = kv_cache_io(ctx, 0, paged)
    past, present = [past_key, past_value], [present_key, present_value]
    if paged:
        packed = packed_inputs()
        input_ids, inputs = packed.input_ids, packed.values()
        rows = [io.TOKENS]
        ctx.shared = packed_preamble(ctx, packed, None, None)
    else:
        input_ids, attention_mask, position_ids = inputs = token_inputs()
        rows = [io.BATCH, io.SEQUENCE]
        ctx.shared = preamble(ctx, input_ids, attention_mask, position_ids, None, None)
    mixer = full_attention_mixer(ctx, paged)
    hidden_in = graph_input(io.HIDDEN_STATES, act, [*rows, h])
    inputs = [*inputs[:1], hidden_in, *inputs[1:], *past]

    e = ctx.rms_norm(ctx.embed(ctx.op("Reshape", input_ids, ctx.const([-1]))), _norm(ctx, "pre_fc_norm_embedding"))
    g = ctx.rms_norm(ctx.op("Reshape", hidden_in, ctx.const([-1, h])), _norm(ctx, "pre_fc_norm_hidden"))
    fc = ctx.projection_tensor(f"{MTP_PREFIX}fc.weight", f"{MTP_PREFIX}fc.weight", [h, 2 * h])
    x = ctx.linear(ctx.op("Concat", e, g, axis=-1), fc)
    y, branch = decoder_layer(ctx, 0, x, None, lambda normed: mixer(ctx, 0, normed, *past, *present))
    h_out, _ = ctx.add_rms_norm(y, branch, _norm(ctx, "norm"))
    logits = ctx.lm_head(h_out)

    if paged:
        outputs = [graph_output(logits, io.LOGITS, act, [*rows, cfg.vocab_size]),
                   graph_output(h_out, io.HIDDEN_STATES_OUT, act, [*rows, h])]
    else:
        def unflatten(value: ir.Value, name: str, width: int) -> ir.Value:
            shape = ctx.op("Concat", ctx.shared.batch, ctx.shared.seq, ctx.const([width]), axis=0)
            return ctx.op("Reshape", value, shape, output=graph_input(name, act, [*rows, width]))

        outputs = [unflatten(logits, io.LOGITS, cfg.vocab_size), unflatten(h_out, io.HIDDEN_STATES_OUT, h)]
    return inputs, outputs[:1] + present + outputs[1:]


def _norm(ctx: GraphContext, name: str) -> ir.Value:
    source = f"{MTP_PREFIX}{name}.weight"
    return ctx.norm_weight(source, source, ctx.config.hidden_size)

