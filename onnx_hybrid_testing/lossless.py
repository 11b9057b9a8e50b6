"""Is speculative decoding through one implementation of the state ops lossless? Single-op experiments.

onnxruntime-genai's Engine verifies ``N = C + 1`` tokens per request in one call with capture, then either
publishes that call's state (all drafts accepted) or replays the first ``k`` captured transitions onto the
committed state. Decoding with drafts gives the tokens of plain decoding only if, bit for bit,

* the verify call's output row ``t`` equals the output of plain one-token step ``t`` (accepted tokens' logits),
* its ``final_state`` equals the state after ``N`` plain steps, and
* the replay of ``k`` captured transitions equals the state after ``k`` plain steps,

and if a row's bits do not depend on what else shares the call (the Engine's batches differ between the two
runs). :func:`run_experiments` measures each of these for one op, one implementation (a :class:`Runner`:
ours under ``onnx_hybrid``, or ORT's own ``com.microsoft`` kernels), one dtype, plus the probes that locate a
difference: the token count per row, the ``chunk_size`` attribute, capture on or off, a long prefill row in the
same call, and the capsule's contents against what one-token steps capture.

The GatedDeltaNet replay is evaluated with both roundings of the state update that exist:
``onnx_hybrid.ops.replay`` (unfused multiply and add: our CPU kernels, ORT's CPU kernel, onnxruntime-genai's
host replay) and :func:`replay_gdn_fused` (the product-and-add as one fused multiply-add, the CUDA rule).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from onnx_hybrid.ops import contract, replay
from .cases import random_conv_case, random_gdn_case

GDN = contract.GATED_DELTA_NET.name
CONV = contract.VARLEN_CAUSAL_CONV.name
IMPLEMENTATIONS = {"ours": contract.DOMAIN, "ort": contract.MS_DOMAIN}

# Geometries: the 0.8B model's linear layers (conv over q, k and v: 2*16*128 + 16*128 channels), and a small one.
GEOMETRIES = {
    "0.8b": dict(gdn=dict(num_heads_q=16, num_heads_v=16, head_size_k=128, head_size_v=128), channels=6144,
                 kernel_size=4),
    "small": dict(gdn=dict(num_heads_q=2, num_heads_v=4, head_size_k=32, head_size_v=16), channels=96, kernel_size=4),
}
# Prompt rows that share a call with the decode rows. On CUDA a call takes the chunked engine when T >= 32 B (ORT's
# rule, and ours): with 4 one-token rows, a 40-token prompt is chunked alone but not in the mixed call, a 200-token
# prompt is chunked in both.
PREFILL_TOKENS = (40, 200)
_TOKEN_MAJOR = {"query", "key", "value", "decay", "beta", "input"}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass
class Check:
    """One comparison: ``got`` (what the speculative path gives) against ``want`` (what plain decoding gives)."""

    op: str
    impl: str
    dtype: str
    check: str
    item: str
    equal: bool
    max_abs: float
    max_rel: float  # max |got - want| / max |want|: the difference against the tensor's scale
    max_ulp: int  # in the element type; large where a value near zero absorbed a rounding of bigger terms
    differing: float  # fraction of elements whose bits differ

    def as_dict(self) -> dict:
        """JSON-ready: NaN (a probe that failed to run) becomes None."""
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in asdict(self).items()}


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between same-typed float arrays (0 where the bits are equal)."""
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance: dtypes differ ({a.dtype} and {b.dtype})")
    width = a.dtype.itemsize
    sign = np.int64(1) << (8 * width - 1)

    def ordered(x):
        bits = np.ascontiguousarray(x).view(_UINT[width]).astype(np.int64)
        return np.where(bits & sign, sign - bits, bits)  # negative floats below zero, monotone in value

    return np.abs(ordered(a) - ordered(b))


def compare(a: np.ndarray, b: np.ndarray) -> tuple[bool, float, float, int, float]:
    """(bitwise equal, max |a - b|, that over max |b|, max ulp distance, fraction of differing elements)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"compare: shapes differ ({list(a.shape)} and {list(b.shape)})")
    if a.size == 0:
        return True, 0.0, 0.0, 0, 0.0
    ulps = ulp_distance(a, b)
    diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
    scale = float(np.abs(b.astype(np.float64)).max())
    return (bool(not ulps.any()), diff, diff / scale if scale else diff, int(ulps.max()),
            float(np.count_nonzero(ulps) / ulps.size))


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fl32(a * b + c) rounded once, for float32 operands (CUDA's ``__fmaf_rn``).

    The product is exact in float64; the sum is rounded to float64 by round-to-odd (53 >= 24 + 2 bits), which
    makes the final rounding to float32 correct rather than double-rounded."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = np.broadcast_to(c, p.shape).astype(np.float64)
    s = p + c
    v = s - p
    err = (p - (s - v)) + (c - v)  # TwoSum: s + err == p + c exactly
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def replay_gdn_fused(state: np.ndarray, capsule: np.ndarray, accepted: int, capacity: int) -> np.ndarray:
    """``replay.replay_gdn`` with the CUDA rounding: ``S = fma(key, delta, fl(S * decay))`` (in place)."""
    layout = replay.gdn_capsule_layout(state, capsule, capacity)
    key_head = np.arange(layout.num_heads_v) // (layout.num_heads_v // layout.num_heads_k)
    for b in range(state.shape[0]):
        decay, key, delta = layout.split(capsule[b])
        s = state[b]
        for t in range(accepted):
            decayed = s * decay[t][:, None, None]
            s[...] = fma_f32(key[t][key_head][:, None, :], delta[t][:, :, None], decayed)
    return state


class Runner:
    """Runs one-node models of an implementation on a provider; sessions are cached by model signature."""

    def __init__(self, impl: str, provider: str = "cpu"):
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {sorted(IMPLEMENTATIONS)}, got {impl!r}")
        if provider not in ("cpu", "cuda"):
            raise ValueError(f"provider must be cpu or cuda, got {provider!r}")
        self.impl, self.provider, self.domain = impl, provider, IMPLEMENTATIONS[impl]
        self._sessions: dict = {}

    def _session(self, op: str, feeds: dict, attrs: dict):
        import onnxruntime as ort

        from onnx_hybrid.ops import library
        from . import single_op

        model = single_op.single_op_model(op, feeds, attrs, domain=self.domain)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        if self.impl == "ours":
            library.register(options)
        if self.provider == "cpu":
            return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN libraries from the nvidia-* wheels, if that is where they are
            ort.preload_dlls()
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # every node on the GPU
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CUDAExecutionProvider"])
        if session.get_providers()[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"the CUDA EP did not initialise; ORT runs {session.get_providers()}")
        return session

    def __call__(self, op: str, feeds: dict, attrs: dict) -> dict:
        from . import single_op

        feeds = {k: v for k, v in feeds.items() if v is not None}
        key = (op, tuple(sorted(attrs.items())), tuple((k, v.dtype.str, v.shape) for k, v in sorted(feeds.items())))
        if key not in self._sessions:
            self._sessions[key] = self._session(op, feeds, attrs)
        return single_op.run_session(self._sessions[key], feeds)


@dataclass
class _Spec:
    """An op's offsets input, and whether it has ``state_update_active``."""

    offsets: str
    has_active: bool


_SPECS = {GDN: _Spec("cu_seqlens", True), CONV: _Spec("cumulative_sequence_length", False)}


def _call_feeds(spec: _Spec, base: dict, rows: Sequence[np.ndarray], state: np.ndarray, capture: Sequence[int],
                active: int | None) -> dict:
    """Feeds of one call: request b takes the token rows ``rows[b]`` of ``base`` and its state ``state[b]``."""
    index = np.concatenate(rows)
    feeds = {k: (v[index] if k in _TOKEN_MAJOR else v) for k, v in base.items()}
    feeds[spec.offsets] = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    feeds["initial_state"] = np.ascontiguousarray(state)
    feeds["capture_count"] = np.asarray(capture, np.int32)
    if spec.has_active:
        feeds["state_update_active"] = None if active is None else np.asarray([active], np.int32)
    return feeds


def _case(op: str, rng, lengths, dtype: str, geometry: dict, capacity: int):
    if op == GDN:
        return random_gdn_case(rng, lengths, dtype=dtype, capacity=capacity, **geometry["gdn"])
    return random_conv_case(rng, lengths, dtype=dtype, capacity=capacity, channels=geometry["channels"],
                            kernel_size=geometry["kernel_size"])


def _join(op: str, a: dict, b: dict) -> dict:
    """The feeds of two cases' requests in one call (a's requests first)."""
    spec = _SPECS[op]
    out = {}
    for k, v in a.items():
        if k in _TOKEN_MAJOR or k in ("initial_state", "capture_count"):
            out[k] = np.concatenate([v, b[k]])
        elif k == spec.offsets:
            out[k] = np.concatenate([v, b[k][1:] + v[-1]]).astype(np.int32)
        else:
            out[k] = v
    return out


def _last_row(spec: _Spec, feeds: dict, row: int) -> dict:
    """The feeds of request ``row`` (the last one) of a call, alone in its own call."""
    first = int(feeds[spec.offsets][row])
    out = {k: (v[first:] if k in _TOKEN_MAJOR else v[row:] if k in ("initial_state", "capture_count") else v)
           for k, v in feeds.items()}
    out[spec.offsets] = np.array([0, int(feeds[spec.offsets][-1]) - first], np.int32)
    return out


def run_experiments(op: str, run: Callable[[str, dict, dict], dict], dtype: str, *, geometry: dict,
                    requests: int = 4, tokens: int = 4, seed: int = 0, prefill_tokens: Sequence[int] = PREFILL_TOKENS,
                    chunk_sizes: Sequence[int] = (1, 2)) -> list[Check]:
    """Every check for ``op`` run by ``run`` (a :class:`Runner`) in ``dtype`` (float, float16, bfloat16).

    ``requests`` requests of ``tokens`` = C + 1 tokens each (capacity C = ``tokens``, so that every verify token is
    captured), each with its own initial state."""
    spec = _SPECS[op]
    impl = getattr(run, "impl", "?")
    rng = np.random.default_rng(seed)
    B, N, C = requests, tokens, tokens
    case = _case(op, rng, [N] * B, dtype, geometry, C)
    base, attrs = case.feeds, case.attributes
    s0 = base["initial_state"]
    start = np.arange(B) * N
    checks: list[Check] = []

    def record(check, item, got, want):
        checks.append(Check(op, impl, dtype, check, item, *compare(got, want)))

    def call(rows, state, capture, active, attributes=None):
        return run(op, _call_feeds(spec, base, rows, state, capture, active), attributes or attrs)

    def token_rows(n):
        return [np.arange(s, s + n) for s in start]

    def step_rows(t):
        return [np.array([s + t]) for s in start]

    def rows_of(output, n, t):
        """Row t of every request in an output of n tokens per request."""
        return output[np.arange(B) * n + t]

    # Plain decoding: N one-token steps of the batch, the state fed back; no capture (the Engine's active = 0).
    outs, states, state = [], [], s0
    for t in range(N):
        r = call(step_rows(t), state, [0] * B, 0)
        outs.append(r["output"])
        state = r["final_state"]
        states.append(state)

    verify = call(token_rows(N), s0, [C] * B, 1)
    for t in range(N):
        record("verify output row vs plain step", f"t={t}", rows_of(verify["output"], N, t), outs[t])
    record("verify final_state vs plain state", f"S{N}", verify["final_state"], states[-1])

    # Replay of the capsule for each accepted prefix, against the plain state after as many steps.
    for k in range(1, C + 1):
        if op == GDN:
            got = replay.replay_gdn(s0.copy(), verify["state_update"], k, C)
            record("replay (unfused, CPU rule) vs plain state", f"k={k}", got, states[k - 1])
            got = replay_gdn_fused(s0.copy(), verify["state_update"], k, C)
            record("replay (fused fma, CUDA rule) vs plain state", f"k={k}", got, states[k - 1])
        else:
            got = replay.replay_conv(s0.copy(), verify["state_update"], k)
            record("replay vs plain state", f"k={k}", got, states[k - 1])

    def repeat():
        """The same calls again: a kernel that is not run-to-run deterministic cannot be lossless."""
        again = call(token_rows(N), s0, [C] * B, 1)
        for port in ("output", "final_state", "state_update"):
            record("verify repeated: same bits", port, again[port], verify[port])
        r = call(step_rows(0), s0, [0] * B, 0)
        record("plain step repeated: same bits", "output", r["output"], outs[0])
        record("plain step repeated: same bits", "final_state", r["final_state"], states[0])

    def token_counts():
        """The first n tokens of each request in one call."""
        for n in range(1, N):
            r = call(token_rows(n), s0, [min(n, C)] * B, 1)
            for t in range(n):
                record(f"{n}-token call output row vs plain step", f"t={t}", rows_of(r["output"], n, t), outs[t])
            record(f"{n}-token call final_state vs plain state", f"S{n}", r["final_state"], states[n - 1])

    def ragged_verify():
        """The Engine's verify: request b drafts k_b = n_b - 1 tokens and captures them, so one-token rows share
        the call with longer ones."""
        lengths = [N - (b % N) for b in range(B)]
        r = call([np.arange(s, s + n) for s, n in zip(start, lengths)], s0, [n - 1 for n in lengths], 1)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for b, n in enumerate(lengths):
            for t in range(n):
                record("ragged verify output row vs plain step", f"b={b} n={n} t={t}", r["output"][offsets[b] + t],
                       outs[t][b])
            record("ragged verify final_state vs plain state", f"b={b} S{n}", r["final_state"][b], states[n - 1][b])

    step_capsules = []

    def capture_switch():
        """Capture on or off in the verify call, and in the plain steps (which then capture their one token)."""
        r = call(token_rows(N), s0, [0] * B, 0)
        record("verify without capture: output vs with capture", "all rows", r["output"], verify["output"])
        record("verify without capture: final_state vs with capture", f"S{N}", r["final_state"],
               verify["final_state"])
        for t in range(N):
            r = call(step_rows(t), s0 if t == 0 else states[t - 1], [1] * B, 1)
            record("plain step with capture: output vs without", f"t={t}", r["output"], outs[t])
            record("plain step with capture: final_state vs without", f"S{t + 1}", r["final_state"], states[t])
            step_capsules.append(r["state_update"])

    def capsule_contents():
        """Slot t of the verify call's capsule against slot 0 of plain step t's."""
        if len(step_capsules) != N:
            raise RuntimeError("the plain steps with capture did not run")
        for t in range(N):
            if op == GDN:
                layout = replay.gdn_capsule_layout(s0, verify["state_update"], C)
                for b in range(B):
                    got = layout.split(verify["state_update"][b])
                    want = layout.split(step_capsules[t][b])
                    for name, g, w in zip(("decay", "key", "delta"), got, want):
                        record(f"capsule {name} slot vs one-token step's", f"t={t} b={b}", g[t], w[0])
            else:
                record("capsule slot vs one-token step's", f"t={t}", verify["state_update"][:, t],
                       step_capsules[t][:, 0])
                record("capsule slot vs the token's input row", f"t={t}", verify["state_update"][:, t],
                       base["input"][start + t])

    def request_alone():
        """Each request alone in its own call, step by step."""
        for t in range(N):
            for b in range(B):
                prev = s0[b:b + 1] if t == 0 else states[t - 1][b:b + 1]
                r = run(op, _call_feeds(spec, base, [np.array([start[b] + t])], prev, [0], 0), attrs)
                record("request alone vs in the batch: output", f"t={t} b={b}", r["output"], outs[t][b:b + 1])
                record("request alone vs in the batch: final_state", f"S{t + 1} b={b}", r["final_state"],
                       states[t][b:b + 1])

    def prefill_neighbour():
        """A prefill row (no capture) in the same call as the decode rows, and as the verify rows; and that prefill
        row alone against it next to the decode rows (the same weights and gates: a row of the mixed call)."""
        for length in prefill_tokens:
            prompt = _case(op, rng, [length], dtype, geometry, C).feeds
            prompt["capture_count"] = np.zeros(1, np.int32)
            for label, n, capture, active, want_out, want_state in (
                    ("decode rows + a prefill row", 1, 0, 0, outs[0], states[0]),
                    ("verify rows + a prefill row", N, C, 1, verify["output"], verify["final_state"])):
                feeds = _join(op, _call_feeds(spec, base, token_rows(n), s0, [capture] * B, active), prompt)
                r = run(op, feeds, attrs)
                record(f"{label}: output", f"prefill {length} tokens", r["output"][:B * n], want_out)
                record(f"{label}: final_state", f"prefill {length} tokens", r["final_state"][:B], want_state)
                if n == 1:
                    alone = run(op, _last_row(spec, feeds, B), attrs)
                    record("prefill row next to decode rows vs alone: output", f"prefill {length} tokens",
                           r["output"][B * n:], alone["output"])
                    record("prefill row next to decode rows vs alone: final_state", f"prefill {length} tokens",
                           r["final_state"][B:], alone["final_state"])

    def chunk_size_hint():
        """The chunk_size attribute (a tuning hint): the verify call under other values."""
        for size in chunk_sizes:
            r = call(token_rows(N), s0, [C] * B, 1, dict(attrs, chunk_size=size))
            record("verify with chunk_size: output vs default", f"chunk_size={size}", r["output"], verify["output"])
            record("verify with chunk_size: final_state vs default", f"chunk_size={size}", r["final_state"],
                   verify["final_state"])

    probes = [repeat, token_counts, ragged_verify, capture_switch, capsule_contents, request_alone]
    probes += [prefill_neighbour] if prefill_tokens else []
    probes += [chunk_size_hint] if op == GDN else []
    for probe in probes:
        try:
            probe()
        except Exception as error:  # one probe the implementation refuses must not hide the others' findings
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            checks.append(Check(op, impl, dtype, f"probe {probe.__name__}", f"ERROR {type(error).__name__}: "
                                f"{message[:200]}", False, float("nan"), float("nan"), -1, float("nan")))
    return checks


def summarize(checks: Sequence[Check]) -> list[dict]:
    """One row per (op, impl, dtype, check): how many items were bitwise equal, and the worst difference."""
    groups: dict = {}
    for c in checks:
        groups.setdefault((c.op, c.impl, c.dtype, c.check), []).append(c)
    rows = []
    for (op, impl, dtype, check), items in groups.items():
        worst = max(items, key=lambda c: (c.max_rel, c.max_abs))
        rows.append(dict(op=op, impl=impl, dtype=dtype, check=check, equal=sum(c.equal for c in items),
                         items=len(items), max_abs=max(c.max_abs for c in items),
                         max_rel=max(c.max_rel for c in items),
                         max_ulp=max(c.max_ulp for c in items), differing=max(c.differing for c in items),
                         worst=worst.item if not worst.equal else ""))
    return rows


DTYPE_NAMES = {"fp32": "float", "fp16": "float16", "bf16": "bfloat16"}  # command-line name -> contract name
