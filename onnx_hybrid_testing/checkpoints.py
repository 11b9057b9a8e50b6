"""Tiny random hybrid checkpoints in every supported layout, written by transformers' ``save_pretrained``.

The geometry is chosen to be discriminating (docs/model.md#test-checkpoints): Hk != Hv (2/4), Dk != Dv (16/32),
Hq != Hkv, partial rotary (8 of 32 dims), a non-trivial ``mrope_section``, and every norm weight,
``dt_bias``, ``A_log``, conv weight and linear randomised, so a wrong norm convention, a dropped
``dt_bias`` or a head-sharing mix-up changes the greedy tokens. Needs torch and transformers.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np

LAYOUTS = {
    # layout name: the transformers class that writes it
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_multimodal": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe_multimodal": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_next": "Qwen3NextForCausalLM",
}

TEXT = dict(
    vocab_size=160, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=32, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=512,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
)
# (Hv, Hk, Dk, Dv) of the GatedDeltaNet layers, in the argument order of contract.gdn_capsule_width.
GDN_HEADS = (TEXT["linear_num_value_heads"], TEXT["linear_num_key_heads"], TEXT["linear_key_head_dim"],
             TEXT["linear_value_head_dim"])
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
MROPE = {**ROPE, "mrope_section": [2, 1, 1], "mrope_interleaved": True}
MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
              spatial_merge_size=2, num_position_embeddings=16)


def _config(layout: str, tied: bool, layers: int | None):
    import transformers

    text = dict(TEXT, tie_word_embeddings=tied)
    if layers is not None:
        text.update(num_hidden_layers=layers,
                    layer_types=["full_attention" if (i + 1) % 3 == 0 else "linear_attention" for i in range(layers)])
    if layout == "qwen3_next":
        # Layer 3 dense (mlp_only_layers), the others MoE; no renormalisation to cover that branch.
        return transformers.Qwen3NextConfig(**text, **MOE, rope_parameters=ROPE, intermediate_size=48,
                                            norm_topk_prob=False, mlp_only_layers=[3], decoder_sparse_step=1)
    moe = "moe" in layout
    text_cls = transformers.Qwen3_5MoeTextConfig if moe else transformers.Qwen3_5TextConfig
    text_cfg = text_cls(**text, **(MOE if moe else {"intermediate_size": 96}), rope_parameters=MROPE)
    if not layout.endswith("multimodal"):
        return text_cfg
    wrapper = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
    return wrapper(text_config=text_cfg.to_dict(), vision_config=dict(VISION, out_hidden_size=TEXT["hidden_size"]),
                   tie_word_embeddings=tied)


def _randomise(model, seed: int) -> None:
    """Replace HF's init (zero norms, unit dt_bias, ...) by values that expose convention errors."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1.0, 16.0, generator=gen)))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("dt_bias") or "norm" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:  # linears, conv taps, experts, router: keep activations O(1)
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(fan_in)))


def make_tiny_checkpoint(out_dir, layout: str = "qwen3_5_text", *, tied: bool = True, seed: int = 0,
                         shard_size: str | None = None, fused_experts: bool = False,
                         layers: int | None = None, mtp: bool = False) -> Path:
    """Write a random checkpoint; returns ``out_dir``.

    ``shard_size`` (e.g. ``"100KB"``) writes sharded safetensors with an index. ``fused_experts`` keeps
    HF's runtime [E, 2F, H] expert tensors (as official bf16 MoE releases store them) instead of the
    per-expert tensors ``save_pretrained`` writes by default. ``mtp`` adds a random one-layer MTP head
    (``mtp.*``, which transformers does not model; see ``testing.mtp``).
    """
    import torch
    import transformers

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    torch.manual_seed(seed)
    config = _config(layout, tied, layers)
    model = getattr(transformers, LAYOUTS[layout])(config).eval()
    _randomise(model, seed)
    if tied:
        model.tie_weights()
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(out_dir, save_original_format=not fused_experts, **kwargs)
    if mtp:
        from .mtp import add_mtp_head, random_mtp_tensors
        add_mtp_head(out_dir, random_mtp_tensors(out_dir, seed))
    return Path(out_dir)


def load_reference(model_dir):
    """The HF text model in fp32 (what ``AutoModelForCausalLM`` gives for every layout)."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


# Checkpoint tensors a quantized export quantizes: projections (attention, GDN in/out, MLPs, shared and routed
# experts, the MTP fc); the router and the shared expert's gate keep their type, and the GDN's b/a gate
# projections unless asked (QUANTIZED_GATES).
QUANTIZED_PROJECTION = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|in_proj_\w+|out_proj|gate_proj|up_proj|down_proj)"
                                  r"\.weight$|experts\.(gate_up_proj|down_proj)$|^mtp\.fc\.weight$")
QUANTIZED_GATES = re.compile(r"\.in_proj_(b|a|ba)\.weight$")


def with_weights_rounded(src, dst, options: dict, execution_provider: str = "cpu",
                         accuracy_level: int | None = None, dtype: str = "fp32") -> Path:
    """A copy of the tiny checkpoint ``src`` in which every weight an export with the quantization ``options``
    (export()'s weights, weight_block, weight_asymmetric, quantize_lm_head, quantize_embedding, quantize_gates)
    in activation ``dtype`` for ``execution_provider`` at ``accuracy_level`` quantizes holds its dequantized value:
    the oracle for that export's arithmetic. The scales are stored in ``dtype`` and the codes follow the stored
    scale, as the export's do (fp32 scales would round some elements to the neighbouring code)."""
    from safetensors.numpy import load_file, save_file

    from onnx_hybrid.exporter.export import numpy_dtype
    from onnx_hybrid.exporter.graph.feed_forward import padded_expert_size
    from onnx_hybrid.exporter.graph.quantized import experts_block_wise, quant_options, quantizes_experts
    from onnx_hybrid.exporter.quantize import QuantSpec, dequantize, quantize

    shutil.copytree(src, dst)
    quant = quant_options(options["weights"], dtype, block_size=options.get("weight_block", 32),
                          asymmetric=options.get("weight_asymmetric", False), accuracy_level=accuracy_level,
                          execution_provider=execution_provider)
    spec = quant.spec
    head = [name for name, key in (("model.embed_tokens.weight", "quantize_embedding"),
                                   ("lm_head.weight", "quantize_lm_head")) if options.get(key)]
    for file in Path(dst).glob("*.safetensors"):
        tensors = load_file(file)
        for name, w in tensors.items():
            short = name.replace("model.language_model.", "model.")
            if not (QUANTIZED_PROJECTION.search(short) or short in head) or (
                    QUANTIZED_GATES.search(short) and not options.get("quantize_gates")) or (
                    "experts." in short and not quantizes_experts(quant, TEXT["hidden_size"])):
                continue
            k = w.shape[-1]
            block = spec.block_size
            if "experts." in short and not experts_block_wise(TEXT["hidden_size"], quant):
                # QMoE without block_size: one block per expert row, of the expert size padded to whole blocks
                block = padded_expert_size(k, block) if "down_proj" in short else k
            row_spec = QuantSpec(spec.bits, block, spec.symmetric)
            rows = w.reshape(-1, k).astype(np.float32)
            quantized = quantize(rows, row_spec, scale_dtype=numpy_dtype(dtype))
            # float64 (q - z) * scale rounded once to fp32, as the kernels round it to T (exact for fp16 and bf16)
            tensors[name] = dequantize(quantized, row_spec, k).astype(np.float32).reshape(w.shape)
        save_file(tensors, file, metadata={"format": "pt"})
    return Path(dst)
