"""One gated full-attention layer (docs/model.md#gated-full-attention) in plain ONNX ops.

This is the default ``--kv-cache concat`` layout: one KV concat per step, HF's left-padded masking
reproduced exactly (also for the padded queries, which must stay finite because the next GDN layer
multiplies them by zero). ``--kv-cache shared`` runs the same projections through GroupQueryAttention
over buffers shared in place (group_query_attention.py).
GQA is computed without repeating KV: queries are grouped [B, Hkv, G, S, D] against [B, Hkv, 1, L, D].
"""

from __future__ import annotations

import onnx_ir as ir

from ...ops import contract
from ..weights import Segment
from .context import GraphContext


def rotate(ctx: GraphContext, x: ir.Value, heads: int) -> ir.Value:
    """Rotate-half RoPE (NeoX layout) on the first R dims of every head of x [N, heads, D]
    (docs/model.md#gated-full-attention, step 3), as one com.microsoft::RotaryEmbedding over the tokens taken as one row
    [1, N, heads*D] at their own positions."""
    cfg, sh = ctx.config, ctx.shared
    d = cfg.head_dim
    row = ctx.op("Reshape", x, ctx.const([1, -1, heads * d]))
    out = ir.Value()
    ctx.add_node(ir.node("RotaryEmbedding", [row, sh.positions, *sh.rotary_caches],
                         {"interleaved": 0, "num_heads": heads, "rotary_embedding_dim": cfg.rotary_dim},
                         domain=contract.MS_DOMAIN, outputs=[out]))
    return ctx.op("Reshape", out, ctx.const([-1, heads, d]))


def project(ctx: GraphContext, layer: int, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """q [N, Hq, D] and k [N, Hkv, D] (normed, rotated), v [N, Hkv, D] and the output gate [N, Hq, D]."""
    cfg, w = ctx.config, ctx.weights
    prefix = f"{ctx.layer(layer)}self_attn."
    hq, hkv, d, hidden = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size

    names = [("q_proj", 2 * hq * d), ("k_proj", hkv * d), ("v_proj", hkv * d)]
    for part, rows in names:
        w.require(f"{prefix}{part}.weight", [rows, hidden])
    # q_proj rows are [query | gate] interleaved per head (docs/model.md#gated-full-attention, step 1); packed here
    # as every head's query rows, then every head's gate rows, so that q, gate, k and v are column ranges of one
    # product: one Linear with four outputs, or one Split.
    q_rows = f"{prefix}q_proj.weight"
    segments = ([Segment(q_rows, 2 * h * d, 2 * h * d + d) for h in range(hq)]
                + [Segment(q_rows, 2 * h * d + d, 2 * (h + 1) * d) for h in range(hq)]
                + [Segment(f"{prefix}{p}.weight", 0, n) for p, n in names[1:]])
    qkv_w = ctx.projection(f"{prefix}qkv_proj.weight", segments, [2 * hq * d + 2 * hkv * d, hidden])
    q, gate, k, v = ctx.linear_parts(x, qkv_w, [hq * d, hq * d, hkv * d, hkv * d])
    q, gate = (ctx.op("Reshape", t, ctx.const([0, hq, d])) for t in (q, gate))
    k = ctx.op("Reshape", k, ctx.const([0, hkv, d]))
    v = ctx.op("Reshape", v, ctx.const([0, hkv, d]))
    q = rotate(ctx, ctx.rms_norm(q, ctx.norm_weight(f"{prefix}q_norm.weight", f"{prefix}q_norm.weight", d)), hq)
    k = rotate(ctx, ctx.rms_norm(k, ctx.norm_weight(f"{prefix}k_norm.weight", f"{prefix}k_norm.weight", d)), hkv)
    return q, k, v, gate


def gated_output(ctx: GraphContext, layer: int, out: ir.Value, gate: ir.Value) -> ir.Value:
    """sigmoid(gate) * attention output [N, Hq, D], then o_proj: [N, H]."""
    cfg = ctx.config
    hq, d = cfg.num_heads, cfg.head_dim
    out = ctx.op("Mul", out, ctx.op("Sigmoid", gate))
    name = f"{ctx.layer(layer)}self_attn.o_proj.weight"
    o_proj = ctx.projection_tensor(name, name, [cfg.hidden_size, hq * d])
    return ctx.linear(ctx.op("Reshape", out, ctx.const([0, hq * d])), o_proj)


def attention(ctx: GraphContext, layer: int, x: ir.Value, past_key: ir.Value, past_value: ir.Value,
              present_key: ir.Value, present_value: ir.Value) -> ir.Value:
    cfg, sh = ctx.config, ctx.shared
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    groups = hq // hkv
    q, k, v, gate = project(ctx, layer, x)

    def heads_first(t: ir.Value, heads: int) -> ir.Value:  # [N, h, D] -> [B, h, S, D]
        shape = ctx.op("Concat", sh.batch, sh.seq, ctx.const([heads, d]), axis=0)
        return ctx.op("Transpose", ctx.op("Reshape", t, shape), perm=[0, 2, 1, 3])

    q = ctx.op("Mul", q, ctx.act_const(d ** -0.5))
    q = ctx.op("Reshape", heads_first(q, hq), ctx.const([0, hkv, groups, -1, d]))  # [B, Hkv, G, S, D]
    ctx.op("Concat", past_key, heads_first(k, hkv), axis=2, output=present_key)
    ctx.op("Concat", past_value, heads_first(v, hkv), axis=2, output=present_value)

    key_t = ctx.op("Unsqueeze", ctx.op("Transpose", present_key, perm=[0, 1, 3, 2]), ctx.const([2]))
    scores = ctx.op("Add", ctx.op("MatMul", q, key_t), sh.attention_bias)  # [B, Hkv, G, S, L]
    if ctx.act == ir.DataType.FLOAT:
        probs = ctx.op("Softmax", scores, axis=-1)
    else:  # HF's eager path: softmax in fp32
        probs = ctx.op("Cast", ctx.op("Softmax", ctx.op("Cast", scores, to=ir.DataType.FLOAT), axis=-1),
                       to=ctx.act)
    out = ctx.op("MatMul", probs, ctx.op("Unsqueeze", present_value, ctx.const([2])))  # [B, Hkv, G, S, D]
    out = ctx.op("Transpose", ctx.op("Reshape", out, ctx.const([0, hq, -1, d])), perm=[0, 2, 1, 3])
    return gated_output(ctx, layer, ctx.op("Reshape", out, ctx.const([-1, hq, d])), gate)
