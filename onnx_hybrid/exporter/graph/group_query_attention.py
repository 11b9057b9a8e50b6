"""Full attention over shared KV buffers (``--kv-cache shared``): ``com.microsoft::GroupQueryAttention``.

onnxruntime-genai with ``search.past_present_share_buffer: true`` allocates each layer's past key/value
once, ``[B, Hkv, max_length, D]``, and binds the same buffer as the present output; GQA writes the step's
keys and values into it in place. That fixed binding is what CUDA graph capture needs.

Rows stay on the padded grid that onnxruntime-genai feeds (left padding): every row's key ``j`` sits at
buffer column ``j``, so ``seqlens_k`` is ``total_sequence_length - 1`` for every row and GQA's own causal
rule places the step's tokens at columns ``total - S .. total - 1``. Padding keys are masked by the same
additive bias the concat graph uses (causal and ``attention_mask``, finite minimum), as GQA's
``attention_bias`` input ``[B, 1, S, total]``: this reproduces HF's left-padded attention exactly, which
GQA's ``seqlens_k`` alone cannot (it assumes each row's valid tokens start at column 0).
RoPE and the q/k norms are applied before the op (``do_rotary`` 0), as in the concat graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...ops import contract
from .attention import gated_output, project
from .context import GraphContext

CONCAT, SHARED = "concat", "shared"
KV_CACHES = (CONCAT, SHARED)


def gqa_lengths(ctx: GraphContext, attention_mask: ir.Value, batch: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(seqlens_k int32 [B], total_sequence_length int32 scalar) of the padded grid: total - 1 for every row."""
    total = ctx.op("Shape", attention_mask, start=1, end=2)  # int64 [1]
    seqlens = ctx.op("Expand", ctx.op("Sub", total, ctx.const([1])), batch)
    return (ctx.op("Cast", seqlens, to=ir.DataType.INT32),
            ctx.op("Cast", ctx.op("Squeeze", total), to=ir.DataType.INT32))


def group_query_attention(ctx: GraphContext, layer: int, x: ir.Value, past_key: ir.Value, past_value: ir.Value,
                          present_key: ir.Value, present_value: ir.Value) -> ir.Value:
    cfg, sh = ctx.config, ctx.shared
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, k, v, gate = project(ctx, layer, x)

    def rows(t: ir.Value, heads: int) -> ir.Value:  # [N, h, D] -> [B, S, h*D]
        return ctx.op("Reshape", t, ctx.op("Concat", sh.batch, sh.seq, ctx.const([heads * d]), axis=0))

    bias = ctx.op("Squeeze", sh.attention_bias, ctx.const([1]))  # [B, 1, 1, S, L] -> [B, 1, S, L]
    out = ir.Value()
    # Inputs 7-9 (cos/sin caches, position_ids) stay empty: rotary is applied above; 11 (head_sink) unused.
    ctx.add_node(ir.node(
        "GroupQueryAttention",
        [rows(q, hq), rows(k, hkv), rows(v, hkv), past_key, past_value, sh.kv_seqlens, sh.kv_total,
         None, None, None, bias],
        {"num_heads": hq, "kv_num_heads": hkv, "scale": float(np.float32(d ** -0.5)), "do_rotary": 0},
        domain=contract.MS_DOMAIN, outputs=[out, present_key, present_value],
        name=f"/model/layers.{layer}/attn/GroupQueryAttention"))
    return gated_output(ctx, layer, ctx.op("Reshape", out, ctx.const([-1, hq, d])), gate)
