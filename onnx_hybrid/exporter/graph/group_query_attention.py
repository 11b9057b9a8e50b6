"""Full attention over shared KV buffers (``--kv-cache shared``): ``com.microsoft::GroupQueryAttention``.

onnxruntime-genai with ``search.past_present_share_buffer: true`` allocates each layer's past key/value
once, ``[B, Hkv, max_length, D]``, and binds the same buffer as the present output; GQA writes the step's
keys and values into it in place. That fixed binding is what CUDA graph capture needs.

GQA keeps each row's tokens at the front of its buffer: ``seqlens_k[b]`` (the row's valid tokens so far,
minus one) says where the step's tokens go, and a prompt is read as right-padded. onnxruntime-genai feeds
rows left-padded, as HF does, so the layer moves each row's tokens of this step to the row's front (one
Gather on the token axis; the rotary tables are moved once in the preamble) and moves the result back
after ``o_proj``. The padding then sits where GQA ignores it (beyond ``seqlens_k``, overwritten by the
next steps), and every real query sees exactly its row's real keys, as HF's mask gives, with no
``attention_bias`` (which would keep CUDA off its fused kernels). A decode step (S = 1) moves nothing.
RoPE and the q/k norms are applied before the op (``do_rotary`` 0), as in the concat graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...ops import contract
from .attention import gated_output, project
from .context import GraphContext, RowAlignment, TokenGrid

CONCAT, SHARED = "concat", "shared"
KV_CACHES = (CONCAT, SHARED)
INT32 = ir.DataType.INT32


def align_rows(ctx: GraphContext, grid: TokenGrid, attention_mask: ir.Value, step_mask: ir.Value, batch: ir.Value,
               seq_shape: ir.Value) -> RowAlignment:
    """Row b's padding of this step (the zeros among its step columns) is ``pad_b``; its token s goes to slot
    (s - pad_b) mod S, i.e. slot s reads token (s + pad_b) mod S, and back again. The indices are device tensors
    (see decoder.token_grid); ``batch`` and ``seq_shape`` are the host-side shape values [1].

    GQA's total_sequence_length is the mask's width, except for a step of several rows and several tokens: that
    is a first prompt (onnxruntime-genai refuses a continued prompt at batch > 1), and under CUDA graph capture
    its mask is max_length wide, which GQA would read as past context (it refuses that at batch > 1)."""
    seq, slots = grid.seq, grid.slots
    first_column = ctx.op("Slice", grid.ones, ctx.const([0]), ctx.const([1]), ctx.const([1]))
    row_start = ctx.op("Mul", ctx.op("Sub", ctx.op("CumSum", first_column, ctx.const(0)), ctx.const(1)), seq)
    pad = ctx.op("Sub", seq, ctx.op("ReduceSum", step_mask, ctx.const([1]), keepdims=1))  # [B, 1]

    def flat(shift: ir.Value) -> ir.Value:  # [B, S] slot -> token within the row, as indices on [N]
        within = ctx.op("Mod", ctx.op("Add", slots, shift), seq)
        return ctx.op("Reshape", ctx.op("Add", within, row_start), ctx.const([-1]))

    seqlens = ctx.op("Sub", ctx.op("ReduceSum", attention_mask, ctx.const([1]), keepdims=0), ctx.const(1))
    width = ctx.op("Shape", attention_mask, start=1, end=2)
    first_prompt = ctx.op("And", ctx.op("Greater", batch, ctx.const([1])), ctx.op("Greater", seq_shape, ctx.const([1])))
    total = ctx.op("Squeeze", ctx.op("Where", first_prompt, seq_shape, width))
    return RowAlignment(to_front=flat(pad), back=flat(ctx.op("Sub", seq, pad)),
                        seqlens_k=ctx.op("Cast", seqlens, to=INT32),
                        total_sequence_length=ctx.op("Cast", total, to=INT32))


def group_query_attention(ctx: GraphContext, layer: int, x: ir.Value, past_key: ir.Value, past_value: ir.Value,
                          present_key: ir.Value, present_value: ir.Value) -> ir.Value:
    cfg, sh = ctx.config, ctx.shared
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, k, v, gate = project(ctx, layer, ctx.op("Gather", x, sh.rows.to_front, axis=0))

    def rows(t: ir.Value, heads: int) -> ir.Value:  # [N, h, D] -> [B, S, h*D]
        return ctx.op("Reshape", t, ctx.op("Concat", sh.batch, sh.seq, ctx.const([heads * d]), axis=0))

    out = ir.Value()
    # Inputs 7-10 (cos/sin caches, position_ids, attention_bias) stay empty: rotary is applied above and the
    # rows are front-aligned.
    ctx.add_node(ir.node(
        "GroupQueryAttention",
        [rows(q, hq), rows(k, hkv), rows(v, hkv), past_key, past_value, sh.rows.seqlens_k,
         sh.rows.total_sequence_length],
        {"num_heads": hq, "kv_num_heads": hkv, "scale": float(np.float32(d ** -0.5)), "do_rotary": 0},
        domain=contract.MS_DOMAIN, outputs=[out, present_key, present_value],
        name=f"/model/layers.{layer}/attn/GroupQueryAttention"))
    out = gated_output(ctx, layer, ctx.op("Reshape", out, ctx.const([-1, hq, d])), gate)
    return ctx.op("Gather", out, sh.rows.back, axis=0)
