"""Write ``genai_config.json`` for a hybrid decoder export, non-paged or paged (onnxruntime-genai 0.18).

:func:`genai_config` is a pure function of a typed :class:`DecoderExport`; the exporter fills the
description, and other writers (state_groups variants, the paged export) can build on the same data.
Layout: docs/genai-config.md#non-paged-export and #paged-export; with a state-update capacity, and always in
paged exports, the decoder also declares its ``state_groups`` (``state_groups.py``: the released form by default,
the #2454 bindings form on request) so that the capture inputs and update outputs are bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .state_groups import (FULL_ATTENTION, LINEAR_ATTENTION, RELEASED, DecoderStates, StateNames, manifest_for,
                           write_state_groups)


# The CUDA provider option onnxruntime-genai reads to capture decode steps in CUDA graphs.
CUDA_GRAPH_OPTION = "enable_cuda_graph"


@dataclass(frozen=True)
class DecoderIO:
    """Graph tensor names, keyed as in ``model.decoder.inputs`` / ``outputs``."""

    inputs: dict[str, str]
    outputs: dict[str, str]


@dataclass(frozen=True)
class PagedCache:
    """The paged KV pool of a paged export: ``engine.dynamic_batching`` (docs/genai-config.md#pool-size)."""

    block_size: int
    num_blocks: int | None = None  # None: the runtime sizes the pool from gpu_utilization_factor
    # The share of the device memory free after loading that the runtime's pool may take, when num_blocks is
    # unset. onnxruntime-genai 0.18 has no usable default: without either key og.Engine refuses the model.
    gpu_utilization_factor: float | None = None


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
    paged: PagedCache | None = None
    manifest_format: str = RELEASED  # state_groups form: "released" (0.18) or "bindings" (#2454)
    execution_provider: str = "cpu"  # "cpu" or "cuda": session_options.provider_options
    share_kv_buffers: bool = False  # GroupQueryAttention over one past/present buffer (--kv-cache shared)
    cuda_graph: bool = False  # the CUDA provider's enable_cuda_graph: og captures decode steps (needs shared buffers)

    def decoder_states(self) -> DecoderStates:
        layer_types = tuple(LINEAR_ATTENTION if i in self.linear_layer_ids else FULL_ATTENTION
                            for i in range(self.num_hidden_layers))
        # The state groups bind the very names the graph declares (self.io), not a second copy of them.
        names = StateNames.from_decoder({"inputs": self.io.inputs, "outputs": self.io.outputs})
        return DecoderStates(layer_types, self.gdn_key_heads, self.state_update_capacity, paged=self.paged is not None,
                             names=names)


def provider_options(execution_provider: str, cuda_graph: bool = False) -> list[dict]:
    """``session_options.provider_options``: onnxruntime-genai appends the providers listed, in order, ahead of
    its CPU fallback; an empty list runs the CPU provider alone. ``enable_cuda_graph`` is written either way, as
    onnxruntime-genai's builder does, so the file says which it is."""
    if execution_provider == "cpu":
        return []
    if execution_provider == "cuda":
        return [{"cuda": {CUDA_GRAPH_OPTION: "1" if cuda_graph else "0"}}]
    raise ValueError(f"execution_provider must be 'cpu' or 'cuda', got {execution_provider!r}")


def genai_config(desc: DecoderExport) -> dict:
    session_options = {"log_id": "onnxruntime-genai",
                       "provider_options": provider_options(desc.execution_provider, desc.cuda_graph),
                       **desc.session_options}
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
    if desc.state_update_capacity or desc.paged:
        write_state_groups(decoder, manifest_for(desc.decoder_states()), desc.manifest_format)
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
        # Concat graphs grow present by S; shared-KV graphs write into the past buffer in place.
        "past_present_share_buffer": desc.share_kv_buffers,
        "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
    }
    config = {"model": model, "search": search}
    if desc.paged:
        pool = {"block_size": desc.paged.block_size}
        if desc.paged.num_blocks is not None:
            pool["num_blocks"] = desc.paged.num_blocks
        if desc.paged.gpu_utilization_factor is not None:
            pool["gpu_utilization_factor"] = desc.paged.gpu_utilization_factor
        config["engine"] = {"dynamic_batching": pool}
    return config
