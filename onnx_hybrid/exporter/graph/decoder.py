"""The whole decoder graph: I/O, the shared preamble, the layer stack and the head (docs/model.md#decoder)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import ml_dtypes
import numpy as np
import onnx_ir as ir

from ...ops import contract
from .. import io_names as io
from ..model_config import FULL, LINEAR
from .attention import attention
from .context import FLOAT, OPSET, GraphContext, PackedInputs, SharedInputs, TokenGrid
from .feed_forward import dense_mlp, sparse_moe
from .gated_deltanet import gated_deltanet
from .group_query_attention import SHARED, align_rows, group_query_attention
from .paged_attention import PagedLayout, paged_attention

INT64, INT32 = ir.DataType.INT64, ir.DataType.INT32


@dataclass(frozen=True)
class GraphOptions:
    last_token_logits: bool  # logits [B, 1, V] for each row's last position instead of [B, S, V]
    # Packed tokens, PagedAttention over a block pool and logits for every token (paged_attention.py).
    paged: PagedLayout | None = None
    # Also output the post-norm hidden state that feeds lm_head (what an MTP head drafts from).
    hidden_states: bool = False
    logits_dtype: ir.DataType | None = None  # None: the activation type


def graph_input(name: str, dtype: ir.DataType, dims) -> ir.Value:
    """A named graph input or output."""
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))


def graph_output(value: ir.Value, name: str, dtype: ir.DataType, dims) -> ir.Value:
    """A computed value renamed and typed as a graph output (other nodes may still read it)."""
    value.name, value.type, value.shape = name, ir.TensorType(dtype), ir.Shape(dims)
    return value


def token_inputs() -> list[ir.Value]:
    """[input_ids, attention_mask, position_ids] of a non-paged graph ([B, S], the mask [B, total])."""
    b, s = io.BATCH, io.SEQUENCE
    return [graph_input(io.INPUT_IDS, INT64, [b, s]), graph_input(io.ATTENTION_MASK, INT64, [b, io.TOTAL_SEQUENCE]),
            graph_input(io.POSITION_IDS, INT64, [b, s])]


def kv_cache_io(ctx: GraphContext, layer: int, paged: PagedLayout | None
                ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """(past key, past value, present key, present value) of a full-attention layer: [B, Hkv, P or T, D]
    caches, one [B, Hkv, max_length, D] buffer as past and present with shared KV, or with ``paged`` the block
    pool, past and present the same pool updated in place."""
    cfg, act = ctx.config, ctx.act
    if paged:
        pool, kv_type = [io.NUM_BLOCKS, paged.block_size, cfg.num_kv_heads, cfg.head_dim], paged.cache_dtype(act)
        past_shape = present_shape = pool
    elif ctx.kv_cache == SHARED:
        kv_type = act
        past_shape = present_shape = [io.BATCH, cfg.num_kv_heads, io.KV_BUFFER_LENGTH, cfg.head_dim]
    else:
        kv_type = act
        past_shape = [io.BATCH, cfg.num_kv_heads, io.PAST_SEQUENCE, cfg.head_dim]
        present_shape = [io.BATCH, cfg.num_kv_heads, io.TOTAL_SEQUENCE, cfg.head_dim]
    return (graph_input(io.PAST_KEY % layer, kv_type, past_shape),
            graph_input(io.PAST_VALUE % layer, kv_type, past_shape),
            graph_input(io.PRESENT_KEY % layer, kv_type, present_shape),
            graph_input(io.PRESENT_VALUE % layer, kv_type, present_shape))


def build_decoder(ctx: GraphContext, options: GraphOptions) -> tuple[list[ir.Value], list[ir.Value]]:
    """Emit every node onto ``ctx.tape`` and every weight recipe into ``ctx.weights``; return the graph I/O."""
    cfg, act, paged = ctx.config, ctx.act, options.paged
    b = io.BATCH
    if paged:
        packed = packed_inputs()
        input_ids, inputs = packed.input_ids, packed.values()
    else:
        input_ids, attention_mask, position_ids = inputs = token_inputs()
    state_inputs, state_outputs, update_outputs = [], [], []
    layer_io = {}
    k1 = cfg.conv_kernel - 1
    for i, kind in enumerate(cfg.layer_types):
        if kind == LINEAR:
            conv_shape = [b, cfg.conv_channels, k1]
            rec_shape = [b, cfg.gdn_value_heads, cfg.gdn_value_dim, cfg.gdn_key_dim]  # V-major
            pc, pr = graph_input(io.PAST_CONV % i, act, conv_shape), graph_input(io.PAST_RECURRENT % i, FLOAT, rec_shape)
            nc, nr = graph_input(io.PRESENT_CONV % i, act, conv_shape), graph_input(io.PRESENT_RECURRENT % i, FLOAT, rec_shape)
            cu = cap = None
            if ctx.capacity:
                cu = graph_input(io.STATE_UPDATE_CONV_VALUE % i, act, [b, ctx.capacity, cfg.conv_channels])
                width = contract.gdn_capsule_width(ctx.capacity, cfg.gdn_value_heads, cfg.gdn_key_heads,
                                                   cfg.gdn_key_dim, cfg.gdn_value_dim)
                cap = graph_input(io.STATE_UPDATE_RECURRENT_CAPSULE % i, FLOAT, [b, width])
                update_outputs += [cu, cap]
            layer_io[i] = (pc, pr, nc, nr, cu, cap)
            state_inputs += [pc, pr]
            state_outputs += [nc, nr]
        else:
            pk, pv, nk, nv = layer_io[i] = kv_cache_io(ctx, i, paged)
            state_inputs += [pk, pv]
            state_outputs += [nk, nv]
    capture_count = active = None
    if ctx.capacity:
        capture_count = graph_input(io.STATE_UPDATE_CAPTURE_COUNT, INT32, [b])
        active = graph_input(io.STATE_UPDATE_ACTIVE, INT32, [1])
    inputs += state_inputs + ([capture_count, active] if ctx.capacity else [])

    if paged:
        ctx.shared = packed_preamble(ctx, packed, capture_count, active)
    else:
        ctx.shared = preamble(ctx, input_ids, attention_mask, position_ids, capture_count, active)
    full_attention = full_attention_mixer(ctx, paged)
    hidden = ctx.embed(ctx.op("Reshape", input_ids, ctx.const([-1])))  # [N, H]
    mask = ctx.shared.mask_column
    if mask is not None:  # padded positions' residual is zero from here on (docs/model.md#gated-deltanet-layer)
        hidden = ctx.op("Mul", hidden, mask)

    def mixer(i: int, kind: str, x: ir.Value) -> ir.Value:
        if kind == LINEAR:
            return gated_deltanet(ctx, i, x, *layer_io[i])
        out = full_attention(ctx, i, x, *layer_io[i])
        # the one block whose output at a padded position is not zero: masked, so that the residual stays zero there
        return out if mask is None else ctx.op("Mul", out, mask)

    branch = None
    for i, kind in enumerate(cfg.layer_types):
        hidden, branch = decoder_layer(ctx, i, hidden, branch, partial(mixer, i, kind))

    return inputs, _head(ctx, hidden, branch, options) + state_outputs + update_outputs


def full_attention_mixer(ctx: GraphContext, paged: PagedLayout | None):
    """The full-attention layer function: paged, over shared KV buffers, or over concatenated KV."""
    if paged:
        return partial(paged_attention, layout=paged)
    return group_query_attention if ctx.kv_cache == SHARED else attention


def decoder_layer(ctx: GraphContext, index: int, hidden: ir.Value, branch: ir.Value | None, mixer
                  ) -> tuple[ir.Value, ir.Value]:
    """hidden + mixer(norm(hidden)), then + FFN(norm(...)), the FFN dense or MoE per the config (docs/model.md#decoder).

    The residual stream travels as (hidden, branch): ``branch`` is the previous block's output not yet added
    (None before the first layer), so every residual add is fused into the norm that follows it
    (ctx.add_rms_norm). Returns (residual, this layer's FFN output)."""
    cfg, prefix = ctx.config, ctx.layer(index)
    x, hidden = ctx.add_rms_norm(hidden, branch, ctx.norm_weight(
        f"{prefix}input_layernorm.weight", f"{prefix}input_layernorm.weight", cfg.hidden_size))
    x, hidden = ctx.add_rms_norm(hidden, mixer(x), ctx.norm_weight(
        f"{prefix}post_attention_layernorm.weight", f"{prefix}post_attention_layernorm.weight", cfg.hidden_size))
    return hidden, sparse_moe(ctx, index, x) if cfg.moe_layers[index] else dense_mlp(ctx, index, x)


def assemble_model(ctx: GraphContext, inputs: list[ir.Value], outputs: list[ir.Value]) -> ir.Model:
    """The model, once every weight value carries its (external) data."""
    initializers = list(ctx.tape.initializers) + [v for plan in ctx.weights.plans.values() for v in plan.values()]
    graph = ir.Graph(inputs, outputs, nodes=ctx.tape.nodes, initializers=initializers,
                     opset_imports=_opset_imports(ctx), name="hybrid_decoder")
    return ir.Model(graph, ir_version=10, producer_name="onnx-hybrid")


def _opset_imports(ctx: GraphContext) -> dict[str, int]:
    """The standard opset and every custom domain a node uses (ours or com.microsoft's PagedAttention)."""
    custom = {node.domain for node in ctx.tape.nodes if node.domain not in ("", "ai.onnx")}
    return {"": OPSET, **{domain: contract.OPSET_VERSION for domain in sorted(custom | {ctx.op_domain})}}


def preamble(ctx: GraphContext, input_ids, attention_mask, position_ids, capture_count, active) -> SharedInputs:
    """The values every layer of a non-paged graph shares: batch and step sizes, the mask rows, RoPE tables."""
    cfg = ctx.config
    batch, seq = ctx.ops("Split", ctx.op("Shape", input_ids), ctx.const([1, 1]), num_outputs=2, axis=0)
    grid = token_grid(ctx, input_ids)
    step_mask = step_columns(ctx, attention_mask, grid)  # HF masks the GDN input with them
    mask_column = ctx.op("Cast", ctx.op("Reshape", step_mask, ctx.const([-1, 1])), to=ctx.act)
    seq_scalar = ctx.op("Squeeze", seq)
    tokens = ctx.op("Mul", ctx.op("Squeeze", batch), seq_scalar)
    cu = ctx.op("Range", ctx.const(0), ctx.op("Add", tokens, ctx.const(1)), seq_scalar)
    cu_seqlens = ctx.op("Cast", cu, to=INT32)

    positions = caches = bias = rows = None
    if FULL in cfg.layer_types:
        caches = _rotary_caches(ctx)
        positions = ctx.op("Reshape", position_ids, ctx.const([-1]))
    if FULL in cfg.layer_types and ctx.kv_cache == SHARED:
        rows = align_rows(ctx, grid, attention_mask, step_mask, batch, seq)
        positions = ctx.op("Unsqueeze", ctx.op("Gather", positions, rows.to_front, axis=0), ctx.const([0]))
    elif FULL in cfg.layer_types:
        positions = ctx.op("Unsqueeze", positions, ctx.const([0]))
        total = ctx.op("Squeeze", ctx.op("Shape", attention_mask, start=1, end=2))
        key_pos = ctx.op("Range", ctx.const(0), total, ctx.const(1))
        query_pos = ctx.op("Range", ctx.op("Sub", total, seq_scalar), total, ctx.const(1))
        causal = ctx.op("LessOrEqual", key_pos, ctx.op("Unsqueeze", query_pos, ctx.const([1])))  # [S, L]
        keys_ok = ctx.op("Unsqueeze", ctx.op("Cast", attention_mask, to=ir.DataType.BOOL), ctx.const([1, 2, 3]))
        allowed = ctx.op("And", causal, keys_ok)  # [B, 1, 1, S, L]
        # A finite minimum (not -inf) keeps fully masked (padded) query rows finite, as HF does.
        bias = ctx.op("Where", allowed, ctx.act_const(0.0), ctx.act_const(float(ml_dtypes.finfo(ctx.np_act).min)))
    return SharedInputs(batch=batch, seq=seq, mask_column=mask_column, cu_seqlens=cu_seqlens, positions=positions,
                        rotary_caches=caches, attention_bias=bias, capture_count=capture_count,
                        state_update_active=active, rows=rows)


def token_grid(ctx: GraphContext, input_ids: ir.Value) -> TokenGrid:
    """S per row and each token's slot, from a [B, S] grid of ones and its running sum: device tensors, never the
    host-side shape values (a shape value consumed by a CUDA node costs a host-to-device copy node, and ORT
    refuses to capture a graph that has one)."""
    ones = ctx.op("ConstantOfShape", ctx.op("Shape", input_ids), value=ir.tensor(np.array([1], np.int64)))
    return TokenGrid(seq=ctx.op("ReduceSum", ones, ctx.const([1]), keepdims=1),
                     slots=ctx.op("Sub", ctx.op("CumSum", ones, ctx.const(1)), ctx.const(1)), ones=ones)


def step_columns(ctx: GraphContext, attention_mask: ir.Value, grid: TokenGrid) -> ir.Value:
    """This step's S columns of the attention mask [B, S]: those ending at each row's last 1. onnxruntime-genai
    grows the mask by the step's columns (HF's left padding before them), but under CUDA graph capture it feeds
    one mask of the whole max_length, ones for the tokens so far and zeros beyond; in both, a row's step ends at
    its last valid token. (A row shorter than S in the static form is not fed by onnxruntime-genai.)"""
    mask = ctx.op("Cast", attention_mask, to=FLOAT)
    columns = ctx.op("CumSum", ctx.op("ConstantOfShape", ctx.op("Shape", attention_mask),
                                      value=ir.tensor(np.array([1.0], np.float32))), ctx.const(1))
    end = ctx.op("Cast", ctx.op("ReduceMax", ctx.op("Mul", mask, columns), ctx.const([1]), keepdims=1), to=INT64)
    index = ctx.op("Max", ctx.op("Add", ctx.op("Sub", end, grid.seq), grid.slots), ctx.const(0))
    return ctx.op("GatherElements", attention_mask, index, axis=1)


def _rotary_caches(ctx: GraphContext) -> tuple[ir.Value, ir.Value]:
    """cos and sin [max_position_embeddings, R/2] in the activation type, as com.microsoft::RotaryEmbedding takes
    them: the angles as HF computes them, position (fp32) times inv_freq (fp32, theta ** (-2i / R))."""
    cfg = ctx.config
    inv_freq = (1.0 / (cfg.rope_theta ** (np.arange(0, cfg.rotary_dim, 2, dtype=np.int64)
                                          .astype(np.float32) / cfg.rotary_dim))).astype(np.float32)
    angles = np.arange(cfg.max_position_embeddings, dtype=np.float32)[:, None] * inv_freq[None, :]
    return (ctx.tape.initializer(ir.tensor(np.cos(angles).astype(ctx.np_act), name="cos_cache"), name="cos_cache"),
            ctx.tape.initializer(ir.tensor(np.sin(angles).astype(ctx.np_act), name="sin_cache"), name="sin_cache"))


def packed_inputs() -> PackedInputs:
    """The paged export's inputs, named as onnxruntime-genai 0.18 names them
    (docs/genai-config.md#graph-inputs-and-outputs). Positions are text positions [num_tokens], one of the two
    geometries the Engine accepts (docs/genai-config.md#engine-rules)."""
    b = io.BATCH
    return PackedInputs(
        input_ids=graph_input(io.INPUT_IDS, INT64, [io.TOKENS]),
        position_ids=graph_input(io.POSITION_IDS, INT64, [io.TOKENS]),
        cumulative_sequence_lengths=graph_input(io.CUMULATIVE_SEQUENCE_LENGTHS, INT32, [io.BATCH_PLUS_ONE]),
        past_sequence_lengths=graph_input(io.PAST_SEQUENCE_LENGTHS, INT32, [b]),
        block_table=graph_input(io.BLOCK_TABLE, INT32, [b, io.MAX_BLOCKS]),
        attention_metadata=graph_input(io.ATTENTION_METADATA, INT32, [3]),
    )


def packed_preamble(ctx: GraphContext, packed: PackedInputs, capture_count, active) -> SharedInputs:
    """No padding and no [B, S] grid: requests are ragged rows of the token axis."""
    batch = ctx.op("Shape", packed.past_sequence_lengths)
    full = FULL in ctx.config.layer_types
    positions = ctx.op("Unsqueeze", packed.position_ids, ctx.const([0])) if full else None
    return SharedInputs(batch=batch, seq=None, mask_column=None, cu_seqlens=packed.cumulative_sequence_lengths,
                        positions=positions, rotary_caches=_rotary_caches(ctx) if full else None,
                        attention_bias=None, capture_count=capture_count,
                        state_update_active=active, packed=packed)


def _head(ctx: GraphContext, hidden: ir.Value, branch: ir.Value, options: GraphOptions) -> list[ir.Value]:
    """[logits] or, with ``options.hidden_states``, [logits, hidden_states], from the residual stream (hidden +
    the last layer's branch) through the final norm."""
    cfg, sh = ctx.config, ctx.shared
    # The norm runs over every row (with the last residual add fused in); the lm_head only over those kept.
    hidden, _ = ctx.add_rms_norm(hidden, branch, ctx.norm_weight("model.norm.weight", "model.norm.weight",
                                                                 cfg.hidden_size))
    if options.last_token_logits and not options.paged:  # paged: one row per packed token (drafts are verified)
        rows = ctx.op("Reshape", hidden, ctx.op("Concat", sh.batch, sh.seq, ctx.const([cfg.hidden_size]), axis=0))
        hidden = ctx.op("Reshape", ctx.op("Slice", rows, ctx.const([-1]), ctx.const([np.iinfo(np.int64).max]),
                                          ctx.const([1])), ctx.const([-1, cfg.hidden_size]))
        out_seq = ctx.const([1])
    else:
        out_seq = sh.seq
    logits_type = options.logits_dtype or ctx.act
    logits = ctx.lm_head(hidden)
    if logits_type != ctx.act:
        logits = ctx.op("Cast", logits, to=logits_type)
    if options.paged:  # one row per packed token: name the [num_tokens, ...] values themselves
        outputs = [graph_output(logits, io.LOGITS, logits_type, [io.TOKENS, cfg.vocab_size])]
        if options.hidden_states:
            outputs.append(graph_output(hidden, io.HIDDEN_STATES, ctx.act, [io.TOKENS, cfg.hidden_size]))
        return outputs
    shape = ctx.op("Concat", sh.batch, out_seq, ctx.const([cfg.vocab_size]), axis=0)
    seq_name = "logits_sequence_length" if options.last_token_logits else io.SEQUENCE
    outputs = [ctx.op("Reshape", logits, shape,
                      output=graph_input(io.LOGITS, logits_type, [io.BATCH, seq_name, cfg.vocab_size]))]
    if options.hidden_states:
        shape = ctx.op("Concat", sh.batch, out_seq, ctx.const([cfg.hidden_size]), axis=0)
        outputs.append(ctx.op("Reshape", hidden, shape,
                              output=graph_input(io.HIDDEN_STATES, ctx.act, [io.BATCH, seq_name, cfg.hidden_size])))
    return outputs
