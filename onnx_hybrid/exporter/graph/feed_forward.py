"""Feed-forward blocks (docs/model.md#feed-forward): dense SwiGLU MLP and the routed MoE with a gated shared expert."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import onnx_ir as ir

from ...ops import contract
from ..weights import Segment
from .context import GraphContext
from .quantized import QMOE_K_TILE, QuantOptions, experts_block_wise, qmoe, quantizes_experts

log = logging.getLogger("onnx_hybrid.exporter")


def _swiglu(ctx: GraphContext, x: ir.Value, prefix: str, width: int) -> ir.Value:
    """down(SiLU(gate x) * up x) with gate and up fused into one [2F, H] product."""
    hidden, w = ctx.config.hidden_size, ctx.weights
    for part in ("gate_proj", "up_proj"):
        w.require(f"{prefix}{part}.weight", [width, hidden])
    gate_up = ctx.projection(f"{prefix}gate_up_proj.weight",
                             [Segment(f"{prefix}{p}.weight", 0, width) for p in ("gate_proj", "up_proj")],
                             [2 * width, hidden])
    down = ctx.projection_tensor(f"{prefix}down_proj.weight", f"{prefix}down_proj.weight", [hidden, width])
    return ctx.linear(ctx.swiglu_linear(x, gate_up, width), down)


def dense_mlp(ctx: GraphContext, layer: int, x: ir.Value) -> ir.Value:
    return _swiglu(ctx, x, f"{ctx.layer(layer)}mlp.", ctx.config.intermediate_size)


def padded_expert_size(size: int, block_size: int) -> int:
    """The expert size of quantized experts: whole QMoE K tiles (CUDA) and whole weight blocks (the down
    projection's block-wise form, as in the released models)."""
    tile = math.lcm(QMOE_K_TILE, block_size)
    return -(-size // tile) * tile


def _expert_weights(ctx: GraphContext, prefix: str, quant: QuantOptions | None = None) -> tuple:
    """[E, 2F, H] gate/up with rows interleaved (g0 u0 g1 u1 ..., what ORT's CPU MoE takes) and [E, H, F]
    down, from fused or per-expert checkpoint tensors (docs/model.md#moe-routing); block-quantized per ``quant``
    when given, with F zero-padded (padded_expert_size; exact: a zero gate/up row gives a zero activation, a
    zero down column adds nothing), or one block per expert row (experts_block_wise)."""
    moe, hidden, w = ctx.config.moe, ctx.config.hidden_size, ctx.weights
    spec = quant.spec if quant else None
    e, f = moe.num_experts, moe.expert_size
    padded = padded_expert_size(f, spec.block_size) if spec else f
    zero_pair = [Segment.zeros(padded - f)] * 2 if padded > f else []
    fused_gu, fused_down = f"{prefix}experts.gate_up_proj", f"{prefix}experts.down_proj"
    if fused_gu in w.checkpoint:
        w.require(fused_gu, [e, 2 * f, hidden])
        w.require(fused_down, [e, hidden, f])
        gu_segments = [seg for i in range(e)
                       for seg in [Segment(fused_gu, start, start + f, (i,)) for start in (0, f)] + zero_pair]
        down_segments = [Segment(fused_down, 0, e)]
    else:
        gu_segments, down_segments = [], []
        for i in range(e):
            for part in ("gate_proj", "up_proj"):
                w.require(f"{prefix}experts.{i}.{part}.weight", [f, hidden])
                gu_segments.append(Segment(f"{prefix}experts.{i}.{part}.weight", 0, f))
            gu_segments += zero_pair
            w.require(f"{prefix}experts.{i}.down_proj.weight", [hidden, f])
            down_segments.append(Segment(f"{prefix}experts.{i}.down_proj.weight", 0, hidden))
    if spec is None:
        gate_up = w.rows(f"{prefix}experts.gate_up_proj", gu_segments, [e, 2 * f, hidden], ctx.np_act,
                         interleave_pairs=True)
        return gate_up, w.rows(f"{prefix}experts.down_proj", down_segments, [e, hidden, f], ctx.np_act)
    block_wise = experts_block_wise(hidden, quant)
    if hidden % spec.block_size and prefix == f"{ctx.layer(ctx.config.moe_layers.index(True))}mlp.":  # once a graph
        log.warning("experts: hidden size %d is not a multiple of the weight block %d; QMoE gets one scale per "
                    "expert row instead", hidden, spec.block_size)
    form = "experts" if block_wise else "columns"
    gu_spec, down_spec = ((spec, spec) if block_wise
                          else (replace(spec, block_size=hidden), replace(spec, block_size=padded)))
    gate_up = w.quantized(f"{prefix}experts.gate_up_proj", gu_segments, [e, 2 * padded, hidden], ctx.np_act,
                          gu_spec, form, interleave_pairs=True)
    return gate_up, w.quantized(f"{prefix}experts.down_proj", down_segments, [e, hidden, padded], ctx.np_act,
                                down_spec, form, pad_columns=padded > f)


def sparse_moe(ctx: GraphContext, layer: int, x: ir.Value) -> ir.Value:
    """Routed experts plus a sigmoid-gated shared expert.

    The routed part is one ``com.microsoft::MoE`` (CPU and CUDA kernels in ORT): from the router logits it
    takes the softmax over all experts in fp32, the top-k, and renormalises them when
    ``normalize_routing_weights`` is set, which is HF's routing (always for qwen3_5_moe, per
    ``norm_topk_prob`` for qwen3_next); then SiLU(gate) * up and down per selected expert, computed only
    for the tokens routed to it.
    """
    moe, hidden = ctx.config.moe, ctx.config.hidden_size
    prefix = f"{ctx.layer(layer)}mlp."
    router = ctx.weights.tensor(f"{prefix}gate.weight", f"{prefix}gate.weight", [moe.num_experts, hidden],
                                ctx.np_act)
    logits = ctx.linear(x, router)
    attributes = {"k": moe.top_k, "activation_type": "swiglu", "swiglu_fusion": 1, "activation_alpha": 1.0,
                  "activation_beta": 0.0, "normalize_routing_weights": int(moe.renormalize)}
    if quantizes_experts(ctx.quant, hidden):
        gate_up_q, down_q = _expert_weights(ctx, prefix, ctx.quant)
        routed = qmoe(ctx, x, logits, gate_up_q, down_q, attributes, ctx.quant.accuracy_level)
    else:
        gate_up_w, down_w = _expert_weights(ctx, prefix)
        routed = ctx.tape.op("MoE", [x, logits, gate_up_w, None, down_w], attributes, domain=contract.MS_DOMAIN)
    shared = _swiglu(ctx, x, f"{prefix}shared_expert.", moe.shared_expert_size)
    shared_gate = ctx.weights.tensor(f"{prefix}shared_expert_gate.weight", f"{prefix}shared_expert_gate.weight",
                                     [1, hidden], ctx.np_act)
    shared = ctx.op("Mul", shared, ctx.op("Sigmoid", ctx.linear(x, shared_gate)))
    return ctx.op("Add", routed, shared)

