"""CUDA kernels on a GPU against the float64 reference (docs/op-contract.md#tolerances), FLA where it applies, and the
bitwise rules: capsule replay, decode rows independent of the batch, malformed offsets contained.

Tolerances (max |ours - ref| over max(|ref|, 1)): fp32 recurrent 1e-4 (fp32 arithmetic, accurate expf);
fp16 I/O 5e-3 recurrent (output rounding) and 3e-2 chunked (fp16 tensor-core operands, ORT's own tolerance);
bf16 I/O 2e-2 recurrent (bf16 output rounding is 4e-3) and 3e-2 chunked. Outputs are poisoned with NaN first,
so an unwritten element fails.
"""

import numpy as np
import pytest

from onnx_hybrid.ops import contract, library, reference
from onnx_hybrid_testing.cases import offsets, random_conv_case, random_gdn_case


def _cuda_ready() -> bool:
    try:
        import cupy
        import torch

        return cupy.cuda.runtime.getDeviceCount() > 0 and torch.cuda.is_available()
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA GPU with CuPy and torch")

if _cuda_ready():
    import ml_dtypes
    import torch

    from onnx_hybrid import cuda_ops

TORCH_TYPES = {}
if _cuda_ready():
    TORCH_TYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                   np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.int32): torch.int32}


def to_gpu(x):
    if x is None:
        return None
    x = np.ascontiguousarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(x).cuda()


def to_host(t) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def poisoned(shape, dtype):
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device="cuda")


def run_gdn(case, engine="auto", feeds=None, **knobs):
    feeds = dict(case.feeds if feeds is None else feeds)
    attrs = contract.resolve_attributes(contract.GATED_DELTA_NET, case.attributes)
    geo = contract.resolve_gdn({k: (None if v is None else np.shape(v)) for k, v in feeds.items()}, attrs)
    dev = {k: (v if k == "state_update_active" else to_gpu(v)) for k, v in feeds.items()}
    act = TORCH_TYPES[np.dtype(feeds["query"].dtype)]
    outs = {"output": poisoned(geo.output_shape, act),
            "final_state": poisoned(geo.state_shape, torch.float32),
            "state_update": poisoned((geo.batch, geo.capsule_width), torch.float32)}
    out, state, capsule = cuda_ops.gated_delta_net(dev, outputs=outs, engine=engine, **knobs, **case.attributes)
    torch.cuda.synchronize()
    return to_host(out).astype(np.float64), to_host(state), to_host(capsule)


def rel_err(ours, ref):
    """max |ours - ref| / max(|ref|, 1), in float64 whatever the inputs' types."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1.0)) if ref.size else 0.0


def check_gdn(case, tol, engine="auto"):
    out, state, capsule = run_gdn(case, engine)
    ref_out, ref_state, ref_capsule = reference.gated_delta_net(case.feeds, **case.attributes)
    e_out, e_state = rel_err(out, ref_out), rel_err(state, ref_state)
    assert np.isfinite(out).all() and np.isfinite(state).all() and np.isfinite(capsule).all()
    assert e_out <= tol and e_state <= tol, f"{case.describe()}: output {e_out:.2e}, state {e_state:.2e}"
    if ref_capsule.size:
        # the captured prefix within tolerance; every slot the reference leaves zero is exactly zero here
        assert np.all(capsule[ref_capsule == 0] == 0)
        assert rel_err(capsule, ref_capsule) <= tol
    return e_out, e_state


D128 = dict(num_heads_q=2, num_heads_v=4, head_size_k=128, head_size_v=128)

GDN_CONFIGS = [
    # (id, case kwargs, tolerance, engine)
    ("f32-ragged", dict(lengths=(5, 9)), 1e-4, "auto"),
    ("f16-ragged", dict(lengths=(5, 9), dtype="float16"), 5e-3, "auto"),
    ("bf16-ragged", dict(lengths=(5, 9), dtype="bfloat16"), 2e-2, "auto"),
    ("gva3-dk32-dv16", dict(lengths=(3, 1, 7), num_heads_q=2, num_heads_v=6, head_size_k=32, head_size_v=16),
     1e-4, "auto"),
    ("gva1-dk64-dv32", dict(lengths=(12, 4), num_heads_q=2, num_heads_v=2, head_size_k=64, head_size_v=32), 1e-4,
     "auto"),
    ("dk128-dv64-f16", dict(lengths=(40, 150), num_heads_q=1, num_heads_v=2, head_size_k=128, head_size_v=64,
                            dtype="float16"), 5e-3, "auto"),
    ("dv1", dict(lengths=(6, 3), head_size_k=64, head_size_v=1), 1e-4, "auto"),
    ("dk256", dict(lengths=(10,), num_heads_q=1, num_heads_v=2, head_size_k=256, head_size_v=64), 1e-4, "auto"),
    ("dk40-odd", dict(lengths=(7, 2), head_size_k=40, head_size_v=24), 1e-4, "auto"),
    ("chunk-63", dict(lengths=(63,), dtype="float16", **D128), 3e-2, "chunked"),
    ("chunk-64", dict(lengths=(64,), dtype="float16", **D128), 3e-2, "chunked"),
    ("chunk-65", dict(lengths=(65,), dtype="float16", **D128), 3e-2, "chunked"),
    ("chunk-130", dict(lengths=(130,), dtype="float16", **D128), 3e-2, "chunked"),
    ("chunk-ragged-bf16", dict(lengths=(40, 150, 200), dtype="bfloat16", **D128), 3e-2, "auto"),
    ("chunk-mixed-short", dict(lengths=(300, 17, 64), dtype="float16", num_heads_q=2, num_heads_v=6,
                               head_size_k=128, head_size_v=128), 3e-2, "chunked"),
    ("chunk-gva3", dict(lengths=(200,), dtype="float16", num_heads_q=1, num_heads_v=3, head_size_k=128,
                        head_size_v=128), 3e-2, "auto"),
    ("chunk-linear", dict(lengths=(100,), dtype="float16", update_rule="linear", gate_activation="none", **D128),
     3e-2, "chunked"),
    ("chunk-gated", dict(lengths=(100,), dtype="float16", update_rule="gated", **D128), 3e-2, "chunked"),
    ("chunk-delta", dict(lengths=(100,), dtype="float16", update_rule="delta", gate_activation="none", **D128),
     3e-2, "chunked"),
    ("chunk-no-norm-explicit-scale", dict(lengths=(96,), dtype="float16", qk_l2_norm=0, gate_activation="none",
                                          beta_activation="none", scale=0.5, **D128), 3e-2, "chunked"),
    ("chunk-no-state", dict(lengths=(128,), dtype="float16", with_state=False, **D128), 3e-2, "chunked"),
    ("chunk-1000-gva1-bf16", dict(lengths=(1000,), dtype="bfloat16", num_heads_q=2, num_heads_v=2, head_size_k=128,
                                  head_size_v=128), 3e-2, "chunked"),
    ("chunk-8191", dict(lengths=(8191,), dtype="float16", num_heads_q=1, num_heads_v=2, head_size_k=128,
                        head_size_v=128), 3e-2, "auto"),
    ("chunk-uniform", dict(lengths=(100, 100), layout="uniform", dtype="float16", **D128), 3e-2, "chunked"),
    ("chunk-packed", dict(lengths=(70, 90), layout="packed", dtype="bfloat16", **D128), 3e-2, "chunked"),
    ("rec-linear", dict(lengths=(9, 4), update_rule="linear", gate_activation="none"), 1e-4, "auto"),
    ("rec-gated-none", dict(lengths=(9, 4), update_rule="gated", gate_activation="none"), 1e-4, "auto"),
    ("rec-delta-nonorm", dict(lengths=(9, 4), update_rule="delta", gate_activation="none", qk_l2_norm=0,
                              beta_activation="none", scale=-0.3), 1e-4, "auto"),
    ("per-key-decay", dict(lengths=(8, 5), per_key_decay=True), 1e-4, "auto"),
    ("uniform", dict(lengths=(6, 6), layout="uniform"), 1e-4, "auto"),
    ("rank4", dict(lengths=(5, 5, 5), layout="rank4"), 1e-4, "auto"),
    ("packed", dict(lengths=(4, 9), layout="packed"), 1e-4, "auto"),
    ("packed-uniform", dict(lengths=(3, 3), layout="packed_uniform"), 1e-4, "auto"),
    ("packed-rank3-f16", dict(lengths=(2, 2), layout="packed_rank3", dtype="float16"), 5e-3, "auto"),
    ("zero-length-middle", dict(lengths=(3, 0, 5)), 1e-4, "auto"),
    ("capture-clamps", dict(lengths=(3, 5, 1), capacity=4, capture=(-1, 9, 2)), 1e-4, "auto"),
    ("capture-active-0", dict(lengths=(3, 5, 1), capacity=4, capture=(2, 9, 2), active=0), 1e-4, "auto"),
    ("capture-active-1", dict(lengths=(3, 5, 1), capacity=4, capture=(2, 9, 2), active=1), 1e-4, "auto"),
    ("capture-chunked-rows", dict(lengths=(70, 40, 5), capacity=8, capture=(0, 4, 8), dtype="float16", **D128),
     3e-2, "chunked"),
    ("capture-off-chunked", dict(lengths=(70, 40), capacity=8, capture=(3, 4), active=0, dtype="float16", **D128),
     3e-2, "chunked"),
]


@pytest.mark.parametrize("name,kwargs,tol,engine", GDN_CONFIGS, ids=[c[0] for c in GDN_CONFIGS])
def test_gdn_matches_reference(name, kwargs, tol, engine):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    check_gdn(random_gdn_case(rng, **kwargs), tol, engine)


def test_zero_length_row_keeps_its_state_bitwise():
    case = random_gdn_case(np.random.default_rng(1), lengths=(3, 0, 5))
    _, state, _ = run_gdn(case)
    assert np.array_equal(state[1], case.feeds["initial_state"][1])


def _prefix_case(case, n):
    """The same rows cut to their first n tokens (ragged layout)."""
    lengths = case.lengths
    cu = offsets(lengths)
    keep = np.concatenate([np.arange(cu[b], cu[b] + min(n, lengths[b])) for b in range(len(lengths))])
    feeds = {}
    for k, v in case.feeds.items():
        if k in ("query", "key", "value", "decay", "beta"):
            feeds[k] = v[keep]
        elif k in ("capture_count", "state_update_active"):
            continue
        else:
            feeds[k] = v
    feeds["cu_seqlens"] = offsets([min(n, length) for length in lengths])
    attrs = {k: v for k, v in case.attributes.items() if k != "state_update_capacity"}
    return feeds, attrs


@pytest.mark.parametrize("shape", ["small", "d128"])
def test_capsule_replay_is_bitwise(shape):
    kw = dict(lengths=(8, 8, 8), capacity=8, capture=(0, 4, 8))
    engine = "auto"
    if shape == "d128":  # row 0 runs chunked, the captured rows in the tail pass
        kw.update(dtype="float16", lengths=(40, 8, 36), **D128)
        engine = "chunked"
    case = random_gdn_case(np.random.default_rng(7), **kw)
    _, final, capsule = run_gdn(case, engine=engine)
    m = [contract.captured_prefix(c, 8, n) for c, n in zip(case.feeds["capture_count"], case.lengths)]
    for n in range(1, 9):
        feeds, attrs = _prefix_case(case, n)
        short = type(case)(feeds=feeds, attributes=attrs, lengths=case.lengths)
        _, short_state, _ = run_gdn(short, engine="recurrent")
        accepted = [min(n, mb) for mb in m]
        state = to_gpu(case.feeds["initial_state"].copy())
        cuda_ops.replay_gdn(state, to_gpu(capsule), accepted, 8)
        torch.cuda.synchronize()
        replayed = to_host(state)
        for b in range(3):
            if n <= m[b]:
                assert np.array_equal(replayed[b], short_state[b]), f"row {b}, prefix {n}"
            if n == m[b] == case.lengths[b]:
                assert np.array_equal(replayed[b], final[b])


def test_decode_row_in_mixed_batch_is_bitwise_alone():
    rng = np.random.default_rng(3)
    case = random_gdn_case(rng, lengths=(64, 1), dtype="float16", **D128)
    out, state, _ = run_gdn(case, engine="auto")
    alone = {k: v for k, v in case.feeds.items()}
    for k in ("query", "key", "value", "decay", "beta"):
        alone[k] = case.feeds[k][64:65]
    alone["cu_seqlens"] = offsets([1])
    alone["initial_state"] = case.feeds["initial_state"][1:2]
    a_out, a_state, _ = run_gdn(type(case)(feeds=alone, attributes=case.attributes, lengths=[1]))
    assert np.array_equal(out[64:65], a_out) and np.array_equal(state[1:2], a_state)
    # a batch of only decode rows next to long rows: the decode rows do not see the long ones
    case2 = random_gdn_case(rng, lengths=(1, 200, 1, 1, 150), dtype="float16", **D128)
    out2, state2, _ = run_gdn(case2, engine="auto")
    decode = {k: v for k, v in case2.feeds.items()}
    rows = [0, 201, 202]
    for k in ("query", "key", "value", "decay", "beta"):
        decode[k] = case2.feeds[k][rows]
    decode["cu_seqlens"] = offsets([1, 1, 1])
    decode["initial_state"] = case2.feeds["initial_state"][[0, 2, 3]]
    d_out, d_state, _ = run_gdn(type(case2)(feeds=decode, attributes=case2.attributes, lengths=[1, 1, 1]))
    assert np.array_equal(out2[rows], d_out) and np.array_equal(state2[[0, 2, 3]], d_state)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scan_width_does_not_change_results(dtype):
    """Each scan warp computes its 16 value rows alone, so the narrow and the wide scan give bitwise the same
    output, state and capsule (rows ending at different points of their last chunk, a captured row, a short
    row)."""
    case = random_gdn_case(np.random.default_rng(31), lengths=(200, 77, 64, 40, 5, 130), capacity=4,
                           capture=(0, 0, 0, 2, 0, 0), dtype=dtype, **D128)
    narrow, wide = (run_gdn(case, engine="chunked", scan_width=w) for w in (64, 128))  # the two instantiated widths
    ref_out, ref_state, _ = reference.gated_delta_net(case.feeds, **case.attributes)
    assert rel_err(wide[0], ref_out) <= 3e-2 and rel_err(wide[1], ref_state) <= 3e-2
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(narrow, wide))


# decay and beta in the activation type: each kernel that reads them (the recurrent prologue, its decode loop, the
# per-key decay, the chunked prep), with capture.
GATE_RUNS = [("recurrent", dict(lengths=(1, 4, 9, 3), capacity=4, capture=(1, 4, 2, 3))),
             ("recurrent", dict(lengths=(1, 1, 1), rec_rows=4)),
             ("recurrent", dict(lengths=(5, 40), per_key_decay=True)),
             ("chunked", dict(lengths=(200, 77, 40, 5))),
             ("auto", dict(lengths=(64, 3, 33), capacity=2, capture=(0, 2, 1)))]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("engine,kwargs", GATE_RUNS, ids=[f"{e}-{i}" for i, (e, _) in enumerate(GATE_RUNS)])
def test_gates_in_the_activation_type_equal_fp32_gates(dtype, engine, kwargs):
    """docs/op-contract.md#gateddeltanet-inputs-and-outputs: the kernels widen decay and beta given in the activation
    type on load, as a Cast node before the op would: output, state and capsule equal those of the same values in
    fp32, bit for bit."""
    kwargs = dict(kwargs)
    knobs = {k: kwargs.pop(k) for k in ("rec_rows",) if k in kwargs}
    case = random_gdn_case(np.random.default_rng(41), dtype=dtype, **kwargs, **D128)
    narrow = {k: case.feeds[k].astype(case.feeds["query"].dtype) for k in ("decay", "beta")}
    got = run_gdn(case, engine, feeds={**case.feeds, **narrow}, **knobs)
    want = run_gdn(case, engine, feeds={**case.feeds, **{k: v.astype(np.float32) for k, v in narrow.items()}},
                   **knobs)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


# Recurrent launch shapes (value rows per warp, row groups per warp): one group per warp, and warps that walk
# several groups with the next group's state loaded ahead.
REC_SHAPES = [(4, 1), (8, 4), (8, 2), (4, 4), (2, 8), (1, 16)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_recurrent_launch_shape_does_not_change_results(dtype):
    """Output, state and capsule are bitwise the same whatever the recurrent kernel's launch shape (decode,
    verify and longer rows, with capture; Dv = 128, so warps walk several row groups; with one group per warp the
    block shares the prologue of a longer row's chunks, alternating between two halves of its stash)."""
    case = random_gdn_case(np.random.default_rng(21), lengths=(1, 4, 4, 9, 0, 3, 14), capacity=4,
                           capture=(1, 4, 2, 4, 0, 3, 4), dtype=dtype, **D128)
    runs = [run_gdn(case, engine="recurrent", rec_rows=r, rec_groups=g) for r, g in REC_SHAPES]
    ref_out, ref_state, _ = reference.gated_delta_net(case.feeds, **case.attributes)
    tol = 5e-3 if dtype == "float16" else 2e-2
    assert rel_err(runs[0][0], ref_out) <= tol and rel_err(runs[0][1], ref_state) <= tol
    for shape, run in zip(REC_SHAPES[1:], runs[1:]):
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(runs[0], run)), shape


@pytest.mark.parametrize("dtype,hk,hv", [("float16", 2, 6), ("bfloat16", 2, 4), ("float16", 1, 3)])
def test_prep_heads_per_block_do_not_change_results(dtype, hk, hv):
    """The prep kernel serving a key head's whole group of value heads per block (q/k loads, norms and Gram
    products once for the group) gives bitwise what one value head per block gives, and both match the
    reference. Ragged rows with partial chunks, and a row the tail pass serves."""
    case = random_gdn_case(np.random.default_rng(23), lengths=(130, 17, 200, 64), dtype=dtype, num_heads_q=hk,
                           num_heads_v=hv, head_size_k=128, head_size_v=128)
    one, shared = (run_gdn(case, engine="chunked", prep_heads=n) for n in (1, hv // hk))
    ref_out, ref_state, _ = reference.gated_delta_net(case.feeds, **case.attributes)
    assert rel_err(one[0], ref_out) <= 3e-2 and rel_err(one[1], ref_state) <= 3e-2
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(one, shared))


PREFIX_LENGTHS = (8, 5, 1, 7, 3, 8, 0, 4)
PREFIX_CASES = [(d, per_key, cap) for d in ("float16", "bfloat16")
                for per_key, cap in ((False, True), (False, False), (True, False))]


@pytest.mark.parametrize("dtype,per_key,capture", PREFIX_CASES,
                         ids=[f"{d}-{'perkey' if k else 'scalar'}-{'capture' if c else 'nocapture'}"
                              for d, k, c in PREFIX_CASES])
def test_recurrent_prefix_is_bitwise(dtype, per_key, capture):
    """A row's first n outputs and its state after n tokens are bitwise the same whether the call holds n or
    more of the row's tokens (n = 1..8): the recurrent kernel takes a row's tokens in chunks (one prologue per
    chunk of up to 4), and a token's results must depend only on the row's earlier tokens, whatever the chunk
    holds. GVA (3 value heads per key head), Dk = Dv = 128; the state after n < length tokens comes from
    replaying the longer call's capsule, and with capture the shorter call's capsule slots match the longer
    call's."""
    capacity = 8 if capture else 0
    geo = dict(num_heads_q=2, num_heads_v=6, head_size_k=128, head_size_v=128)
    case = random_gdn_case(np.random.default_rng(31), lengths=PREFIX_LENGTHS, dtype=dtype, per_key_decay=per_key,
                           capacity=capacity, capture=PREFIX_LENGTHS if capture else None, **geo)
    out, state, capsule = run_gdn(case, engine="recurrent")
    layout = contract.GdnCapsuleLayout(capacity, geo["num_heads_v"], geo["num_heads_q"], geo["head_size_k"],
                                       geo["head_size_v"])
    cu = offsets(PREFIX_LENGTHS)
    for n in range(1, 9):
        feeds, attrs = _prefix_case(case, n)
        kept = [min(n, length) for length in PREFIX_LENGTHS]
        if capture:
            feeds["capture_count"] = np.asarray(kept, np.int32)
            attrs["state_update_capacity"] = capacity
        short = type(case)(feeds=feeds, attributes=attrs, lengths=kept)
        s_out, s_state, s_capsule = run_gdn(short, engine="recurrent")
        s_cu = offsets(kept)
        if capture:
            replayed = to_gpu(case.feeds["initial_state"].copy())
            cuda_ops.replay_gdn(replayed, to_gpu(capsule), kept, capacity)
            torch.cuda.synchronize()
            replayed = to_host(replayed)
        for b, length in enumerate(PREFIX_LENGTHS):
            m = kept[b]
            assert np.array_equal(s_out[s_cu[b]:s_cu[b] + m], out[cu[b]:cu[b] + m]), f"row {b}, n {n}: output"
            if n >= length:
                assert np.array_equal(s_state[b], state[b]), f"row {b}, n {n}: state"
            if capture:
                assert np.array_equal(replayed[b], s_state[b]), f"row {b}, n {n}: state after n tokens"
                for got, want in zip(layout.split(s_capsule[b]), layout.split(capsule[b])):
                    assert np.array_equal(got[:m], want[:m]), f"row {b}, n {n}: capsule"


def test_in_place_state_and_two_call_continuation():
    rng = np.random.default_rng(5)
    case = random_gdn_case(rng, lengths=(128,), dtype="float16", **D128)
    _, ref_state, _ = reference.gated_delta_net(case.feeds, **case.attributes)
    half = {k: v for k, v in case.feeds.items()}
    for k in ("query", "key", "value", "decay", "beta"):
        half[k] = case.feeds[k][:64]
    half["cu_seqlens"] = offsets([64])
    state = to_gpu(case.feeds["initial_state"])
    for part in range(2):
        feeds = dict(half)
        if part:
            for k in ("query", "key", "value", "decay", "beta"):
                feeds[k] = case.feeds[k][64:]
        dev = {k: to_gpu(v) for k, v in feeds.items()}
        dev["initial_state"] = state
        cuda_ops.gated_delta_net(dev, outputs={"final_state": state,
                                               "output": torch.empty((64, 4, 128), dtype=torch.float16,
                                                                     device="cuda")},
                                 engine="chunked", **case.attributes)
    assert rel_err(to_host(state), ref_state) <= 3e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bound_calls_equal_unbound_calls_step_by_step(dtype):
    """A decode loop over bound buffers (bind_gated_delta_net / bind_varlen_causal_conv; each step's inputs written
    into them, the states updated in place, state_update_active toggled) gives bitwise what unbound calls on fresh
    arrays give."""
    attrs = dict(update_rule="gated_delta", gate_activation="qwen", beta_activation="sigmoid", qk_l2_norm=1,
                 state_update_capacity=2)
    first = random_gdn_case(np.random.default_rng(11), lengths=(1, 1, 1), dtype=dtype, capacity=2, active=1, **D128)
    buffers = {k: (v if k == "state_update_active" else to_gpu(v)) for k, v in first.feeds.items()}
    act = TORCH_TYPES[np.dtype(first.feeds["query"].dtype)]
    width = contract.gdn_capsule_width(2, 4, 2, 128, 128)
    bound_out = {"output": poisoned((3, 4, 128), act), "final_state": buffers["initial_state"],
                 "state_update": poisoned((3, width), torch.float32)}
    gdn = cuda_ops.bind_gated_delta_net(buffers, outputs=bound_out, **attrs)
    conv_case = random_conv_case(np.random.default_rng(12), lengths=(1, 1, 1), channels=40, dtype=dtype)
    conv_buffers = {k: to_gpu(v) for k, v in conv_case.feeds.items()}
    conv_out = {"output": torch.empty_like(conv_buffers["input"]), "final_state": conv_buffers["initial_state"],
                "state_update": torch.empty((3, 0, 40), dtype=act, device="cuda")}
    conv = cuda_ops.bind_varlen_causal_conv(conv_buffers, outputs=conv_out, **conv_case.attributes)
    state, conv_state = buffers["initial_state"].clone(), conv_buffers["initial_state"].clone()
    for step in range(4):
        case = random_gdn_case(np.random.default_rng(20 + step), lengths=(1, 1, 1), dtype=dtype, **D128)
        fresh = {k: to_gpu(case.feeds[k]) for k in ("query", "key", "value", "decay", "beta")}
        for k, v in fresh.items():
            buffers[k].copy_(v)
        active = step % 2
        out, _, capsule = gdn(state_update_active=active)
        want = cuda_ops.gated_delta_net({**buffers, **fresh, "initial_state": state, "state_update_active": active},
                                        outputs={"output": torch.empty_like(out), "final_state": state,
                                                 "state_update": torch.empty_like(capsule)}, **attrs)
        x = to_gpu(random_conv_case(np.random.default_rng(30 + step), lengths=(1, 1, 1), channels=40,
                                    dtype=dtype).feeds["input"])
        conv_buffers["input"].copy_(x)
        conv_got = conv()
        conv_want = cuda_ops.varlen_causal_conv({**conv_buffers, "input": x, "initial_state": conv_state},
                                                outputs={"output": torch.empty_like(x), "final_state": conv_state,
                                                         "state_update": torch.empty_like(conv_out["state_update"])},
                                                **conv_case.attributes)
        torch.cuda.synchronize()
        assert torch.equal(out, want[0]) and torch.equal(buffers["initial_state"], state)
        assert torch.equal(capsule, want[2])  # all zeros on the inactive steps
        assert torch.equal(conv_got[0], conv_want[0]) and torch.equal(conv_buffers["initial_state"], conv_state)


def test_binding_needs_every_output_and_a_chunked_workspace():
    case = random_gdn_case(np.random.default_rng(13), lengths=(70,), dtype="float16", **D128)
    feeds = {k: to_gpu(v) for k, v in case.feeds.items()}
    with pytest.raises(ValueError, match="a bound call needs all three outputs; missing state_update"):
        cuda_ops.bind_gated_delta_net(feeds, outputs={"output": torch.empty((70, 4, 128), dtype=torch.float16,
                                                                            device="cuda"),
                                                      "final_state": feeds["initial_state"]}, **case.attributes)
    outputs = {"output": torch.empty((70, 4, 128), dtype=torch.float16, device="cuda"),
               "final_state": feeds["initial_state"], "state_update": torch.empty((1, 0), device="cuda")}
    with pytest.raises(ValueError, match="runs the chunked kernels; bind it with a workspace of at least"):
        cuda_ops.bind_gated_delta_net(feeds, outputs=outputs, **case.attributes)


def test_programmatic_chain_in_a_graph_is_bitwise_plain():
    """A 64-token prefill (chunked engine: prep, scan, tail pass) and six decode steps, chained through one
    in-place state and captured into a CUDA graph with programmatic dependent launch (the default on sm_90+),
    give bitwise what plain launches give outside a graph: each kernel waits for what the one before wrote."""
    rng = np.random.default_rng(41)
    steps = [random_gdn_case(rng, lengths=(64, 64), dtype="float16", **D128)]
    steps += [random_gdn_case(rng, lengths=(1, 1), dtype="float16", **D128) for _ in range(6)]
    first = {k: to_gpu(v) for k, v in steps[0].feeds.items()}
    nbytes = cuda_ops.gdn_workspace_bytes(first, outputs={}, engine="chunked", **steps[0].attributes)
    workspace = torch.empty(-(-nbytes // 4), dtype=torch.int32, device="cuda")

    def chain(in_graph):
        state = to_gpu(steps[0].feeds["initial_state"])
        feeds = [{k: to_gpu(v) for k, v in c.feeds.items() if k != "initial_state"} for c in steps]
        outs = [poisoned(f["value"].shape, torch.float16) for f in feeds]

        def run():
            for i, (case, f, out) in enumerate(zip(steps, feeds, outs)):
                cuda_ops.gated_delta_net(dict(f, initial_state=state), outputs={"output": out, "final_state": state},
                                         stream=torch.cuda.current_stream().cuda_stream, workspace=workspace,
                                         engine="chunked" if i == 0 else "recurrent", **case.attributes)
        if in_graph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            state.copy_(to_gpu(steps[0].feeds["initial_state"]))
            graph.replay()
        else:
            run()
        torch.cuda.synchronize()
        return [to_host(x) for x in outs + [state]]

    in_graph = chain(True)
    library.set_option("cuda_programmatic_launch", "off")
    try:
        plain = chain(False)
    finally:
        library.set_option("cuda_programmatic_launch", "auto")
    assert all(np.array_equal(a, b) for a, b in zip(in_graph, plain))
    assert np.isfinite(in_graph[-1]).all()


MALFORMED = [[0, 5, 3, 12], [-4, 6, 12], [0, 40, 12], [3, 6, 12], [0, 6, 9], [0, 2**30, -2**30, 12]]


@pytest.mark.parametrize("cu", MALFORMED, ids=[str(c) for c in MALFORMED])
def test_malformed_offsets_are_contained(cu):
    rng = np.random.default_rng(11)
    for kw, engine in ((dict(), "recurrent"), (dict(dtype="float16", **D128), "chunked")):
        case = random_gdn_case(rng, lengths=(6, 6), capacity=4, **kw)
        feeds = dict(case.feeds)
        feeds["cu_seqlens"] = np.asarray(cu, dtype=np.int32)
        feeds["capture_count"] = np.full(len(cu) - 1, 4, dtype=np.int32)
        feeds["initial_state"] = np.resize(case.feeds["initial_state"], (len(cu) - 1,) + case.feeds["initial_state"].shape[1:])
        _, state, capsule = run_gdn(case, engine=engine, feeds=feeds)
        assert np.isfinite(state).all() and np.isfinite(capsule).all()
    conv = random_conv_case(rng, lengths=(6, 6), capacity=2, capture=(1, 1))
    feeds = dict(conv.feeds)
    feeds["cumulative_sequence_length"] = np.asarray(cu, dtype=np.int32)
    feeds["capture_count"] = np.ones(len(cu) - 1, dtype=np.int32)
    feeds["initial_state"] = np.resize(conv.feeds["initial_state"], (len(cu) - 1,) + conv.feeds["initial_state"].shape[1:])
    for alias in (False, True):  # the state pass in the output grid, and after it
        _, st, cap = run_conv(type(conv)(feeds=feeds, attributes=conv.attributes, lengths=[]), alias=alias)
        assert np.isfinite(st).all() and np.isfinite(cap).all()


def test_overlapping_long_rows_are_contained():
    """Malformed offsets whose rows overlap give more chunks than the prep grid's bound (total tokens plus a
    partial chunk per row); the prep kernel strides over the excess, so no chunk reads an unprepared
    workspace. The overlapping rows' results are unspecified (they share output rows), but finite."""
    rng = np.random.default_rng(12)
    case = random_gdn_case(rng, lengths=(140,), dtype="float16", **D128)
    feeds = dict(case.feeds)
    feeds["cu_seqlens"] = np.asarray([0, 140, 0, 140], dtype=np.int32)  # rows [0, 140), empty, [0, 140)
    feeds["initial_state"] = np.concatenate([case.feeds["initial_state"]] * 3)
    out, state, _ = run_gdn(case, engine="chunked", feeds=feeds)
    assert np.isfinite(out).all() and np.isfinite(state).all()
    assert np.array_equal(state[1], feeds["initial_state"][1])


def test_rejections_use_the_contract_messages():
    case = random_gdn_case(np.random.default_rng(2), lengths=(3,))
    dev = {k: to_gpu(v) for k, v in case.feeds.items()}
    with pytest.raises(contract.ContractError) as err:
        cuda_ops.gated_delta_net(dict(dev, value=to_gpu(np.zeros((3, 5, 8), np.float32))), **case.attributes)
    assert str(err.value) == contract.format_message("GatedDeltaNet", "gdn_heads_v", 5, 2)
    with pytest.raises(contract.ContractError, match="state_update_capacity must be in"):
        cuda_ops.gated_delta_net(dev, **dict(case.attributes, state_update_capacity=9))
    with pytest.raises(TypeError, match="decay must be float32"):
        cuda_ops.gated_delta_net(dict(dev, decay=dev["decay"].half()), **case.attributes)


def test_fla_agrees_where_it_applies():
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    rng = np.random.default_rng(13)
    case = random_gdn_case(rng, lengths=(300, 77, 129), dtype="float16", num_heads_q=2, num_heads_v=6,
                           head_size_k=128, head_size_v=128)
    out, state, _ = run_gdn(case)
    f = case.feeds
    g = -np.exp(f["a_log"]) * np.logaddexp(0, f["decay"] + f["dt_bias"])
    beta = 1 / (1 + np.exp(-f["beta"]))
    rep = lambda x: torch.repeat_interleave(to_gpu(x), 3, dim=1)[None]  # noqa: E731  (FLA 0.6 wants Hq == Hv)
    o, s = fla.chunk_gated_delta_rule(
        rep(f["query"]), rep(f["key"]), to_gpu(f["value"])[None], to_gpu(g.astype(np.float32))[None],
        to_gpu(beta.astype(np.float32))[None].half(), scale=128 ** -0.5,
        initial_state=to_gpu(f["initial_state"]).transpose(-1, -2).contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=to_gpu(f["cu_seqlens"]).long())
    torch.cuda.synchronize()
    fla_out = to_host(o[0].float()).astype(np.float64)
    fla_state = to_host(s.transpose(-1, -2).float())
    assert rel_err(out, fla_out) <= 3e-2 and rel_err(state, fla_state) <= 3e-2


def run_conv(case, alias=False, input_override=None):
    attrs = contract.resolve_attributes(contract.VARLEN_CAUSAL_CONV, case.attributes)
    f = case.feeds
    geo = contract.resolve_conv({k: (None if v is None else np.shape(v)) for k, v in f.items()}, attrs)
    dev = {k: to_gpu(v) for k, v in f.items()}
    if input_override is not None:
        dev["input"] = input_override
    act = TORCH_TYPES[np.dtype(f["input"].dtype)]
    outs = {"output": poisoned((geo.total_tokens, geo.channels), act),
            "final_state": dev["initial_state"] if alias else poisoned((geo.batch, geo.channels, geo.state_length), act),
            "state_update": poisoned((geo.batch, geo.capacity, geo.channels), act)}
    out, state, cap = cuda_ops.varlen_causal_conv(dev, outputs=outs, **case.attributes)
    torch.cuda.synchronize()
    return to_host(out).astype(np.float64), to_host(state), to_host(cap)


CONV_CONFIGS = [
    ("f32-k4", dict(), 1e-5),
    ("f16-k4", dict(dtype="float16"), 2e-2),
    ("bf16-k4", dict(dtype="bfloat16"), 2e-2),
    ("k1", dict(kernel_size=1), 1e-5),
    ("k2-dil2", dict(kernel_size=2, dilation=2), 1e-5),
    ("k3-nobias-none", dict(kernel_size=3, with_bias=False, activation="none"), 1e-5),
    ("k5-swish", dict(kernel_size=5, activation="swish"), 1e-5),
    ("k7-dil2-short", dict(kernel_size=7, dilation=2, lengths=(3, 20, 1)), 1e-5),
    ("decode", dict(lengths=(1, 1, 1, 1)), 1e-5),
    ("wide-513", dict(channels=513, lengths=(40, 3)), 1e-5),
    ("deep-k386", dict(channels=33, kernel_size=386, lengths=(400, 2)), 1e-5),
    ("capture", dict(capacity=8, capture=(-1, 0, 3, 9)), 1e-5),
    ("zero-length", dict(lengths=(4, 0, 5)), 1e-5),
    # Over kConvRowTokens per row on average: the two-pass plan (the configs above mostly take the
    # fused one-launch kernel).
    ("long-rows", dict(lengths=(40, 17, 1, 30)), 1e-5),
    ("long-rows-capture", dict(lengths=(40, 17, 1, 30), capacity=4, capture=(4, 2, 1, 0)), 1e-5),
    # 16-byte channel vectors (conv.cu kConvVec: 8 per thread at 16-bit types, 4 at fp32) with 4 taps; the
    # configs above with 16-bit types have 12 channels, so they take the element path.
    ("f16-k4-vec", dict(dtype="float16", channels=64, capacity=2, capture=(2, 1, 0, 2)), 2e-2),
    ("bf16-k4-vec", dict(dtype="bfloat16", channels=40), 2e-2),
    # The fused short-row kernel writes capsule slots from the inputs it holds (conv.cu kConvRowsAhead of them),
    # later tokens' slots as it steps them, and zeros past a row or its capture count.
    ("rows-capture-f16-vec", dict(dtype="float16", channels=64, lengths=(7, 2, 6, 1, 0), capacity=6,
                                  capture=(6, 2, 4, 1, 3)), 2e-2),
    ("decode-f16-vec", dict(dtype="float16", channels=64, lengths=(1, 1, 1, 1), capacity=1), 2e-2),
    # One token per row: conv.cu's conv_decode_guessed computes each row before its offsets arrive.
    ("decode-f32-vec-capture", dict(channels=24, lengths=(1, 1, 1, 1, 1), capacity=2, capture=(1, 0, 1, 2, 1)),
     1e-5),
    # A token per row on average takes conv_decode, whose rows need not be one token each.
    ("decode-ragged", dict(lengths=(0, 2, 1, 1), capacity=2, capture=(1, 2, 1, 0)), 1e-5),
    ("decode-ragged-bf16-vec", dict(dtype="bfloat16", channels=64, lengths=(2, 1, 0, 1)), 2e-2),
    # Over kConvShortTokens in all: runs of kConvMediumTokens tokens per thread (one pair of chunks,
    # conv.cu's straight-line case), rows starting and ending inside a run, rows shorter than the window, an empty
    # row.
    ("prefill-runs", dict(lengths=(300, 77, 2, 129, 5, 0, 40), channels=24, capacity=4,
                          capture=(4, 2, 1, 0, 3, 4, 4)), 1e-5),
    ("prefill-runs-f16", dict(dtype="float16", lengths=(300, 77, 2, 129, 5, 0, 40), channels=72), 2e-2),
    ("prefill-runs-k3", dict(kernel_size=3, lengths=(300, 77, 2, 129), channels=24), 1e-5),
    # From kConvLongTokens on: runs of kConvTokens, streamed in pairs of chunks (conv.cu kConvChunk),
    # rows starting and ending inside chunks; 4157 tokens leave a last run of 13 (a pair cut short), 4100 one of 4.
    ("long-runs", dict(lengths=(3001, 77, 2, 1029, 5, 0, 43), channels=24, capacity=4,
                       capture=(4, 2, 1, 0, 3, 4, 4)), 1e-5),
    ("long-runs-f16", dict(dtype="float16", lengths=(3001, 77, 2, 1029, 5, 0, 43), channels=72), 2e-2),
    ("long-runs-bf16", dict(dtype="bfloat16", lengths=(4099, 1), channels=40), 2e-2),
]


@pytest.mark.parametrize("name,kwargs,tol", CONV_CONFIGS, ids=[c[0] for c in CONV_CONFIGS])
def test_conv_matches_reference(name, kwargs, tol):
    case = random_conv_case(np.random.default_rng(abs(hash(name)) % 2**32), **kwargs)
    out, state, cap = run_conv(case)
    ref_out, ref_state, ref_cap = reference.varlen_causal_conv(case.feeds, **case.attributes)
    assert rel_err(out, ref_out) <= tol
    assert np.array_equal(state.astype(np.float64), ref_state)  # raw samples: exact
    assert np.array_equal(cap.astype(np.float64), ref_cap)  # bit copies and zeros: exact


@pytest.mark.parametrize("dtype,channels", [("float", 24), ("float16", 64), ("bfloat16", 40)])
@pytest.mark.parametrize("lengths", [(1, 0, 2, 1), (10, 5, 1, 8), (300, 77, 2, 129, 5, 0, 40),
                                     (3001, 77, 2, 1029, 5, 0, 43)], ids=["decode", "one-launch", "two-pass", "long"])
def test_conv_vector_path_equals_element_path(dtype, channels, lengths):
    """The 16-byte path (aligned tensors) and the element path (an input one element off 16 bytes) give the
    same bits: outputs, state and capsule."""
    case = random_conv_case(np.random.default_rng(channels), lengths=lengths, dtype=dtype, channels=channels,
                            capacity=3, capture=[3, 1, 0, 2, 3, 3, 1][:len(lengths)])
    aligned = run_conv(case)
    x = to_gpu(case.feeds["input"])
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    shifted[1:] = x.reshape(-1)
    misaligned = shifted[1:].view(x.shape)
    assert misaligned.data_ptr() % 16
    elements = run_conv(case, input_override=misaligned)
    for a, e in zip(aligned, elements):
        assert a.tobytes() == e.tobytes()


@pytest.mark.parametrize("dtype,channels", [("float", 24), ("float16", 72), ("bfloat16", 1001)])
@pytest.mark.parametrize("lengths", [(300, 77, 2, 129, 5, 0, 40), (3001, 77, 2, 1029, 5, 0, 43), (0, 4099, 0)],
                         ids=["runs", "long-runs", "empty-rows"])
def test_conv_state_in_the_output_grid_equals_two_passes(dtype, channels, lengths):
    """final_state apart from initial_state: the output launch writes the states too (the planner's
    state_rows); in place: a second launch does. Same bits either way: outputs, state and capsule."""
    capture = [4, 2, 1, 0, 3, 4, 4][:len(lengths)]
    case = random_conv_case(np.random.default_rng(len(lengths) + channels), lengths=lengths, dtype=dtype,
                            channels=channels, capacity=4, capture=capture)
    for a, b in zip(run_conv(case), run_conv(case, alias=True)):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("lengths", [(1, 1, 1, 1), (10, 5, 1, 8), (30, 12, 1, 20)],
                         ids=["decode", "one-launch", "two-pass"])
def test_conv_aliased_state_and_exact_replay(lengths):
    rng = np.random.default_rng(17)
    case = random_conv_case(rng, lengths=lengths, capacity=8, capture=(8, 5, 1, 8), kernel_size=4)
    ref_out, ref_state, _ = reference.varlen_causal_conv(case.feeds, **case.attributes)
    out, state, cap = run_conv(case, alias=True)
    assert np.array_equal(state.astype(np.float64), ref_state)
    for n in range(1, 9):
        st = to_gpu(case.feeds["initial_state"].copy())
        accepted = [min(n, c, length) for c, length in zip((8, 5, 1, 8), case.lengths)]
        cuda_ops.replay_conv(st, to_gpu(cap), accepted)
        torch.cuda.synchronize()
        short = {k: v for k, v in case.feeds.items()}
        cu = offsets(case.lengths)
        keep = np.concatenate([np.arange(cu[b], cu[b] + accepted[b]) for b in range(4)]).astype(int)
        short["input"] = case.feeds["input"][keep]
        short["cumulative_sequence_length"] = offsets(accepted)
        short.pop("capture_count")
        _, short_state, _ = reference.varlen_causal_conv(short, activation="silu", dilation=1)
        assert np.array_equal(to_host(st).astype(np.float64), short_state), f"prefix {n}"
