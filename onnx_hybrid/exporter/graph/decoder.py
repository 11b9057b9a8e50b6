"""The whole decoder graph: I/O, the shared preamble, the layer stack and the head (spec/model.md §8)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from ...ops import contract
from .. import io_names as io
from ..model_config import FULL, LINEAR
from .attention import attention
from .context import FLOAT, OPSET, GraphContext, SharedInputs
from .feed_forward import dense_mlp, sparse_moe
from .gated_deltanet import gated_deltanet

INT64, INT32 = ir.DataType.INT64, ir.DataType.INT32


@dataclass(frozen=True)
class GraphOptions:
    last_token_logits: bool  # logits [B, 1, V] for each row's last position instead of [B, S, V]


def _input(name: str, dtype: ir.DataType, dims) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))


def build_decoder(ctx: GraphContext, options: GraphOptions) -> tuple[list[ir.Value], list[ir.Value]]:
    """Emit every node onto ``ctx.tape`` and every weight recipe into ``ctx.weights``; return the graph I/O."""
    cfg, act = ctx.config, ctx.act
    b, s = io.BATCH, io.SEQUENCE
    input_ids = _input(io.INPUT_IDS, INT64, [b, s])
    attention_mask = _input(io.ATTENTION_MASK, INT64, [b, io.TOTAL_SEQUENCE])
    position_ids = _input(io.POSITION_IDS, INT64, [b, s])
    inputs, outputs = [input_ids, attention_mask, position_ids], []
    state_inputs, state_outputs, update_outputs = [], [], []
    layer_io = {}
    k1 = cfg.conv_kernel - 1
    for i, kind in enumerate(cfg.layer_types):
        if kind == LINEAR:
            conv_shape = [b, cfg.conv_channels, k1]
            rec_shape = [b, cfg.gdn_value_heads, cfg.gdn_value_dim, cfg.gdn_key_dim]  # V-major
            pc, pr = _input(io.PAST_CONV % i, act, conv_shape), _input(io.PAST_RECURRENT % i, FLOAT, rec_shape)
            nc, nr = _input(io.PRESENT_CONV % i, act, conv_shape), _input(io.PRESENT_RECURRENT % i, FLOAT, rec_shape)
            cu = cap = None
            if ctx.capacity:
                cu = _input(io.STATE_UPDATE_CONV_VALUE % i, act, [b, ctx.capacity, cfg.conv_channels])
                width = contract.gdn_capsule_width(ctx.capacity, cfg.gdn_value_heads, cfg.gdn_key_heads,
                                                   cfg.gdn_key_dim, cfg.gdn_value_dim)
                cap = _input(io.STATE_UPDATE_RECURRENT_CAPSULE % i, FLOAT, [b, width])
                update_outputs += [cu, cap]
            layer_io[i] = (pc, pr, nc, nr, cu, cap)
            state_inputs += [pc, pr]
            state_outputs += [nc, nr]
        else:
            kv = [cfg.num_kv_heads, cfg.head_dim]
            pk = _input(io.PAST_KEY % i, act, [b, kv[0], io.PAST_SEQUENCE, kv[1]])
            pv = _input(io.PAST_VALUE % i, act, [b, kv[0], io.PAST_SEQUENCE, kv[1]])
            nk = _input(io.PRESENT_KEY % i, act, [b, kv[0], io.TOTAL_SEQUENCE, kv[1]])
            nv = _input(io.PRESENT_VALUE % i, act, [b, kv[0], io.TOTAL_SEQUENCE, kv[1]])
            layer_io[i] = (pk, pv, nk, nv)
            state_inputs += [pk, pv]
            state_outputs += [nk, nv]
    capture_count = active = None
    if ctx.capacity:
        capture_count = _input(io.STATE_UPDATE_CAPTURE_COUNT, INT32, [b])
        active = _input(io.STATE_UPDATE_ACTIVE, INT32, [1])
    inputs += state_inputs + ([capture_count, active] if ctx.capacity else [])

    ctx.shared = _preamble(ctx, input_ids, attention_mask, position_ids, capture_count, active)
    embed = ctx.weights.tensor("model.embed_tokens.weight", "model.embed_tokens.weight",
                               [cfg.vocab_size, cfg.hidden_size], ctx.np_act)
    hidden = ctx.op("Gather", embed, ctx.op("Reshape", input_ids, ctx.const([-1])), axis=0)  # [N, H]

    for i, kind in enumerate(cfg.layer_types):
        prefix = f"model.layers.{i}."
        x = ctx.rms_norm(hidden, ctx.norm_weight(f"{prefix}input_layernorm.weight",
                                                 f"{prefix}input_layernorm.weight", cfg.hidden_size))
        mixed = (gated_deltanet(ctx, i, x, *layer_io[i]) if kind == LINEAR else attention(ctx, i, x, *layer_io[i]))
        hidden = ctx.op("Add", hidden, mixed)
        x = ctx.rms_norm(hidden, ctx.norm_weight(f"{prefix}post_attention_layernorm.weight",
                                                 f"{prefix}post_attention_layernorm.weight", cfg.hidden_size))
        ffn = sparse_moe(ctx, i, x) if cfg.moe_layers[i] else dense_mlp(ctx, i, x)
        hidden = ctx.op("Add", hidden, ffn)

    logits = _head(ctx, hidden, embed, options)
    return inputs, [logits] + state_outputs + update_outputs


def assemble_model(ctx: GraphContext, inputs: list[ir.Value], outputs: list[ir.Value]) -> ir.Model:
    """The model, once every weight value carries its (external) data."""
    initializers = list(ctx.tape.initializers) + [plan.value for plan in ctx.weights.plans.values()]
    graph = ir.Graph(inputs, outputs, nodes=ctx.tape.nodes, initializers=initializers,
                     opset_imports={"": OPSET, ctx.op_domain: contract.OPSET_VERSION}, name="hybrid_decoder")
    return ir.Model(graph, ir_version=10, producer_name="onnx-hybrid")


def _preamble(ctx: GraphContext, input_ids, attention_mask, position_ids, capture_count, active) -> SharedInputs:
    cfg = ctx.config
    batch, seq = ctx.ops("Split", ctx.op("Shape", input_ids), ctx.const([1, 1]), num_outputs=2, axis=0)
    # The rows of this step: the last S columns of the mask (HF masks the GDN input with them).
    step_mask = ctx.op("Slice", attention_mask, ctx.op("Neg", seq), ctx.const([np.iinfo(np.int64).max]),
                       ctx.const([1]))
    mask_column = ctx.op("Cast", ctx.op("Reshape", step_mask, ctx.const([-1, 1])), to=ctx.act)
    seq_scalar = ctx.op("Squeeze", seq)
    tokens = ctx.op("Mul", ctx.op("Squeeze", batch), seq_scalar)
    cu = ctx.op("Range", ctx.const(0), ctx.op("Add", tokens, ctx.const(1)), seq_scalar)
    cu_seqlens = ctx.op("Cast", cu, to=INT32)

    cos = sin = bias = None
    if FULL in cfg.layer_types:
        half = cfg.rotary_dim // 2
        # inv_freq as HF builds it in fp32: theta ** (-2i / R).
        inv_freq = (1.0 / (cfg.rope_theta ** (np.arange(0, cfg.rotary_dim, 2, dtype=np.int64)
                                              .astype(np.float32) / cfg.rotary_dim))).astype(np.float32)
        assert inv_freq.shape == (half,)
        pos = ctx.op("Cast", ctx.op("Reshape", position_ids, ctx.const([-1, 1])), to=FLOAT)
        freqs = ctx.op("Mul", pos, ctx.const(inv_freq, np.float32))
        angles = ctx.op("Unsqueeze", ctx.op("Concat", freqs, freqs, axis=-1), ctx.const([1]))  # [N, 1, R]
        cos, sin = ctx.op("Cos", angles), ctx.op("Sin", angles)
        if ctx.act != FLOAT:
            cos, sin = ctx.op("Cast", cos, to=ctx.act), ctx.op("Cast", sin, to=ctx.act)

        total = ctx.op("Squeeze", ctx.op("Shape", attention_mask, start=1, end=2))
        key_pos = ctx.op("Range", ctx.const(0), total, ctx.const(1))
        query_pos = ctx.op("Range", ctx.op("Sub", total, seq_scalar), total, ctx.const(1))
        causal = ctx.op("LessOrEqual", key_pos, ctx.op("Unsqueeze", query_pos, ctx.const([1])))  # [S, L]
        keys_ok = ctx.op("Unsqueeze", ctx.op("Cast", attention_mask, to=ir.DataType.BOOL), ctx.const([1, 2, 3]))
        allowed = ctx.op("And", causal, keys_ok)  # [B, 1, 1, S, L]
        # A finite minimum (not -inf) keeps fully masked (padded) query rows finite, as HF does.
        bias = ctx.op("Where", allowed, ctx.act_const(0.0), ctx.act_const(float(ml_dtypes.finfo(ctx.np_act).min)))
    return SharedInputs(batch=batch, seq=seq, mask_column=mask_column, cu_seqlens=cu_seqlens, cos=cos, sin=sin,
                        attention_bias=bias, capture_count=capture_count, state_update_active=active)


def _head(ctx: GraphContext, hidden: ir.Value, embed: ir.Value, options: GraphOptions) -> ir.Value:
    cfg, sh = ctx.config, ctx.shared
    if options.last_token_logits:
        rows = ctx.op("Reshape", hidden, ctx.op("Concat", sh.batch, sh.seq, ctx.const([cfg.hidden_size]), axis=0))
        hidden = ctx.op("Reshape", ctx.op("Slice", rows, ctx.const([-1]), ctx.const([np.iinfo(np.int64).max]),
                                          ctx.const([1])), ctx.const([-1, cfg.hidden_size]))
        out_seq = ctx.const([1])
    else:
        out_seq = sh.seq
    hidden = ctx.rms_norm(hidden, ctx.norm_weight("model.norm.weight", "model.norm.weight", cfg.hidden_size))
    # A tied head reuses the embedding initializer through Gemm(transB=1): one copy of the matrix.
    lm_head = embed if cfg.tie_word_embeddings else ctx.weights.tensor(
        "lm_head.weight", "lm_head.weight", [cfg.vocab_size, cfg.hidden_size], ctx.np_act)
    logits = ctx.linear(hidden, lm_head)
    shape = ctx.op("Concat", sh.batch, out_seq, ctx.const([cfg.vocab_size]), axis=0)
    return ctx.op("Reshape", logits, shape, output=_input(io.LOGITS, ctx.act, [io.BATCH, "logits_sequence_length"
                                                                                  if options.last_token_logits
                                                                                  else io.SEQUENCE,
                                                                                  cfg.vocab_size]))
