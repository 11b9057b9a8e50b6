"""Random, well-conditioned inputs for the contract operators (used by tests and benchmarks).

Values follow the magnitudes of real models: unit-variance activations, decays in (0, 1], keys that are
L2-normalised either by the op (``qk_l2_norm=1``) or here upstream (the delta rules need unit keys,
docs/op-contract.md#sequential-definition).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import ml_dtypes
import numpy as np

from onnx_hybrid.ops.contract import UPDATE_RULES

DTYPES = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@dataclass
class Case:
    """A node's feeds and attributes, ready for ORT, the reference or a GPU launcher."""

    feeds: dict
    attributes: dict
    lengths: list = field(default_factory=list)

    def describe(self) -> str:
        shapes = {k: list(np.shape(v)) for k, v in self.feeds.items() if v is not None}
        return f"lengths={self.lengths} attrs={self.attributes} shapes={shapes}"


def offsets(lengths: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def random_gdn_case(
    rng: np.random.Generator,
    lengths: Sequence[int] = (5, 9),
    *,
    num_heads_q: int = 2,
    num_heads_v: int = 4,
    head_size_k: int = 16,
    head_size_v: int = 8,
    dtype: str = "float",
    update_rule: str = "gated_delta",
    gate_activation: str = "qwen",
    beta_activation: str = "sigmoid",
    qk_l2_norm: int = 1,
    scale: float = 0.0,
    chunk_size: int = 64,
    capacity: int = 0,
    capture: Sequence[int] | None = None,
    active: int | None = None,
    with_state: bool = True,
    layout: str = "ragged",
    per_key_decay: bool = False,
) -> Case:
    """``layout``: ragged (cu_seqlens), uniform (rank 3, no cu_seqlens), rank4, packed (rank 2 + cu_seqlens),
    packed_uniform (rank 2, no cu_seqlens) or packed_rank3 ([B, S, W])."""
    lengths = list(lengths)
    batch, total = len(lengths), int(sum(lengths))
    if layout not in ("ragged", "packed") and len(set(lengths)) != 1:
        raise ValueError(f"layout {layout} needs equal lengths, got {lengths}")
    np_dtype = DTYPES[dtype]
    hq, hv, dk, dv = num_heads_q, num_heads_v, head_size_k, head_size_v
    has_decay, has_delta = UPDATE_RULES[update_rule]

    q = rng.standard_normal((total, hq, dk))
    k = rng.standard_normal((total, hq, dk))
    if has_delta and not qk_l2_norm:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
    v = rng.standard_normal((total, hv, dv))
    feeds: dict = {}
    attrs: dict = {"update_rule": update_rule, "qk_l2_norm": qk_l2_norm, "scale": scale, "chunk_size": chunk_size}
    decay_shape = (total, hv, dk) if per_key_decay else (total, hv)
    if has_decay:
        if gate_activation == "qwen":
            feeds["decay"] = rng.standard_normal(decay_shape).astype(np.float32)
            feeds["a_log"] = np.log(rng.uniform(0.5, 8.0, hv)).astype(np.float32)
            feeds["dt_bias"] = rng.uniform(-1.0, 1.0, hv).astype(np.float32)
        else:
            feeds["decay"] = -rng.uniform(0.005, 0.5, decay_shape).astype(np.float32)
    if gate_activation == "qwen":
        attrs["gate_activation"] = "qwen"
        if not has_decay:
            raise ValueError("gate_activation=qwen needs a rule with decay")
    if has_delta:
        if beta_activation == "sigmoid":
            feeds["beta"] = rng.standard_normal((total, hv)).astype(np.float32)
            attrs["beta_activation"] = "sigmoid"
        else:
            feeds["beta"] = rng.uniform(0.05, 1.0, (total, hv)).astype(np.float32)
    if with_state or layout in ("uniform", "packed", "packed_uniform", "packed_rank3"):
        feeds["initial_state"] = (0.1 * rng.standard_normal((batch, hv, dv, dk))).astype(np.float32)
    if capacity:
        attrs["state_update_capacity"] = capacity
        counts = capture if capture is not None else [capacity] * batch
        feeds["capture_count"] = np.asarray(counts, dtype=np.int32)
        if active is not None:
            feeds["state_update_active"] = np.asarray([active], dtype=np.int32)

    q, k, v = (x.astype(np_dtype) for x in (q, k, v))
    seq = total // batch
    if layout in ("ragged", "packed"):
        feeds["cu_seqlens"] = offsets(lengths)
    if layout in ("ragged", "uniform"):
        feeds.update(query=q, key=k, value=v)
    elif layout == "rank4":
        feeds.update(query=q.reshape(batch, seq, hq, dk), key=k.reshape(batch, seq, hq, dk),
                     value=v.reshape(batch, seq, hv, dv))
        for name in ("decay", "beta"):
            if name in feeds:
                feeds[name] = feeds[name].reshape((batch, seq) + feeds[name].shape[1:])
    else:
        packed = np.concatenate([q.reshape(total, -1), k.reshape(total, -1), v.reshape(total, -1)], axis=1)
        if layout == "packed_rank3":
            packed = packed.reshape(batch, seq, -1)
            for name in ("decay", "beta"):
                if name in feeds:
                    feeds[name] = feeds[name].reshape((batch, seq) + feeds[name].shape[1:])
        feeds["query"] = packed
    return Case(feeds=feeds, attributes=attrs, lengths=lengths)


def random_conv_case(
    rng: np.random.Generator,
    lengths: Sequence[int] = (10, 5, 1, 8),
    *,
    channels: int = 12,
    kernel_size: int = 4,
    dilation: int = 1,
    dtype: str = "float",
    activation: str = "silu",
    with_bias: bool = True,
    capacity: int = 0,
    capture: Sequence[int] | None = None,
) -> Case:
    lengths = list(lengths)
    batch, total = len(lengths), int(sum(lengths))
    np_dtype = DTYPES[dtype]
    sl = (kernel_size - 1) * dilation
    feeds = {
        "input": rng.standard_normal((total, channels)).astype(np_dtype),
        "weight": (rng.standard_normal((channels, 1, kernel_size)) / np.sqrt(kernel_size)).astype(np_dtype),
        "cumulative_sequence_length": offsets(lengths),
        "bias": (0.1 * rng.standard_normal(channels)).astype(np_dtype) if with_bias else None,
        "initial_state": rng.standard_normal((batch, channels, sl)).astype(np_dtype),
    }
    attrs: dict = {"activation": activation, "dilation": dilation}
    if capacity:
        attrs["state_update_capacity"] = capacity
        counts = capture if capture is not None else [capacity] * batch
        feeds["capture_count"] = np.asarray(counts, dtype=np.int32)
    return Case(feeds={k: v for k, v in feeds.items() if v is not None}, attributes=attrs, lengths=lengths)


def random_paged_attention_case(
    rng: np.random.Generator,
    lengths: Sequence[int] = (5, 1),
    past: Sequence[int] = (0, 20),
    *,
    num_heads: int = 4,
    kv_num_heads: int = 2,
    head_size: int = 32,
    block_size: int = 16,
    spare_blocks: int = 2,
    spare_columns: int = 1,
    dtype: str = "float",
    scale: float = 0.0,
) -> Case:
    """A PagedAttention call over a random pool whose blocks are handed out to the requests in shuffled
    order (``spare_blocks`` never used, ``spare_columns`` table columns past the longest request filled
    with -1: the op may read neither)."""
    dt = DTYPES[dtype]
    needed = [-(-(p + n) // block_size) for p, n in zip(past, lengths)]
    columns = max(needed) + spare_columns
    num_blocks = sum(needed) + spare_blocks
    order = rng.permutation(num_blocks)
    table = np.full((len(lengths), columns), -1, np.int32)
    used = 0
    for b, count in enumerate(needed):
        table[b, :count] = order[used:used + count]
        used += count
    tokens = int(sum(lengths))

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(dt)

    feeds = dict(
        query=rand(tokens, num_heads * head_size), key=rand(tokens, kv_num_heads * head_size),
        value=rand(tokens, kv_num_heads * head_size),
        key_cache=rand(num_blocks, block_size, kv_num_heads, head_size),
        value_cache=rand(num_blocks, block_size, kv_num_heads, head_size),
        cumulative_sequence_lengths=offsets(lengths), past_sequence_lengths=np.asarray(past, np.int32),
        block_table=table,
    )
    attributes = dict(num_heads=num_heads, kv_num_heads=kv_num_heads)
    if scale:
        attributes["scale"] = scale
    return Case(feeds, attributes, list(lengths))
