"""Feed-forward blocks (spec/model.md §9): dense SwiGLU MLP and the routed MoE with a gated shared expert."""

from __future__ import annotations

import onnx_ir as ir

from ..weights import Segment
from .context import FLOAT, GraphContext


def _swiglu(ctx: GraphContext, x: ir.Value, prefix: str, width: int) -> ir.Value:
    """down(SiLU(gate x) * up x) with gate and up fused into one [2F, H] Gemm."""
    hidden, w = ctx.config.hidden_size, ctx.weights
    for part in ("gate_proj", "up_proj"):
        w.require(f"{prefix}{part}.weight", [width, hidden])
    gate_up = w.rows(f"{prefix}gate_up_proj.weight",
                     [Segment(f"{prefix}{p}.weight", 0, width) for p in ("gate_proj", "up_proj")],
                     [2 * width, hidden], ctx.np_act)
    gate, up = ctx.ops("Split", ctx.linear(x, gate_up), ctx.const([width, width]), num_outputs=2, axis=-1)
    down = w.tensor(f"{prefix}down_proj.weight", f"{prefix}down_proj.weight", [hidden, width], ctx.np_act)
    return ctx.linear(ctx.op("Mul", ctx.silu(gate), up), down)


def dense_mlp(ctx: GraphContext, layer: int, x: ir.Value) -> ir.Value:
    return _swiglu(ctx, x, f"model.layers.{layer}.mlp.", ctx.config.intermediate_size)


def _expert_weights(ctx: GraphContext, prefix: str) -> tuple[ir.Value, ir.Value]:
    """[E, 2F, H] gate|up and [E, H, F] down, from fused or per-expert checkpoint tensors (model.md §3.4)."""
    moe, hidden, w = ctx.config.moe, ctx.config.hidden_size, ctx.weights
    e, f = moe.num_experts, moe.expert_size
    fused_gu, fused_down = f"{prefix}experts.gate_up_proj", f"{prefix}experts.down_proj"
    if fused_gu in w.checkpoint:
        w.require(fused_gu, [e, 2 * f, hidden])
        w.require(fused_down, [e, hidden, f])
        gu_segments = [Segment(fused_gu, 0, e)]
        down_segments = [Segment(fused_down, 0, e)]
    else:
        gu_segments, down_segments = [], []
        for i in range(e):
            for part in ("gate_proj", "up_proj"):
                w.require(f"{prefix}experts.{i}.{part}.weight", [f, hidden])
                gu_segments.append(Segment(f"{prefix}experts.{i}.{part}.weight", 0, f))
            w.require(f"{prefix}experts.{i}.down_proj.weight", [hidden, f])
            down_segments.append(Segment(f"{prefix}experts.{i}.down_proj.weight", 0, hidden))
    gate_up = w.rows(f"{prefix}experts.gate_up_proj", gu_segments, [e, 2 * f, hidden], ctx.np_act)
    down = w.rows(f"{prefix}experts.down_proj", down_segments, [e, hidden, f], ctx.np_act)
    return gate_up, down


def sparse_moe(ctx: GraphContext, layer: int, x: ir.Value) -> ir.Value:
    """Routed experts plus a sigmoid-gated shared expert.

    Routing follows HF: softmax over all experts in fp32, top-k, optional renormalisation, weights cast
    back to the activation type. The selected experts' weights are gathered per token ([N, k, 2F, H]),
    which is exact and cheap for decode; prefill memory grows with N * k expert matrices.
    """
    moe, hidden = ctx.config.moe, ctx.config.hidden_size
    prefix = f"model.layers.{layer}.mlp."
    f = moe.expert_size
    router = ctx.weights.tensor(f"{prefix}gate.weight", f"{prefix}gate.weight", [moe.num_experts, hidden],
                                ctx.np_act)
    probs = ctx.op("Softmax", ctx.op("Cast", ctx.linear(x, router), to=FLOAT), axis=-1)
    top_w, top_i = ctx.ops("TopK", probs, ctx.const([moe.top_k]), num_outputs=2, axis=-1)
    if moe.renormalize:
        top_w = ctx.op("Div", top_w, ctx.op("ReduceSum", top_w, ctx.const([-1]), keepdims=1))
    top_w = ctx.op("Cast", top_w, to=ctx.act)

    gate_up_w, down_w = _expert_weights(ctx, prefix)
    column = ctx.op("Reshape", x, ctx.const([-1, 1, hidden, 1]))  # [N, 1, H, 1]
    gate_up = ctx.op("MatMul", ctx.op("Gather", gate_up_w, top_i, axis=0), column)  # [N, k, 2F, 1]
    gate, up = ctx.ops("Split", gate_up, ctx.const([f, f]), num_outputs=2, axis=2)
    act = ctx.op("Mul", ctx.silu(gate), up)  # [N, k, F, 1]
    routed = ctx.op("MatMul", ctx.op("Gather", down_w, top_i, axis=0), act)  # [N, k, H, 1]
    routed = ctx.op("Mul", routed, ctx.op("Unsqueeze", top_w, ctx.const([2, 3])))
    routed = ctx.op("Reshape", ctx.op("ReduceSum", routed, ctx.const([1]), keepdims=0), ctx.const([-1, hidden]))

    shared = _swiglu(ctx, x, f"{prefix}shared_expert.", moe.shared_expert_size)
    shared_gate = ctx.weights.tensor(f"{prefix}shared_expert_gate.weight", f"{prefix}shared_expert_gate.weight",
                                     [1, hidden], ctx.np_act)
    shared = ctx.op("Mul", shared, ctx.op("Sigmoid", ctx.linear(x, shared_gate)))
    return ctx.op("Add", routed, shared)

