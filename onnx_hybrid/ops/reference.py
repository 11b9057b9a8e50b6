"""float64 NumPy reference of GatedDeltaNet and VarlenCausalConvWithState, and of PagedAttention and Linear
(docs/op-contract.md: #sequential-definition, #chunked-engine, #conv-math-and-state-layout, #pagedattention, #linear).

Every function takes ``feeds`` exactly as an ONNX Runtime feed dict (the contract's input names; absent inputs
missing or None) plus the node's attributes, checks shapes through the contract, and returns the op's three
outputs in float64 (``(output, final_state, state_update)`` for the state ops). This is the oracle the kernels
are tested against: it is written for clarity, token by token, not for speed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import contract
from .contract import (GATED_DELTA_NET, LINEAR, PAGED_ATTENTION, QUANTIZED_LINEAR, QUANTIZED_LINEAR_INT8_LEVEL,
                       UPDATE_RULES, VARLEN_CAUSAL_CONV)

Feeds = Mapping[str, Any]


def _f64(x) -> np.ndarray | None:
    return None if x is None else np.asarray(x).astype(np.float64)


def _shapes(feeds: Feeds) -> dict:
    return {name: (None if value is None else np.shape(value)) for name, value in feeds.items()}


def _reject_unknown_inputs(op: contract.OpSpec, feeds: Feeds) -> None:
    unknown = set(feeds) - {p.name for p in op.inputs}
    if unknown:
        raise KeyError(f"{op.name}: unknown input(s) {sorted(unknown)}")


# --------------------------------------------------------------------------------------------------
# GatedDeltaNet
# --------------------------------------------------------------------------------------------------


class _GdnProblem:
    """A call unpacked into token-major float64 arrays and per-request rows."""

    def __init__(self, feeds: Feeds, attributes: Mapping[str, Any]):
        _reject_unknown_inputs(GATED_DELTA_NET, feeds)
        self.attrs = contract.resolve_attributes(GATED_DELTA_NET, attributes)
        geo = self.geo = contract.resolve_gdn(_shapes(feeds), self.attrs)
        t, hq, hv, dk, dv = geo.total_tokens, geo.num_heads_q, geo.num_heads_v, geo.head_size_k, geo.head_size_v
        if geo.packed:
            packed = _f64(feeds["query"]).reshape(t, -1)
            self.q = packed[:, : hq * dk].reshape(t, hq, dk)
            self.k = packed[:, hq * dk: 2 * hq * dk].reshape(t, hq, dk)
            self.v = packed[:, 2 * hq * dk:].reshape(t, hv, dv)
        else:
            self.q = _f64(feeds["query"]).reshape(t, hq, dk)
            self.k = _f64(feeds["key"]).reshape(t, hq, dk)
            self.v = _f64(feeds["value"]).reshape(t, hv, dv)
        decay = feeds.get("decay")
        self.decay = None if decay is None else _f64(decay).reshape((t, hv, dk) if geo.per_key_decay else (t, hv))
        beta = feeds.get("beta")
        self.beta = None if beta is None else _f64(beta).reshape(t, hv)
        state = feeds.get("initial_state")
        self.state0 = np.zeros(geo.state_shape) if state is None else _f64(state)
        self.a_log = _f64(feeds.get("a_log"))
        self.dt_bias = _f64(feeds.get("dt_bias"))

        cu = feeds.get("cu_seqlens")
        if cu is not None:
            self.rows = contract.check_offsets(GATED_DELTA_NET.name, np.asarray(cu).tolist(), t)
        else:
            per_row = t // geo.batch
            self.rows = [(b * per_row, per_row) for b in range(geo.batch)]

        c = geo.capacity
        active = feeds.get("state_update_active")
        self.capture_active = c > 0 and (active is None or int(np.asarray(active).reshape(-1)[0]) != 0)
        counts = feeds.get("capture_count")
        self.captured = [
            contract.captured_prefix(counts[b], c, n) if self.capture_active else 0
            for b, (_, n) in enumerate(self.rows)
        ]
        self.head_of = np.arange(hv) // geo.group  # q/k head of each value head
        self.has_decay, self.has_delta = UPDATE_RULES[self.attrs["update_rule"]]
        scale = self.attrs["scale"]
        self.scale = scale if scale != 0.0 else 1.0 / np.sqrt(dk)

    # Per-token quantities, all value heads at once ------------------------------------------------

    def qk(self, tok: int) -> tuple[np.ndarray, np.ndarray]:
        """q and k of token ``tok`` per q/k head, after the optional L2 norm."""
        q, k = self.q[tok], self.k[tok]
        if self.attrs["qk_l2_norm"]:
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + contract.L2_NORM_EPS)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + contract.L2_NORM_EPS)
        return q, k

    def log_gate(self, tok: int) -> np.ndarray:
        """g per value head ([Hv] or [Hv, Dk]); zeros for rules without decay."""
        if not self.has_decay:
            return np.zeros(self.geo.num_heads_v)
        raw = self.decay[tok]
        if self.attrs["gate_activation"] == "qwen":
            a_log, dt_bias = (self.a_log, self.dt_bias) if raw.ndim == 1 else (
                self.a_log[:, None], self.dt_bias[:, None])
            return -np.exp(a_log) * _softplus(raw + dt_bias)
        return raw

    def beta_at(self, tok: int) -> np.ndarray:
        if not self.has_delta:
            return np.ones(self.geo.num_heads_v)
        b = self.beta[tok]
        return 1.0 / (1.0 + np.exp(-b)) if self.attrs["beta_activation"] == "sigmoid" else b

    def new_capsule(self) -> np.ndarray:
        return np.zeros((self.geo.batch, self.geo.capsule_width))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > contract.SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, contract.SOFTPLUS_THRESHOLD))))


def _expand(gate: np.ndarray) -> np.ndarray:
    """Broadcast a per-head ([Hv]) or per-key ([Hv, Dk]) factor against a V-major state [Hv, Dv, Dk]."""
    return gate[:, None, None] if gate.ndim == 1 else gate[:, None, :]


def gated_delta_net(feeds: Feeds, **attributes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequential definition (docs/op-contract.md#sequential-definition), token by token, float64."""
    p = _GdnProblem(feeds, attributes)
    geo = p.geo
    out = np.zeros((geo.total_tokens, geo.num_heads_v, geo.head_size_v))
    final = p.state0.copy()
    capsule = p.new_capsule()
    layout = geo.capsule_layout()
    for b, (start, n) in enumerate(p.rows):
        s = final[b]  # [Hv, Dv, Dk]
        decay_slots, key_slots, delta_slots = layout.split(capsule[b])
        for t in range(n):
            tok = start + t
            q, k = p.qk(tok)
            qv, kv = q[p.head_of], k[p.head_of]  # per value head
            alpha = np.exp(p.log_gate(tok)) if p.has_decay else np.ones(geo.num_heads_v)
            s = s * _expand(alpha)
            if p.has_delta:
                u = p.beta_at(tok)[:, None] * (p.v[tok] - np.einsum("hcr,hr->hc", s, kv))
            else:
                u = p.v[tok]
            s = s + u[:, :, None] * kv[:, None, :]
            out[tok] = p.scale * np.einsum("hcr,hr->hc", s, qv)
            if t < p.captured[b]:
                decay_slots[t] = alpha
                key_slots[t] = k
                delta_slots[t] = u
        final[b] = s
    return out.reshape(geo.output_shape), final, capsule


def gated_delta_net_chunked(feeds: Feeds, **attributes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chunked formulation (docs/op-contract.md#chunked-engine) in float64, ``chunk_size`` tokens a chunk.

    Handles scalar and per-key decay through the same algebra (the decay ratios e^{γ_t − γ_s} carry a key
    axis). The capsule's delta block is filled from the rows of U, which equal the sequential deltas in
    exact arithmetic.
    """
    p = _GdnProblem(feeds, attributes)
    geo = p.geo
    bt = p.attrs["chunk_size"]
    hv, dk, dv = geo.num_heads_v, geo.head_size_k, geo.head_size_v
    out = np.zeros((geo.total_tokens, hv, dv))
    final = p.state0.copy()
    capsule = p.new_capsule()
    layout = geo.capsule_layout()
    for b, (start, n) in enumerate(p.rows):
        s = final[b].transpose(0, 2, 1).copy()  # K-major [Hv, Dk, Dv] for the block algebra
        decay_slots, key_slots, delta_slots = layout.split(capsule[b])
        for c0 in range(0, n, bt):
            toks = range(start + c0, start + min(n, c0 + bt))
            length = len(toks)
            qk = [p.qk(tok) for tok in toks]
            q = np.stack([x[0][p.head_of] for x in qk], axis=1)  # [Hv, L, Dk]
            k = np.stack([x[1][p.head_of] for x in qk], axis=1)
            v = np.stack([p.v[tok] for tok in toks], axis=1)  # [Hv, L, Dv]
            g = np.stack([np.broadcast_to(_as_key_axis(p.log_gate(tok)), (hv, dk)) for tok in toks], axis=1)
            beta = np.stack([p.beta_at(tok) for tok in toks], axis=1)  # [Hv, L]
            gamma = np.cumsum(g, axis=1)  # [Hv, L, Dk]
            # e^{γ_t − γ_s} for s <= t only (<= 1); above the diagonal the exponent is masked to −inf before
            # exp, since there it can overflow and inf * 0 would turn the masked entries into nan.
            lower = np.tril(np.ones((length, length), dtype=bool))[None, :, :, None]
            ratio = np.exp(np.where(lower, gamma[:, :, None, :] - gamma[:, None, :, :], -np.inf))  # [Hv,t,s,Dk]
            kk = np.einsum("htr,hsr,htsr->hts", k, k, ratio)
            qk_ = np.einsum("htr,hsr,htsr->hts", q, k, ratio)
            if p.has_delta:
                m = beta[:, :, None] * kk * np.tril(np.ones((length, length)), -1)
                w = beta[:, :, None] * k * np.exp(gamma)  # rows β_t (e^{γ_t} ⊙ k_t)
                rhs = beta[:, :, None] * v - np.einsum("htr,hrc->htc", w, s)
                u = np.linalg.solve(np.eye(length) + m, rhs)
            else:
                u = v
            qg = q * np.exp(gamma)
            o = p.scale * (np.einsum("hts,hsc->htc", qk_, u) + np.einsum("htr,hrc->htc", qg, s))
            kd = k * np.exp(gamma[:, -1:, :] - gamma)
            s = np.exp(gamma[:, -1, :])[:, :, None] * s + np.einsum("hsr,hsc->hrc", kd, u)
            for i, tok in enumerate(toks):
                out[tok] = o[:, i]
                t = tok - start
                if t < p.captured[b]:
                    decay_slots[t] = np.exp(g[:, i, 0]) if p.has_decay else 1.0
                    key_slots[t] = qk[i][1]
                    delta_slots[t] = u[:, i]
        final[b] = s.transpose(0, 2, 1)
    return out.reshape(geo.output_shape), final, capsule


def _as_key_axis(g: np.ndarray) -> np.ndarray:
    """[Hv] -> [Hv, 1] so scalar and per-key gates share one code path."""
    return g[:, None] if g.ndim == 1 else g


# --------------------------------------------------------------------------------------------------
# VarlenCausalConvWithState
# --------------------------------------------------------------------------------------------------


def varlen_causal_conv(feeds: Feeds, **attributes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """docs/op-contract.md#conv-math-and-state-layout and #conv-capsule-and-replay, float64."""
    _reject_unknown_inputs(VARLEN_CAUSAL_CONV, feeds)
    attrs = contract.resolve_attributes(VARLEN_CAUSAL_CONV, attributes)
    geo = contract.resolve_conv(_shapes(feeds), attrs)
    x = _f64(feeds["input"])
    w = _f64(feeds["weight"])[:, 0, :]  # [Ch, K]
    bias = feeds.get("bias")
    bias = np.zeros(geo.channels) if bias is None else _f64(bias)
    state = _f64(feeds["initial_state"])
    rows = contract.check_offsets(VARLEN_CAUSAL_CONV.name, np.asarray(feeds["cumulative_sequence_length"]).tolist(),
                                  geo.total_tokens)
    sl, kernel, dil = geo.state_length, geo.kernel_size, attrs["dilation"]
    out = np.zeros_like(x)
    final = np.zeros_like(state)
    capsule = np.zeros((geo.batch, geo.capacity, geo.channels))
    counts = feeds.get("capture_count")
    for b, (start, n) in enumerate(rows):
        virtual = np.concatenate([state[b].T, x[start:start + n]], axis=0)  # [SL + n, Ch], p = index - SL
        for t in range(n):
            taps = [virtual[sl + t - (kernel - 1 - j) * dil] for j in range(kernel)]
            z = bias + sum(w[:, j] * taps[j] for j in range(kernel))
            out[start + t] = z / (1.0 + np.exp(-z)) if attrs["activation"] in ("silu", "swish") else z
        final[b] = virtual[n:].T if sl else final[b]
        if geo.capacity:
            m = contract.captured_prefix(counts[b], geo.capacity, n)
            capsule[b, :m] = x[start:start + m]
    return out, final, capsule


# --------------------------------------------------------------------------------------------------
# PagedAttention
# --------------------------------------------------------------------------------------------------


def paged_attention(feeds: Feeds, **attributes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """docs/op-contract.md#pagedattention, float64: ``(output, key_cache, value_cache)``.

    Token j of request b (``cu[b] <= j < cu[b+1]``) sits at position ``past[b] + j - cu[b]``; its key and
    value go to slot ``pos % block_size`` of pool block ``block_table[b, pos // block_size]``, and its query
    head h attends with ``scale`` over positions 0..pos of its request in KV head ``h // (Hq / Hkv)``.
    """
    _reject_unknown_inputs(PAGED_ATTENTION, feeds)
    attrs = contract.resolve_attributes(PAGED_ATTENTION, attributes)
    geo = contract.resolve_paged_attention(_shapes(feeds), attrs)
    table = np.asarray(feeds["block_table"])
    rows = contract.check_paged_rows(geo, np.asarray(feeds["cumulative_sequence_lengths"]).tolist(),
                                     np.asarray(feeds["past_sequence_lengths"]).tolist(), table)
    n, hkv, d, bs = geo.num_tokens, geo.kv_num_heads, geo.head_size, geo.block_size
    q = _f64(feeds["query"]).reshape(n, geo.num_heads, d)
    k, v = _f64(feeds["key"]).reshape(n, hkv, d), _f64(feeds["value"]).reshape(n, hkv, d)
    key_cache, value_cache = _f64(feeds["key_cache"]), _f64(feeds["value_cache"])
    out = np.zeros_like(q)
    kv_head = np.arange(geo.num_heads) // geo.group
    for b, (start, length, past) in enumerate(rows):
        block, offset = table[b, np.arange(past + length) // bs], np.arange(past + length) % bs
        key_cache[block[past:], offset[past:]] = k[start:start + length]  # all writes precede the reads
        value_cache[block[past:], offset[past:]] = v[start:start + length]
        keys, values = key_cache[block, offset], value_cache[block, offset]  # [P, Hkv, D]
        for t in range(length):
            visible = past + t + 1
            scores = np.einsum("hd,phd->hp", q[start + t], keys[:visible, kv_head]) * geo.scale
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            out[start + t] = np.einsum("hp,phd->hd", probs, values[:visible, kv_head])
    return out.reshape(n, -1), key_cache, value_cache


# --------------------------------------------------------------------------------------------------
# Linear
# --------------------------------------------------------------------------------------------------


def linear(feeds: Feeds, activation: str = "none", output_features: Sequence[int] = ()):
    """output [rows, out_features] = input [rows, in_features] @ weight^T (weight [out_features, in_features]); with
    ``activation`` "swiglu" the weight's first half of rows are gate rows and the second half up rows, and the output
    [rows, out_features / 2] is SiLU(gate) * up. With ``output_features`` the outputs (a tuple) are the output's
    columns in parts of those sizes. Shapes are NumPy's to check here; the op's own checks and messages are the
    library's (shapes/linear_shapes.cc)."""
    _reject_unknown_inputs(LINEAR, feeds)
    return _linear_outputs(_f64(feeds["input"]) @ _f64(feeds["weight"]).T, activation, output_features)


def _linear_outputs(product: np.ndarray, activation: str, output_features: Sequence[int]):
    """Linear's outputs from the products [rows, weight rows]: SiLU(gate) * up with swiglu, then the column parts."""
    if activation == "swiglu":
        gate, up = np.split(product, 2, axis=1)
        product = gate / (1.0 + np.exp(-gate)) * up
    elif activation != "none":
        raise ValueError(f"activation must be none or swiglu, got {activation!r}")
    if not output_features:
        return product
    return tuple(np.split(product, np.cumsum(output_features)[:-1], axis=1))


def quantized_linear_weight(weight: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, in_features: int,
                            element_type) -> np.ndarray:
    """QuantizedLinear's dequantized weight [weight rows, in_features] as float64: each element
    ``element_type((q - zero_point) * scale)`` (one rounding; float32 keeps it exact) from MatMulNBits' 4-bit
    layout, the even element of a byte in its low nibble."""
    values = _centered_codes(weight, zero_points) * scales.astype(np.float64)[..., None]
    return values.reshape(weight.shape[0], -1)[:, :in_features].astype(element_type).astype(np.float64)


def _centered_codes(weight: np.ndarray, zero_points: np.ndarray | None) -> np.ndarray:
    """code - zero point [weight rows, blocks, block_size] (int64) from MatMulNBits' 4-bit layout: two codes a byte,
    the even one in the low nibble; zero points two blocks a byte likewise, 8 where absent."""
    rows, blocks, half_block = weight.shape
    codes = np.stack([weight & 15, weight >> 4], axis=-1).reshape(rows, blocks, 2 * half_block).astype(np.int64)
    if zero_points is None:
        return codes - 8
    zero = np.stack([zero_points & 15, zero_points >> 4], axis=-1).reshape(rows, -1)[:, :blocks].astype(np.int64)
    return codes - zero[..., None]


def quantized_linear(feeds: Feeds, activation: str = "none", output_features: Sequence[int] = (), block_size: int = 32,
                     bits: int = 4, accuracy_level: int = 0):
    """:func:`linear` over :func:`quantized_linear_weight` (the input's element type rounds each weight element); at
    accuracy level 4 with blocks of a multiple of 32, the products of :func:`int8_rows` with the codes instead."""
    _reject_unknown_inputs(QUANTIZED_LINEAR, feeds)
    x = feeds["input"]
    if accuracy_level == QUANTIZED_LINEAR_INT8_LEVEL and block_size % INT8_CHUNK == 0:
        return _linear_outputs(_int8_products(x, feeds["weight"], feeds["scales"], feeds.get("zero_points")),
                               activation, output_features)
    weight = quantized_linear_weight(feeds["weight"], feeds["scales"], feeds.get("zero_points"), x.shape[1], x.dtype)
    return linear({"input": x, "weight": weight}, activation, output_features)


INT8_CHUNK = 32  # input elements per int8 scale
INT8_TINY_CHUNK = np.float32(2.0 ** -100)  # a chunk whose largest magnitude is below this counts as zeros


def int8_rows(x: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """QuantizedLinear's int8 input rows at accuracy level 4: x zero-padded to ``width`` columns, per chunk of 32 the
    largest magnitude m, codes rint(x * fl(127 / m)) and scale fl(m / 127), in fp32; a NaN scale for a chunk with a
    NaN or infinity. Returns codes [rows, width] (int64) and scales [rows, width / 32] (float32)."""
    rows = x.shape[0]
    padded = np.zeros((rows, width), np.float32)
    padded[:, :x.shape[1]] = x.astype(np.float32)
    chunks = padded.reshape(rows, width // INT8_CHUNK, INT8_CHUNK)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        finite = np.isfinite(chunks).all(axis=2)
        largest = np.abs(np.where(finite[..., None], chunks, 0)).max(axis=2)
        used = finite & (largest >= INT8_TINY_CHUNK)
        safe = np.where(used, largest, np.float32(1))
        inverse = (np.float32(127) / safe).astype(np.float32)
        kept = np.where(used[..., None], chunks, np.float32(0))
        codes = np.rint((kept * inverse[..., None]).astype(np.float32)).astype(np.int64)
        scales = np.where(used, (safe / np.float32(127)).astype(np.float32), np.float32(0))
    scales = np.where(finite, scales, np.float32(np.nan)).astype(np.float32)
    return codes.reshape(rows, width), scales


def _int8_products(x, weight, scales, zero_points) -> np.ndarray:
    """Sum over chunks of (q . (code - zero point)) * q_scale * w_scale, exactly in integers and float64."""
    rows, blocks, half_block = weight.shape
    block_size = 2 * half_block
    centered = _centered_codes(weight, zero_points).reshape(rows, blocks * block_size)
    q, q_scale = int8_rows(x, blocks * block_size)
    chunks = blocks * block_size // INT8_CHUNK
    sums = np.einsum("rcj,ncj->rnc", q.reshape(x.shape[0], chunks, INT8_CHUNK), centered.reshape(rows, chunks, INT8_CHUNK))
    w_scale = np.repeat(scales.astype(np.float64), block_size // INT8_CHUNK, axis=1)  # [weight rows, chunks]
    with np.errstate(invalid="ignore"):
        return np.einsum("rnc,rc,nc->rn", sums.astype(np.float64), q_scale.astype(np.float64), w_scale)
