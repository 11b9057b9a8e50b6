"""Our CPU GatedDeltaNet against the float64 reference and against itself (docs/op-contract.md#tolerances)."""

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from native_util import (GDN, check_capsule_replay, check_decode_equals_verify, check_gdn, check_state_aliasing,
                         check_subnormal_gdn, is_subnormal,
                         run_gdn, subnormal_gdn_case)
from onnx_hybrid.ops import contract, library
from onnx_hybrid_testing import single_op
from onnx_hybrid_testing.cases import DTYPES, Case, random_gdn_case
from onnx_hybrid_testing.host import cpu_flags
from file_modules import ROOT

# Each entry: random_gdn_case keyword arguments. Rows of >= 32 tokens run the chunked engine, shorter
# rows and captured rows the recurrence (docs/op-contract.md#engine-selection).
REFERENCE_CASES = {
    # chunk boundaries
    **{f"T{n}_chunk{c}": dict(lengths=[n], chunk_size=c) for n in (63, 64, 65, 130) for c in (64, 32)},
    **{f"T{n}_chunk32": dict(lengths=[n], chunk_size=32) for n in (128, 200)},
    "ragged_unequal": dict(lengths=[40, 110, 50]),
    "no_initial_state": dict(lengths=[128], with_state=False),
    "ragged_with_length_1_rows": dict(lengths=[1, 70, 1, 33]),
    "zero_length_middle": dict(lengths=[3, 0, 5]),
    "zero_length_middle_chunked": dict(lengths=[40, 0, 50], with_state=False),
    "capture_clamped": dict(lengths=[3, 5, 1], capacity=4, capture=[-1, 9, 2]),
    "capture_active_1": dict(lengths=[3, 5, 1], capacity=4, capture=[-1, 9, 2], active=1),
    "capture_active_0": dict(lengths=[3, 40, 1], capacity=4, capture=[2, 9, 2], active=0),
    "capture_long_row": dict(lengths=[70, 2], capacity=8, capture=[8, 1]),
    "capture_zero_count_long_row": dict(lengths=[70, 2], capacity=8, capture=[0, 1]),
    "capacity_0_state_update_requested": dict(lengths=[4, 40]),
    "dv_1_l2norm": dict(lengths=[5, 40], head_size_k=16, head_size_v=1),
    "dk64_dv32": dict(lengths=[40, 7], head_size_k=64, head_size_v=32, num_heads_q=1, num_heads_v=1),
    "dk128_dv64": dict(lengths=[33, 2], head_size_k=128, head_size_v=64, num_heads_q=1, num_heads_v=2),
    "dk256": dict(lengths=[34, 3], head_size_k=256, head_size_v=32, num_heads_q=1, num_heads_v=1),
    "dk128_dv128": dict(lengths=[36, 1], head_size_k=128, head_size_v=128, num_heads_q=1, num_heads_v=1),
    "ratio_1": dict(lengths=[6, 35], num_heads_q=2, num_heads_v=2),
    "ratio_2": dict(lengths=[6, 35], num_heads_q=2, num_heads_v=4),
    "ratio_3_capture": dict(lengths=[6, 35], num_heads_q=2, num_heads_v=6, capacity=3, capture=[3, 2]),
    "scale_explicit": dict(lengths=[6, 35], scale=0.5),
    "scale_negative": dict(lengths=[6, 35], scale=-0.3),
    "per_key_decay": dict(lengths=[40, 5], per_key_decay=True, gate_activation="none"),
    "per_key_decay_qwen": dict(lengths=[40, 5], per_key_decay=True),
    "uniform": dict(lengths=[40, 40], layout="uniform"),
    "rank4": dict(lengths=[3, 3], layout="rank4"),
    "packed_ragged": dict(lengths=[33, 4], layout="packed"),
    "packed_uniform": dict(lengths=[5, 5], layout="packed_uniform"),
    "packed_rank3": dict(lengths=[40, 40], layout="packed_rank3"),
    "fp16": dict(lengths=[5, 70], dtype="float16"),
    "bf16": dict(lengths=[5, 70], dtype="bfloat16"),
    "fp16_capture": dict(lengths=[5, 3], dtype="float16", capacity=4, capture=[4, 2]),
    "bf16_capture": dict(lengths=[5, 3], dtype="bfloat16", capacity=4, capture=[4, 2]),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_CASES))
def test_matches_reference(name):
    kwargs = dict(REFERENCE_CASES[name])
    lengths = kwargs.pop("lengths")
    check_gdn(random_gdn_case(np.random.default_rng(zlib.crc32(name.encode())), lengths, **kwargs))


def _rule_combinations():
    for rule, (has_decay, has_delta) in contract.UPDATE_RULES.items():
        for gate in ("none", "qwen") if has_decay else ("none",):
            for beta in ("none", "sigmoid") if has_delta else ("none",):
                for l2 in (0, 1):
                    yield rule, gate, beta, l2


@pytest.mark.parametrize("rule,gate,beta,l2", list(_rule_combinations()))
def test_update_rules_and_activations(rule, gate, beta, l2):
    case = random_gdn_case(np.random.default_rng(7), [5, 40], update_rule=rule, gate_activation=gate,
                           beta_activation=beta, qk_l2_norm=l2)
    check_gdn(case)


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 100), min_size=1, max_size=4).filter(lambda xs: sum(xs) > 0),
    ratio=st.sampled_from([1, 2, 3]),
    dims=st.sampled_from([(16, 8), (8, 16), (32, 32), (24, 5)]),
    rule=st.sampled_from(list(contract.UPDATE_RULES)),
    chunk=st.sampled_from([32, 64]),
    capacity=st.integers(0, 4),
    seed=st.integers(0, 2**31),
)
def test_random_configurations(lengths, ratio, dims, rule, chunk, capacity, seed):
    rng = np.random.default_rng(seed)
    has_decay, has_delta = contract.UPDATE_RULES[rule]
    capture = rng.integers(-1, 6, len(lengths)).tolist() if capacity else None
    case = random_gdn_case(rng, lengths, num_heads_q=1 + seed % 2, num_heads_v=(1 + seed % 2) * ratio,
                           head_size_k=dims[0], head_size_v=dims[1], update_rule=rule,
                           gate_activation="qwen" if has_decay and seed % 3 else "none",
                           beta_activation="sigmoid" if has_delta and seed % 2 else "none",
                           chunk_size=chunk, capacity=capacity, capture=capture)
    check_gdn(case)


@pytest.mark.parametrize("engine", ["sequential", "chunked"])
def test_forced_engines_match_reference(engine):
    """The test hook sends every row to one engine: the chunked one on short rows, the recurrence on long."""
    case = random_gdn_case(np.random.default_rng(3), [1, 2, 17, 31, 64, 97], chunk_size=32)
    library.set_option("cpu_engine", engine)
    try:
        check_gdn(case)
    finally:
        library.set_option("cpu_engine", "auto")


def test_capacity_0_state_update_shape_and_omitted():
    case = random_gdn_case(np.random.default_rng(1), [4, 6])
    assert run_gdn(case)["state_update"].shape == (2, 0)
    omitted = run_gdn(case, outputs=["output", "final_state"])
    assert set(omitted) == {"output", "final_state"}
    only_output = run_gdn(case, outputs=["output"])
    np.testing.assert_array_equal(only_output["output"], omitted["output"])


def test_zero_length_request_copies_state_bitwise():
    case = random_gdn_case(np.random.default_rng(2), [3, 0, 5], capacity=2, capture=[2, 2, 2])
    out = run_gdn(case)
    np.testing.assert_array_equal(out["final_state"][1], case.feeds["initial_state"][1])
    assert not out["state_update"][1].any()
    no_state = random_gdn_case(np.random.default_rng(2), [3, 0, 5], with_state=False)
    assert not run_gdn(no_state)["final_state"][1].any()


def _uniform_pair(lengths, layout):
    rng_seed = 11
    a = random_gdn_case(np.random.default_rng(rng_seed), lengths, layout="uniform")
    b = random_gdn_case(np.random.default_rng(rng_seed), lengths, layout=layout)
    return a, b


@pytest.mark.parametrize("lengths", [[128, 128], [1, 1, 1]])
def test_rank4_equals_rank3_uniform(lengths):
    a, b = _uniform_pair(lengths, "rank4")
    ra, rb = run_gdn(a), run_gdn(b)
    np.testing.assert_array_equal(ra["output"].reshape(rb["output"].shape), rb["output"])
    np.testing.assert_array_equal(ra["final_state"], rb["final_state"])


@pytest.mark.parametrize("layout,lengths", [("packed", [40, 3]), ("packed_uniform", [6, 6]), ("packed_rank3", [40, 40])])
def test_packed_qkv_equals_separate(layout, lengths):
    separate_layout = "ragged" if layout == "packed" else "uniform"
    sep = random_gdn_case(np.random.default_rng(5), lengths, layout=separate_layout)
    packed = random_gdn_case(np.random.default_rng(5), lengths, layout=layout)
    rs, rp = run_gdn(sep), run_gdn(packed)
    np.testing.assert_array_equal(rs["output"], rp["output"].reshape(rs["output"].shape))
    np.testing.assert_array_equal(rs["final_state"], rp["final_state"])


GATE_CASES = {"recurrent": dict(lengths=[3, 1, 5]), "chunked": dict(lengths=[40, 70]),
              "per_key_decay": dict(lengths=[40, 5], per_key_decay=True), "capture": dict(lengths=[5, 3], capacity=4)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(GATE_CASES))
def test_gates_in_the_activation_type_equal_fp32_gates(dtype, name):
    """docs/op-contract.md#gateddeltanet-inputs-and-outputs: decay and beta given in the activation type are widened
    as a Cast node before the op would widen them, so every output equals that of the same values given in fp32,
    bit for bit."""
    case = random_gdn_case(np.random.default_rng(11), dtype=dtype, **GATE_CASES[name])
    narrow = {k: case.feeds[k].astype(DTYPES[dtype]) for k in ("decay", "beta")}
    got = run_gdn(Case({**case.feeds, **narrow}, case.attributes, case.lengths))
    want = run_gdn(Case({**case.feeds, **{k: v.astype(np.float32) for k, v in narrow.items()}}, case.attributes,
                        case.lengths))
    assert set(got) == set(want)
    for output in want:
        np.testing.assert_array_equal(got[output], want[output], err_msg=output)


def _split_case(case, at):
    """The first `at` tokens of a one-row case, and the rest (without state)."""
    first, rest = dict(case.feeds), dict(case.feeds)
    for name in ("query", "key", "value", "decay", "beta"):
        first[name], rest[name] = case.feeds[name][:at], case.feeds[name][at:]
    n = case.feeds["query"].shape[0]
    first["cu_seqlens"] = np.array([0, at], np.int32)
    rest["cu_seqlens"] = np.array([0, n - at], np.int32)
    return first, rest


def test_two_calls_equal_one_call():
    case = random_gdn_case(np.random.default_rng(8), [128])
    whole = run_gdn(case)
    first, rest = _split_case(case, 64)
    a = single_op.run_single_op(GDN, first, case.attributes)
    rest["initial_state"] = a["final_state"]
    b = single_op.run_single_op(GDN, rest, case.attributes)
    np.testing.assert_allclose(np.concatenate([a["output"], b["output"]]), whole["output"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b["final_state"], whole["final_state"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lengths", [[128], [3, 5]])
def test_state_aliased_through_iobinding(lengths):
    check_state_aliasing(GDN, random_gdn_case(np.random.default_rng(9), lengths))


def test_decode_row_in_mixed_batch_is_bitwise_independent():
    rng = np.random.default_rng(10)
    mixed = random_gdn_case(rng, [64, 1])
    alone = {name: value for name, value in mixed.feeds.items()}
    for name in ("query", "key", "value", "decay", "beta"):
        alone[name] = mixed.feeds[name][64:]
    alone["initial_state"] = mixed.feeds["initial_state"][1:]
    alone["cu_seqlens"] = np.array([0, 1], np.int32)
    m = run_gdn(mixed)
    a = single_op.run_single_op(GDN, alone, mixed.attributes)
    np.testing.assert_array_equal(m["output"][64:], a["output"])
    np.testing.assert_array_equal(m["final_state"][1], a["final_state"][0])
    # a batch of only decode rows next to a batch with long rows
    decode_only = random_gdn_case(np.random.default_rng(12), [1, 1, 1])
    with_long = dict(decode_only.feeds)
    long_case = random_gdn_case(np.random.default_rng(13), [100])
    for name in ("query", "key", "value", "decay", "beta"):
        with_long[name] = np.concatenate([decode_only.feeds[name], long_case.feeds[name]])
    with_long["initial_state"] = np.concatenate([decode_only.feeds["initial_state"], long_case.feeds["initial_state"]])
    with_long["cu_seqlens"] = np.array([0, 1, 2, 3, 103], np.int32)
    d = run_gdn(decode_only)
    w = single_op.run_single_op(GDN, with_long, decode_only.attributes)
    np.testing.assert_array_equal(w["output"][:3], d["output"])
    np.testing.assert_array_equal(w["final_state"][:3], d["final_state"])


@pytest.mark.parametrize("dtype", ["float", "float16"])
def test_capsule_replay_is_bit_exact(dtype):
    """replay_gdn of the capsule for every prefix 1..C equals the op's final_state on that prefix alone."""
    check_capsule_replay(random_gdn_case(np.random.default_rng(14), [8, 8, 8], capacity=8, capture=[0, 4, 8],
                                         num_heads_q=2, num_heads_v=4, dtype=dtype))


# Head sizes of every recurrent kernel path: AVX-512 registers (64, 128) and any-Dk (32, 37), AVX2 registers (32).
@pytest.mark.parametrize("head_size_k", [32, 37, 64, 128])
def test_subnormal_decays_and_states(head_size_k):
    check_subnormal_gdn(head_size_k, seed=head_size_k)


def test_subnormal_state_decode_equals_verify_without_capture():
    """Uncaptured short rows run the recurrence too: decode == verify on a state decayed below FLT_MIN."""
    rng = np.random.default_rng(21)
    case = subnormal_gdn_case(rng, [7, 2], head_size_k=128)
    state = case.feeds["initial_state"]
    case.feeds["initial_state"] = (1e-39 * rng.standard_normal(state.shape)).astype(np.float32)  # every head
    assert is_subnormal(case.feeds["initial_state"]).mean() > 0.5
    check_gdn(case)
    check_decode_equals_verify(case, row=0)


@pytest.mark.parametrize("with_state", [True, False])
def test_value_columns_are_computed_alone_bit_for_bit(with_state):
    """The recurrence advances several state rows (value columns) of a head at once where it can (four at a time
    on AVX2 at Dk 128); each column's outputs and state must be those of the column alone (Dv = 1, one row at a time):
    decode and verify rows, rows longer than the engine's 64-token staging, subnormal states (the exact-step
    repairs), and a column count that is not a multiple of four."""
    rng = np.random.default_rng(22)
    lengths, capture = [1, 5, 70, 65], [1, 4, 2, 3]
    if with_state:
        case = subnormal_gdn_case(rng, lengths, head_size_k=128, head_size_v=9, capacity=4, capture=capture)
    else:
        case = random_gdn_case(rng, lengths, head_size_k=128, head_size_v=9, num_heads_q=2, num_heads_v=4,
                               capacity=4, capture=capture, with_state=False)
    whole = run_gdn(case)
    for c in range(9):
        column = dict(case.feeds, value=np.ascontiguousarray(case.feeds["value"][..., c:c + 1]))
        if with_state:
            column["initial_state"] = np.ascontiguousarray(case.feeds["initial_state"][:, :, c:c + 1])
        alone = single_op.run_single_op(GDN, column, case.attributes)
        np.testing.assert_array_equal(alone["output"][..., 0], whole["output"][..., c], err_msg=f"column {c}")
        np.testing.assert_array_equal(alone["final_state"][:, :, 0], whole["final_state"][:, :, c],
                                      err_msg=f"column {c}")


def test_kernels_leave_the_thread_float_mode_alone():
    """The kernels flush subnormals only inside their work items: after a run the calling thread (NumPy)
    and ORT's own kernels in the same session (2 intra-op threads) compute subnormals again."""
    from onnx import TensorProto, helper

    case = subnormal_gdn_case(np.random.default_rng(3), [40, 3, 1])
    model = single_op.single_op_model(GDN, case.feeds, case.attributes)
    model.graph.input.append(helper.make_tensor_value_info("tiny", TensorProto.FLOAT, [1 << 16]))
    model.graph.initializer.append(helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]))
    model.graph.node.append(helper.make_node("Mul", ["tiny", "half"], ["halved"]))
    model.graph.output.append(helper.make_tensor_value_info("halved", TensorProto.FLOAT, [1 << 16]))
    session = single_op.make_session(model, intra_op_threads=2)
    tiny = np.full(1 << 16, 1e-38, np.float32)
    for _ in range(3):  # from the second run on, ORT's Mul runs after our kernel has used the pool threads
        halved = single_op.run_session(session, {**case.feeds, "tiny": tiny})["halved"]
        np.testing.assert_array_equal(halved, np.full(1 << 16, 5e-39, np.float32))
        assert is_subnormal(np.float32(1e-38) * np.float32(0.5))


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_narrower_isa_matches_reference(isa):
    """The AVX2 and portable kernels (machines without AVX-512), forced through ONNX_HYBRID_CPU_ISA in a child."""
    if isa == "avx2" and not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("this CPU has no AVX2 + FMA, so the AVX2 variant cannot run here")
    code = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from native_util import check_conv, check_gdn\n"
        "from onnx_hybrid.ops import library\n"
        "from onnx_hybrid_testing.cases import random_conv_case, random_gdn_case\n"
        f"assert library.cpu_isa() == '{isa}', library.cpu_isa()\n"
        "for i, (lengths, dk, dv) in enumerate([([1, 70, 5], 128, 24), ([65, 33], 64, 64), ([40, 2], 37, 5)]):\n"
        "    check_gdn(random_gdn_case(np.random.default_rng(i), lengths, head_size_k=dk, head_size_v=dv,"
        " capacity=2, capture=[2, 1, 2][:len(lengths)]))\n"
        "check_conv(random_conv_case(np.random.default_rng(0), [10, 5, 1, 8], channels=70))\n"
        "from native_util import check_subnormal_gdn\n"
        "for dk in (32, 37, 64, 128):\n"
        "    check_subnormal_gdn(dk, seed=dk)\n"
    )
    env = {**os.environ, "ONNX_HYBRID_CPU_ISA": isa}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
