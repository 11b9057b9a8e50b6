"""Replay of accepted speculative prefixes from the compact ``state_update`` capsules
(docs/op-contract.md#gateddeltanet-replay, #conv-capsule-and-replay).

A runtime that verified several drafted tokens in one call and accepted only the first ``n`` of a row
rebuilds that row's state from the **committed** state (the call's ``initial_state``) and the first ``n``
captured transitions. Both functions work in place on NumPy arrays.

The GatedDeltaNet replay uses the CPU rounding (docs/op-contract.md#state-update-rounding): ``S' = fl(S * decay)``,
``p = fl(key * delta)``, ``S = fl(S' + p)``, each a separate float32 operation (NumPy never fuses them).
The CPU kernels evaluate their sequential engine the same way, so the replayed state equals, bit for bit,
the ``final_state`` of the op run on just the accepted prefix.

Values below the normal fp32 range (subnormals) follow IEEE gradual underflow here, as in onnxruntime-genai's
host replay. The CPU kernels flush subnormals while they run (Intel cores are many times slower on them), yet
store the recurrent state exactly as IEEE arithmetic gives it and never record a subnormal decay, key or
delta in the capsule (native/cpu/cpu_kernels.h, ``kExactStateAbove``); so no flushing is needed here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .contract import GdnCapsuleLayout


def _accepted_counts(accepted, batch: int, capacity: int, what: str) -> np.ndarray:
    counts = np.broadcast_to(np.asarray(accepted, dtype=np.int64), (batch,))
    bad = np.flatnonzero((counts < 0) | (counts > capacity))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{what}: accepted[{b}] must be in [0, capacity={capacity}], got {int(counts[b])}")
    return counts


def gdn_capsule_layout(state: np.ndarray, capsule: np.ndarray, capacity: int) -> GdnCapsuleLayout:
    """Derive the capsule layout of a ``[B, Hv, Dv, Dk]`` state and a ``[B, W]`` capsule."""
    if state.ndim != 4:
        raise ValueError(f"replay_gdn: state must be [batch, num_heads_v, head_size_v, head_size_qk], got shape "
                         f"{list(state.shape)}")
    batch, hv, dv, dk = state.shape
    if capsule.ndim != 2 or capsule.shape[0] != batch:
        raise ValueError(f"replay_gdn: capsule must be [batch={batch}, width], got shape {list(capsule.shape)}")
    if capacity <= 0 or capsule.shape[1] % capacity:
        raise ValueError(f"replay_gdn: capsule width {capsule.shape[1]} is not a multiple of capacity {capacity}")
    per_slot = capsule.shape[1] // capacity
    key_block = per_slot - hv - hv * dv
    if key_block <= 0 or key_block % dk:
        raise ValueError(
            f"replay_gdn: capsule width {capsule.shape[1]} does not fit capacity {capacity} x (Hv {hv} + Hk x Dk {dk}"
            f" + Hv x Dv {hv * dv}) for any key head count")
    hk = key_block // dk
    if hv % hk:
        raise ValueError(f"replay_gdn: num_heads_v ({hv}) must be a multiple of the capsule's key heads ({hk})")
    return GdnCapsuleLayout(capacity, hv, hk, dk, dv)


def replay_gdn(state: np.ndarray, capsule: np.ndarray, accepted: Sequence[int] | int, capacity: int) -> np.ndarray:
    """Replay the first ``accepted[b]`` GatedDeltaNet transitions of each row onto ``state`` in place.

    ``state``: float32 ``[B, Hv, Dv, Dk]`` (V-major), the committed state of the verifying call.
    ``capsule``: float32 ``[B, C*(Hv + Hk*Dk + Hv*Dv)]``, that call's ``state_update``.
    """
    if state.dtype != np.float32 or capsule.dtype != np.float32:
        raise TypeError(f"replay_gdn: state and capsule must be float32, got {state.dtype} and {capsule.dtype}")
    layout = gdn_capsule_layout(state, capsule, capacity)
    counts = _accepted_counts(accepted, state.shape[0], capacity, "replay_gdn")
    key_head = np.arange(layout.num_heads_v) // (layout.num_heads_v // layout.num_heads_k)
    for b in range(state.shape[0]):
        decay, key, delta = layout.split(capsule[b])
        s = state[b]
        for t in range(counts[b]):
            s *= decay[t][:, None, None]
            s += delta[t][:, :, None] * key[t][key_head][:, None, :]
    return state


def replay_conv(state: np.ndarray, capsule: np.ndarray, accepted: Sequence[int] | int) -> np.ndarray:
    """Replay the first ``accepted[b]`` conv transitions (shift left by one, append the captured row) in place.

    ``state``: ``[B, Ch, SL]``; ``capsule``: ``[B, cap, Ch]`` of the same dtype (the conv's ``state_update``).
    """
    if state.ndim != 3 or capsule.ndim != 3 or capsule.shape[0] != state.shape[0] or capsule.shape[2] != state.shape[1]:
        raise ValueError(f"replay_conv: state must be [B, Ch, SL] and capsule [B, cap, Ch]; got {list(state.shape)} "
                         f"and {list(capsule.shape)}")
    if capsule.dtype != state.dtype:
        raise TypeError(f"replay_conv: capsule dtype {capsule.dtype} must equal state dtype {state.dtype}")
    counts = _accepted_counts(accepted, state.shape[0], capsule.shape[1], "replay_conv")
    sl = state.shape[2]
    if sl == 0:
        return state
    for b in range(state.shape[0]):
        n = int(counts[b])
        if n == 0:
            continue
        # After n shifts the newest n samples are the captured rows, preceded by the old state's tail.
        keep = max(sl - n, 0)
        state[b, :, :keep] = state[b, :, sl - keep:]
        state[b, :, keep:] = capsule[b, n - (sl - keep):n].T
    return state
