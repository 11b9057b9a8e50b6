"""Full-size synthetic checkpoints (random bf16 weights, real geometries) for export and speed benchmarks.

Written with NumPy, ml_dtypes and safetensors only (no torch), shard by shard so that even an
18 GB checkpoint is generated with about one shard in memory. The layout is the multimodal wrapper
(``Qwen3_5ForConditionalGeneration``, ``model.language_model.*``) with a tiny vision config, which is
the only layout onnxruntime-genai's builder accepts, so both exporters read the same files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Geometry:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    gdn_key_heads: int
    gdn_value_heads: int
    intermediate: int
    tied: bool
    vocab: int = 248320
    head_dim: int = 256
    gdn_head_dim: int = 128
    conv_kernel: int = 4
    mrope_section: tuple[int, int, int] = (11, 11, 10)  # sums to head_dim * partial_rotary_factor / 2


QWEN3_5_0_8B = Geometry(hidden=1024, layers=24, heads=8, kv_heads=2, gdn_key_heads=16, gdn_value_heads=16,
                        intermediate=3584, tied=True)
QWEN3_5_9B = Geometry(hidden=4096, layers=32, heads=16, kv_heads=4, gdn_key_heads=16, gdn_value_heads=32,
                      intermediate=12288, tied=False)
# Small enough for CPU tests and smoke runs of the benchmarks, with the same layout and ratios of head counts.
TINY = Geometry(hidden=128, layers=4, heads=2, kv_heads=1, gdn_key_heads=2, gdn_value_heads=4, intermediate=256,
                tied=True, vocab=4096, head_dim=64, gdn_head_dim=32, mrope_section=(3, 3, 2))
GEOMETRIES = {"0.8b": QWEN3_5_0_8B, "9b": QWEN3_5_9B, "tiny": TINY}


def _layer_types(g: Geometry) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(g.layers)]


def config(g: Geometry) -> dict:
    text = {
        "model_type": "qwen3_5_text", "vocab_size": g.vocab, "hidden_size": g.hidden,
        "intermediate_size": g.intermediate, "num_hidden_layers": g.layers, "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim, "hidden_act": "silu",
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "tie_word_embeddings": g.tied,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": list(g.mrope_section), "mrope_interleaved": True},
        "linear_conv_kernel_dim": g.conv_kernel, "linear_key_head_dim": g.gdn_head_dim,
        "linear_value_head_dim": g.gdn_head_dim, "linear_num_key_heads": g.gdn_key_heads,
        "linear_num_value_heads": g.gdn_value_heads, "layer_types": _layer_types(g),
        "bos_token_id": min(248044, g.vocab - 1), "eos_token_id": min(248044, g.vocab - 1), "dtype": "bfloat16",
    }
    vision = {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 64, "intermediate_size": 128,
              "num_heads": 2, "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
              "out_hidden_size": g.hidden, "num_position_embeddings": 64}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": text, "vision_config": vision, "tie_word_embeddings": g.tied,
            "transformers_version": "5.24.0"}


def tensor_shapes(g: Geometry) -> dict[str, tuple[int, ...]]:
    """Every text-decoder tensor of the checkpoint, in file order."""
    p = "model.language_model."
    kd, vd = g.gdn_key_heads * g.gdn_head_dim, g.gdn_value_heads * g.gdn_head_dim
    shapes = {f"{p}embed_tokens.weight": (g.vocab, g.hidden)}
    for i, kind in enumerate(_layer_types(g)):
        lp = f"{p}layers.{i}."
        shapes[f"{lp}input_layernorm.weight"] = (g.hidden,)
        shapes[f"{lp}post_attention_layernorm.weight"] = (g.hidden,)
        if kind == "linear_attention":
            la = f"{lp}linear_attn."
            shapes.update({f"{la}in_proj_qkv.weight": (2 * kd + vd, g.hidden), f"{la}in_proj_z.weight": (vd, g.hidden),
                           f"{la}in_proj_b.weight": (g.gdn_value_heads, g.hidden),
                           f"{la}in_proj_a.weight": (g.gdn_value_heads, g.hidden),
                           f"{la}conv1d.weight": (2 * kd + vd, 1, g.conv_kernel), f"{la}A_log": (g.gdn_value_heads,),
                           f"{la}dt_bias": (g.gdn_value_heads,), f"{la}norm.weight": (g.gdn_head_dim,),
                           f"{la}out_proj.weight": (g.hidden, vd)})
        else:
            sa = f"{lp}self_attn."
            shapes.update({f"{sa}q_proj.weight": (2 * g.heads * g.head_dim, g.hidden),
                           f"{sa}k_proj.weight": (g.kv_heads * g.head_dim, g.hidden),
                           f"{sa}v_proj.weight": (g.kv_heads * g.head_dim, g.hidden),
                           f"{sa}o_proj.weight": (g.hidden, g.heads * g.head_dim),
                           f"{sa}q_norm.weight": (g.head_dim,), f"{sa}k_norm.weight": (g.head_dim,)})
        mp = f"{lp}mlp."
        shapes.update({f"{mp}gate_proj.weight": (g.intermediate, g.hidden), f"{mp}up_proj.weight": (g.intermediate, g.hidden),
                       f"{mp}down_proj.weight": (g.hidden, g.intermediate)})
    shapes[f"{p}norm.weight"] = (g.hidden,)
    if not g.tied:
        shapes["lm_head.weight"] = (g.vocab, g.hidden)
    return shapes


def _random(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name.endswith("A_log"):
        return np.log(rng.uniform(1, 16, shape)).astype(BF16)
    if name.endswith(("norm.weight", "dt_bias")):
        return (rng.random(shape, np.float32) * 0.2 - 0.1).astype(BF16)
    fan_in = shape[-1] if len(shape) > 1 else 1
    scale = np.float32(2 * np.sqrt(3.0 / fan_in))  # uniform with variance 1 / fan_in
    return ((rng.random(shape, np.float32) - np.float32(0.5)) * scale).astype(BF16)


def write_checkpoint(out_dir, g: Geometry, *, shard_bytes: int = 2 << 30, seed: int = 0) -> Path:
    """Write the checkpoint shard by shard; config.json comes last, so its presence marks a complete folder."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(g)
    weight_map: dict[str, str] = {}
    shard: dict[str, np.ndarray] = {}
    size = 0  # bytes in shard

    def flush():
        file = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, out_dir / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        shard.clear()

    for name, shape in shapes.items():
        tensor = _random(rng, name, shape)
        if shard and size + tensor.nbytes > shard_bytes:
            flush()
            size = 0
        shard[name] = tensor
        size += tensor.nbytes
    flush()
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(int(np.prod(s)) * BF16.itemsize for s in shapes.values())},
         "weight_map": weight_map}, indent=1))
    (out_dir / "config.json").write_text(json.dumps(config(g), indent=1))
    return out_dir
