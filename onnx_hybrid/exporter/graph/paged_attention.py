"""Full attention of the paged graph: PagedAttention over the engine's block pool (docs/genai-config.md#paged-export,
docs/op-contract.md#pagedattention).

The tokens of all requests lie on one axis ``[num_tokens, ...]``; ``cumulative_sequence_lengths`` splits
them into requests, ``past_sequence_lengths`` gives each request's cached length and ``block_table`` maps
its positions to blocks of the pool ``[num_blocks, block_size, Hkv, D]``. The op writes the new keys
and values into the pool in place: the ``present`` outputs alias the ``past`` inputs.

Two kernels implement it (``PagedLayout.kernel``):

* ``onnx_hybrid``: our library's CPU kernel (contract.PAGED_ATTENTION), in any activation type; the pool
  keeps the activation type, fp32 included.
* ``com.microsoft``: ONNX Runtime's contrib op, which exists only on CUDA and only for fp16/bf16, so an
  fp32 model keeps its pool in fp16 and casts q/k/v around the op (the rest of the model stays fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from ...ops import contract
from .attention import gated_output, project
from .context import GraphContext

KERNELS = (contract.DOMAIN, contract.MS_DOMAIN)
MS_CACHE_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


@dataclass(frozen=True)
class PagedLayout:
    """Static geometry of the block pool (``engine.dynamic_batching.block_size``) and the attention kernel's
    domain (one of KERNELS)."""

    block_size: int
    kernel: str = contract.DOMAIN

    def cache_dtype(self, act: ir.DataType) -> ir.DataType:
        if self.kernel == contract.DOMAIN or act in MS_CACHE_TYPES:
            return act
        return ir.DataType.FLOAT16


def paged_attention(ctx: GraphContext, layer: int, x: ir.Value, past_key: ir.Value, past_value: ir.Value,
                    present_key: ir.Value, present_value: ir.Value, *, layout: PagedLayout) -> ir.Value:
    cfg, packed = ctx.config, ctx.shared.packed
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, k, v, gate = project(ctx, layer, x)
    pool = layout.cache_dtype(ctx.act)

    def flat(t: ir.Value, heads: int) -> ir.Value:  # [N, h, D] -> [N, h*D] in the pool's type
        t = ctx.op("Reshape", t, ctx.const([0, heads * d]))
        return t if ctx.act == pool else ctx.op("Cast", t, to=pool)

    out = ir.Value()
    name = f"/model/layers.{layer}/attn/PagedAttention"
    attributes = {"num_heads": hq, "kv_num_heads": hkv, "scale": d ** -0.5}
    if layout.kernel == contract.DOMAIN:
        ctx.add_node(contract.make_ir_node(
            contract.PAGED_ATTENTION,
            {"query": flat(q, hq), "key": flat(k, hkv), "value": flat(v, hkv), "key_cache": past_key,
             "value_cache": past_value, "cumulative_sequence_lengths": packed.cumulative_sequence_lengths,
             "past_sequence_lengths": packed.past_sequence_lengths, "block_table": packed.block_table},
            [out, present_key, present_value], attributes, name=name))
    else:
        # Inputs 8-15 (rotary tables, slot mapping, sinks, fused q/k norms, KV scales) stay empty: rotary and
        # norms are applied above, and cache writes follow block_table.
        ctx.add_node(ir.node(
            "PagedAttention",
            [flat(q, hq), flat(k, hkv), flat(v, hkv), past_key, past_value, packed.cumulative_sequence_lengths,
             packed.past_sequence_lengths, packed.block_table, *[None] * 8, packed.attention_metadata],
            attributes, domain=contract.MS_DOMAIN, outputs=[out, present_key, present_value], name=name))
    if ctx.act != pool:
        out = ctx.op("Cast", out, to=ctx.act)
    return gated_output(ctx, layer, ctx.op("Reshape", out, ctx.const([0, hq, d])), gate)
