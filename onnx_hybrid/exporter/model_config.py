"""Read a Hugging Face ``config.json`` of a hybrid checkpoint into a typed, layout-free description.

Only JSON is read here (no transformers), and every default is the one transformers 5.23 applies
(docs/model.md#supported-checkpoints-and-configuration). Unsupported architectures and RoPE types fail here, before
any tensor is touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ExportError

# architectures[0] -> (family, multimodal wrapper?)
SUPPORTED_ARCHITECTURES = {
    "Qwen3_5ForCausalLM": ("qwen3_5", False),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", True),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", False),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", True),
    "Qwen3NextForCausalLM": ("qwen3_next", False),
}

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    expert_size: int  # moe_intermediate_size (F)
    shared_expert_size: int  # shared_expert_intermediate_size (Fs)
    renormalize: bool  # renormalise the top-k probabilities


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: str  # qwen3_5 | qwen3_5_moe | qwen3_next
    multimodal: bool
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    moe_layers: tuple[bool, ...]  # per layer: MoE block (True) or dense MLP (False)
    intermediate_size: int | None
    rms_norm_eps: float
    # full attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    # Gated DeltaNet
    gdn_key_heads: int
    gdn_value_heads: int
    gdn_key_dim: int
    gdn_value_dim: int
    conv_kernel: int
    tie_word_embeddings: bool
    moe: MoeConfig | None
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: tuple[int, ...]
    pad_token_id: int | None
    mtp_num_hidden_layers: int | None = None  # as declared; the weights decide whether a head exists

    @property
    def key_dim(self) -> int:
        return self.gdn_key_heads * self.gdn_key_dim

    @property
    def value_dim(self) -> int:
        return self.gdn_value_heads * self.gdn_value_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR]


def _supported_list() -> str:
    return ", ".join(SUPPORTED_ARCHITECTURES)


def load_model_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ExportError(f"{model_dir}: no config.json found (is this a Hugging Face checkpoint folder?)")
    try:
        top = json.loads(path.read_text())
    except ValueError as error:
        raise ExportError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(top, dict):
        raise ExportError(f"{path} must hold a JSON object")
    return parse_model_config(top)


def parse_model_config(top: dict) -> ModelConfig:
    archs = top.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ExportError(f"unsupported architecture {arch!r} (model_type {top.get('model_type')!r}); "
                          f"supported: {_supported_list()}")
    family, multimodal = SUPPORTED_ARCHITECTURES[arch]
    text = top.get("text_config", top) if multimodal else top
    if multimodal and "text_config" not in top:
        raise ExportError(f"{arch} config.json has no text_config")

    def need(key):
        if key not in text:
            raise ExportError(f"config.json: {arch} text config lacks required field {key!r}")
        return text[key]

    num_layers = int(need("num_hidden_layers"))
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = int(text.get("full_attention_interval", 4))
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    if len(layer_types) != num_layers or set(layer_types) - {LINEAR, FULL}:
        raise ExportError(f"config.json: layer_types must list {num_layers} entries of {LINEAR!r} / {FULL!r}; "
                          f"got {layer_types}")

    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):  # text-only M-RoPE is 1-D RoPE (docs/model.md#gated-full-attention)
        raise ExportError(f"unsupported rope_type {rope_type!r}; supported: default (and mrope for text)")
    theta = float(rope.get("rope_theta", text.get("rope_theta", 10000.0)))
    partial = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
    head_dim = int(text.get("head_dim") or need("hidden_size") // need("num_attention_heads"))
    rotary_dim = int(head_dim * partial)

    moe = None
    moe_layers = [False] * num_layers
    if family in ("qwen3_5_moe", "qwen3_next"):
        moe = MoeConfig(
            num_experts=int(need("num_experts")),
            top_k=int(need("num_experts_per_tok")),
            expert_size=int(need("moe_intermediate_size")),
            shared_expert_size=int(need("shared_expert_intermediate_size")),
            renormalize=True if family == "qwen3_5_moe" else bool(text.get("norm_topk_prob", True)),
        )
        if family == "qwen3_5_moe":
            moe_layers = [True] * num_layers
        else:
            step = int(text.get("decoder_sparse_step", 1))
            dense_only = set(text.get("mlp_only_layers") or [])
            moe_layers = [i not in dense_only and moe.num_experts > 0 and (i + 1) % step == 0
                          for i in range(num_layers)]
    intermediate = text.get("intermediate_size")
    if not all(moe_layers) and intermediate is None:
        raise ExportError("config.json: intermediate_size is required for dense MLP layers")

    eos = text.get("eos_token_id", top.get("eos_token_id"))
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
    tie = bool(text.get("tie_word_embeddings", top.get("tie_word_embeddings", False)))

    cfg = ModelConfig(
        architecture=arch, family=family, multimodal=multimodal,
        vocab_size=int(need("vocab_size")), hidden_size=int(need("hidden_size")), num_layers=num_layers,
        layer_types=tuple(layer_types), moe_layers=tuple(moe_layers),
        intermediate_size=None if intermediate is None else int(intermediate),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        num_heads=int(need("num_attention_heads")), num_kv_heads=int(need("num_key_value_heads")),
        head_dim=head_dim, rotary_dim=rotary_dim, rope_theta=theta,
        gdn_key_heads=int(need("linear_num_key_heads")), gdn_value_heads=int(need("linear_num_value_heads")),
        gdn_key_dim=int(need("linear_key_head_dim")), gdn_value_dim=int(need("linear_value_head_dim")),
        conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
        tie_word_embeddings=tie, moe=moe,
        max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
        bos_token_id=text.get("bos_token_id", top.get("bos_token_id")),
        eos_token_id=eos,
        pad_token_id=text.get("pad_token_id", top.get("pad_token_id")),
        mtp_num_hidden_layers=text.get("mtp_num_hidden_layers"),
    )
    _check_geometry(cfg)
    return cfg


def _check_geometry(cfg: ModelConfig) -> None:
    if cfg.gdn_value_heads % cfg.gdn_key_heads:
        raise ExportError(f"linear_num_value_heads ({cfg.gdn_value_heads}) must be a multiple of "
                          f"linear_num_key_heads ({cfg.gdn_key_heads})")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ExportError(f"num_attention_heads ({cfg.num_heads}) must be a multiple of "
                          f"num_key_value_heads ({cfg.num_kv_heads})")
    if cfg.rotary_dim % 2 or not 0 < cfg.rotary_dim <= cfg.head_dim:
        raise ExportError(f"rotary dims head_dim * partial_rotary_factor = {cfg.rotary_dim} must be even "
                          f"and in (0, {cfg.head_dim}]")
