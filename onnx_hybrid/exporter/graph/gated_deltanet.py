"""One Gated DeltaNet layer (docs/model.md#gated-deltanet-layer): projections, conv, GatedDeltaNet, gated norm.

The four input projections (q|k|v, z, b, a) are one fused product; with quantized weights the b and a gate
rows are a product of their own in the activation type unless the export quantizes them too (``gates``,
graph/quantized.py says why). Qwen3-Next's packed, per-key-head grouped ``in_proj_qkvz`` / ``in_proj_ba`` are
de-interleaved into the same row order while the weight is written
(docs/model.md#qwen3-next-packed-projections), so both layouts share this graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...ops import contract
from ..weights import Segment
from .context import FLOAT, GraphContext


def in_projection_segments(ctx: GraphContext, prefix: str) -> tuple[list[Segment], list[Segment]]:
    """Rows of the fused [q | k | v | z] and [b | a] projection weights, from either checkpoint layout."""
    cfg, w = ctx.config, ctx.weights
    hidden, kd, vd, hv = cfg.hidden_size, cfg.key_dim, cfg.value_dim, cfg.gdn_value_heads
    if f"{prefix}in_proj_qkvz.weight" not in w.checkpoint:
        parts = [("in_proj_qkv", 2 * kd + vd), ("in_proj_z", vd), ("in_proj_b", hv), ("in_proj_a", hv)]
        for part, rows in parts:
            w.require(f"{prefix}{part}.weight", [rows, hidden])
        segments = [Segment(f"{prefix}{part}.weight", 0, rows) for part, rows in parts]
        return segments[:2], segments[2:]

    hk, dk, dv = cfg.gdn_key_heads, cfg.gdn_key_dim, cfg.gdn_value_dim
    r = hv // hk
    qkvz, ba = f"{prefix}in_proj_qkvz.weight", f"{prefix}in_proj_ba.weight"
    w.require(qkvz, [2 * kd + 2 * vd, hidden])
    w.require(ba, [2 * hv, hidden])
    group = 2 * dk + 2 * r * dv  # rows per key head: [q (Dk) | k (Dk) | v (r*Dv) | z (r*Dv)]
    pieces = [(0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv)]
    main = [Segment(qkvz, g * group + start, g * group + start + size) for start, size in pieces for g in range(hk)]
    gates = [Segment(ba, g * 2 * r + start, g * 2 * r + start + r) for start in (0, r) for g in range(hk)]
    return main, gates


def gate_inputs(ctx: GraphContext, a: ir.Value, b: ir.Value) -> dict[str, ir.Value]:
    """The decay and beta inputs. Our op reads them in the activation type (two fewer launches a layer, the same
    bits: it widens them to fp32 first); ORT's com.microsoft op takes them in fp32."""
    if ctx.op_domain == contract.DOMAIN or ctx.np_act == np.float32:
        return {"decay": a, "beta": b}
    return {"decay": ctx.op("Cast", a, to=FLOAT), "beta": ctx.op("Cast", b, to=FLOAT)}


def gated_deltanet(ctx: GraphContext, layer: int, x: ir.Value, past_conv: ir.Value, past_recurrent: ir.Value,
                   present_conv: ir.Value, present_recurrent: ir.Value, conv_update: ir.Value | None,
                   capsule: ir.Value | None) -> ir.Value:
    cfg, sh = ctx.config, ctx.shared
    prefix = f"{ctx.layer(layer)}linear_attn."
    hv, dv = cfg.gdn_value_heads, cfg.gdn_value_dim
    vd, channels = cfg.value_dim, cfg.conv_channels

    # Padded positions arrive as zeros, as HF makes them (docs/model.md#gated-deltanet-layer, step 1)
    main, gates = in_projection_segments(ctx, prefix)
    separate_gates = ctx.quant is not None and not ctx.quant.gates  # b/a rows kept in the activation type
    fused, sizes = (main, [channels, vd]) if separate_gates else (main + gates, [channels, vd, hv, hv])
    in_proj = ctx.projection(f"{prefix}in_proj.weight", fused, [sum(sizes), cfg.hidden_size])
    parts = ctx.linear_parts(x, in_proj, sizes)
    if separate_gates:
        gate_proj = ctx.weights.rows(f"{prefix}in_proj_ba.weight", gates, [2 * hv, cfg.hidden_size], ctx.np_act)
        parts += ctx.linear_parts(x, gate_proj, [hv, hv])
    mixed, z, b, a = parts

    conv_weight = ctx.weights.tensor(f"{prefix}conv1d.weight", f"{prefix}conv1d.weight",
                                     [channels, 1, cfg.conv_kernel], ctx.np_act)
    conv_out = ir.Value()
    capture = {"capture_count": sh.capture_count} if ctx.capacity else {}
    ctx.add_node(contract.make_ir_node(
        contract.VARLEN_CAUSAL_CONV,
        {"input": mixed, "weight": conv_weight, "cumulative_sequence_length": sh.cu_seqlens,
         "initial_state": past_conv, **capture},
        [conv_out, present_conv, conv_update],
        {"activation": "silu", "state_update_capacity": ctx.capacity},
        domain=ctx.op_domain, name=f"/model/layers.{layer}/linear_attn/conv"))

    a_log = ctx.weights.tensor(f"{prefix}A_log", f"{prefix}A_log", [hv], np.float32)
    dt_bias = ctx.weights.tensor(f"{prefix}dt_bias", f"{prefix}dt_bias", [hv], np.float32)
    core = ir.Value()
    gdn_capture = ({"capture_count": sh.capture_count, "state_update_active": sh.state_update_active}
                   if ctx.capacity else {})
    # Packed requests of different lengths are ragged rows; the dense graph's rows are uniform.
    ragged = {"cu_seqlens": sh.cu_seqlens} if sh.packed else {}
    # The conv output [N, q | k | v] goes in whole: the op's packed-QKV form reads the three from one row.
    ctx.add_node(contract.make_ir_node(
        contract.GATED_DELTA_NET,
        {"query": conv_out,
         **gate_inputs(ctx, a, b),
         "initial_state": past_recurrent, "a_log": a_log, "dt_bias": dt_bias, **ragged, **gdn_capture},
        [core, present_recurrent, capsule],
        {"update_rule": "gated_delta", "scale": 0.0, "gate_activation": "qwen", "beta_activation": "sigmoid",
         "qk_l2_norm": 1, "state_update_capacity": ctx.capacity},
        domain=ctx.op_domain, name=f"/model/layers.{layer}/linear_attn/GatedDeltaNet"))

    # Gated RMSNorm per value head (docs/model.md#gated-rmsnorm): plain w, SiLU(z) gate, statistics in fp32.
    norm_w = ctx.norm_weight(f"{prefix}norm.weight", f"{prefix}norm.weight", dv, zero_centred=False)
    if ctx.gated_norm_op:  # one launch over the packed [N, Hv*Dv] rows (its scale Dv long) instead of three
        gated = ctx.tape.op("GatedRMSNorm", [ctx.op("Reshape", core, ctx.const([0, vd])), norm_w, z],
                            {"epsilon": cfg.rms_norm_eps}, domain=contract.MS_DOMAIN,
                            name=f"/model/layers.{layer}/linear_attn/norm")
    else:
        gate = ctx.silu(ctx.op("Reshape", z, ctx.const([0, hv, dv])))
        gated = ctx.op("Reshape", ctx.op("Mul", ctx.rms_norm(core, norm_w), gate), ctx.const([0, vd]))
    out_proj = ctx.projection_tensor(f"{prefix}out_proj.weight", f"{prefix}out_proj.weight", [cfg.hidden_size, vd])
    return ctx.linear(gated, out_proj)
