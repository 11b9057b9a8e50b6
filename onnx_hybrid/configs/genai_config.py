"""Write ``genai_config.json`` for a non-paged hybrid decoder export (onnxruntime-genai 0.18, released form).

:func:`genai_config` is a pure function of a typed :class:`DecoderExport`; the exporter fills the
description, and other writers (state_groups variants, the paged export) can build on the same data.
Layout follows genai_config.md §7.4; with a state-update capacity the decoder also declares the
released (V4) ``state_groups`` of §2.5 so that the capture inputs and update outputs are bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DecoderIO:
    """Graph tensor names, keyed as in ``model.decoder.inputs`` / ``outputs``."""

    inputs: dict[str, str]
    outputs: dict[str, str]


@dataclass(frozen=True)
class DecoderExport:
    model_type: str  # genai model.type, e.g. "qwen3_5_text"
    filename: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    context_length: int
    io: DecoderIO
    linear_layer_ids: tuple[int, ...]
    gdn_key_heads: int
    state_update_capacity: int = 0
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    custom_ops_library: str | None = None
    session_options: dict = field(default_factory=dict)  # extra entries, e.g. intra_op_num_threads


def state_groups(desc: DecoderExport) -> list[dict]:
    """The fixed-state groups of the linear layers, with compact updates (genai_config.md §2.2, §2.5)."""
    cap = desc.state_update_capacity
    layers = list(desc.linear_layer_ids)
    return [
        {"kind": "fixed_conv", "layer_ids": layers, "state_update": {"capacity": cap}},
        {"kind": "fixed_recurrent", "layer_ids": layers,
         "state_update": {"capacity": cap, "key_head_count": desc.gdn_key_heads}},
    ]


def genai_config(desc: DecoderExport) -> dict:
    session_options = {"log_id": "onnxruntime-genai", "provider_options": [], **desc.session_options}
    if desc.custom_ops_library:
        session_options["custom_ops_library"] = desc.custom_ops_library
    decoder = {
        "session_options": session_options,
        "filename": desc.filename,
        "head_size": desc.head_size,
        "hidden_size": desc.hidden_size,
        "inputs": dict(desc.io.inputs),
        "outputs": dict(desc.io.outputs),
        "num_attention_heads": desc.num_attention_heads,
        "num_hidden_layers": desc.num_hidden_layers,
        "num_key_value_heads": desc.num_key_value_heads,
    }
    if desc.state_update_capacity:
        decoder["state_groups"] = state_groups(desc)
        decoder["state_update_capacity"] = desc.state_update_capacity
    pad = desc.pad_token_id if desc.pad_token_id is not None else (desc.eos_token_id or (0,))[0]
    model = {
        "bos_token_id": desc.bos_token_id if desc.bos_token_id is not None else pad,
        "context_length": desc.context_length,
        "decoder": decoder,
        "eos_token_id": list(desc.eos_token_id) if len(desc.eos_token_id) != 1 else desc.eos_token_id[0],
        "pad_token_id": pad,
        "type": desc.model_type,
        "vocab_size": desc.vocab_size,
    }
    search = {
        "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
        "max_length": desc.context_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
        "num_return_sequences": 1,
        # The graph concatenates past and new KV (present grows by S), so buffers are not shared.
        "past_present_share_buffer": False,
        "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
    }
    return {"model": model, "search": search}
