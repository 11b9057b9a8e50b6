"""The library's CUDA planner (ops/native/cuda/launch_plan.cc), seen as a GPU sees it and without one:
onnx_hybrid.cuda_ops calls on fake device addresses go through the library's C entry points into a stand-in
libcuda (tests/cuda_stub.py), which prints each launch. Checked: the engine and instantiation each shape takes,
grids, blocks and shared memory per image, the tuning knobs and their errors, the conv's one- and two-launch
plans, both replays, and that every kernel the planner can name exists in the compiled image."""

import pytest
from cuda_stub import A100_SMEM, H100_SMEM, SM89_SMEM, build_stub_drivers, planned_launches
from cuda_stub import gdn_call as gdn

from onnx_hybrid.cuda_ops import compiler
from onnx_hybrid.ops import contract

@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return build_stub_drivers(tmp_path_factory.mktemp("stub-driver"))["plain"]


def kernels(launches):
    return [(ln["kernel"], ln.get("tail_only")) for ln in launches]


def test_engine_and_instantiation_follow_the_shape(driver):
    calls = {
        # decode and verify: the recurrent kernel alone, serving every row; at most one token per row: its decode
        # instantiation (large batches 8 value rows per warp, small ones 4: more warps)
        "decode32": (gdn(32, 32), 90, H100_SMEM),
        "decode1": (gdn(1, 1), 90, H100_SMEM),
        "decode-bf16": (gdn(32, 32, "bfloat16"), 90, H100_SMEM),
        # decode shapes of no real model (fp32, other key sizes) take the general kernel
        "decode-f32": (gdn(32, 32, "float32"), 90, H100_SMEM),
        "decode-k512": (gdn(4, 4, dk=512, dv=64), 90, H100_SMEM),
        "decode-k64": (gdn(4, 4, dk=64, dv=64), 90, H100_SMEM),
        "verify": (gdn(32, 128, capacity=4), 90, H100_SMEM),
        # prefill: the chunked prep and scan, then the tail pass for the rows they skip (decided on the device)
        "prefill": (gdn(1, 4096), 90, H100_SMEM),
        "prefill-8x2048": (gdn(8, 16384, "bfloat16"), 90, H100_SMEM),
        # shapes the chunked kernel does not serve fall back to the recurrent kernel
        "prefill-f32": (gdn(1, 4096, "float32"), 90, H100_SMEM),
        "prefill-k64": (gdn(1, 4096, dk=64, dv=32), 90, H100_SMEM),
        "prefill-per-key": (gdn(1, 4096, per_key=True), 90, H100_SMEM),
        "prefill-sm75": (gdn(1, 4096), 75, H100_SMEM),
        "prefill-sm80": (gdn(1, 4096), 80, A100_SMEM),
        "prefill-sm89": (gdn(1, 4096), 89, SM89_SMEM),  # 99 KB of shared memory: the scan does not fit
        "forced-chunked": (gdn(4, 4, knobs={"engine": "chunked"}), 90, H100_SMEM),
        "forced-recurrent": (gdn(1, 4096, knobs={"engine": "recurrent"}), 90, H100_SMEM),
    }
    got = {}
    for (cc, smem) in {(cc, smem) for _, cc, smem in calls.values()}:
        names = [n for n, (_, c, s) in calls.items() if (c, s) == (cc, smem)]
        for name, launches in zip(names, planned_launches(driver, [calls[n][0] for n in names], cc=cc, smem=smem)):
            got[name] = kernels(launches)
    rec = "gdn_recurrent_f16_k128"
    assert got["decode32"] == [(f"{rec}_r8_decode", 0)]
    assert got["decode1"] == [(f"{rec}_r4_decode", 0)]
    assert got["decode-bf16"] == [("gdn_recurrent_bf16_k128_r8_decode", 0)]
    assert got["decode-f32"] == [("gdn_recurrent_f32_k128_r8", 0)]
    assert got["decode-k512"] == [("gdn_recurrent_f16_k512_r2", 0)]
    assert got["decode-k64"] == [("gdn_recurrent_f16_k64_r4", 0)]
    assert got["verify"] == [(f"{rec}_r8", 0)]
    assert got["prefill"] == [("gdn_chunk_prep_f16_d128", 0), ("gdn_chunked_f16_d128_v64", 0), (f"{rec}_r4", 1)]
    assert [k for k, _ in got["prefill-8x2048"][:2]] == ["gdn_chunk_prep_bf16_d128", "gdn_chunked_bf16_d128_v128"]
    assert got["prefill-f32"] == [("gdn_recurrent_f32_k128_r4", 0)]
    assert got["prefill-k64"] == [("gdn_recurrent_f16_k64_r4", 0)]
    for name in ("prefill-per-key", "prefill-sm75", "prefill-sm89", "forced-recurrent"):
        assert got[name] == [(f"{rec}_r4", 0)], name
    assert got["prefill-sm80"][1][0] == "gdn_chunked_f16_d128_v64"
    assert got["forced-chunked"][1][0] == "gdn_chunked_f16_d128_v128"


def test_misaligned_inputs_fall_back_to_the_recurrent_kernel(driver):
    shifted_state = gdn(1, 4096, shift={"initial_state": 4})  # a view 4 bytes in
    shifted_output = gdn(1, 4096, shift={"output": 8})  # the U~ staging copies 16-byte output rows
    shifted_query = gdn(1, 4096, shift={"query": 4})  # 8-byte q/k/v loads
    aligned_8 = gdn(1, 4096, shift={"query": 8, "initial_state": 16})
    results = planned_launches(driver, [shifted_state, shifted_output, shifted_query, aligned_8])
    for launches in results[:3]:
        assert kernels(launches) == [("gdn_recurrent_f16_k128_r4", 0)]
    assert results[3][1]["kernel"] == "gdn_chunked_f16_d128_v64"


def test_a_repeated_call_launches_with_its_own_arrays(driver):
    """Calls of the same shapes reuse the checked call struct (host time at decode); each launches with the
    addresses of its own arrays, and a call of other shapes is planned again."""
    conv = dict(op="conv", dtype="float16", batch=32, tokens=32, channels=1024, capacity=0)
    first, second, other, conv1, conv2 = planned_launches(driver, [gdn(32, 32), gdn(32, 32), gdn(8, 8), conv, conv])
    assert [ln["kernel"] for ln in first] == [ln["kernel"] for ln in second] == ["gdn_recurrent_f16_k128_r8_decode"]
    assert first[0]["grid"] == second[0]["grid"] == (4, 48, 32) and other[0]["grid"][2] == 8
    assert len({first[0]["first_pointer"], second[0]["first_pointer"], other[0]["first_pointer"]}) == 3
    assert [ln["kernel"] for ln in conv1] == [ln["kernel"] for ln in conv2] == ["conv_decode_f16"]
    assert conv1[0]["first_pointer"] != conv2[0]["first_pointer"]


def test_a_bound_call_launches_its_plan_each_time_and_nothing_when_bound(driver):
    """bind_* checks and plans without launching; each call of the bound call launches the plan over the bound
    arrays, as the unbound call of those shapes does. A plan with the chunked kernels needs a bound workspace."""
    conv = dict(op="conv_bound", dtype="float16", batch=32, tokens=32, channels=1024)
    bound0, bound3, unbound, conv0, conv2, chunked, chunked_ws = planned_launches(driver, [
        {**gdn(32, 32), "op": "gdn_bound", "launches": 0}, {**gdn(32, 32), "op": "gdn_bound", "launches": 3},
        gdn(32, 32), {**conv, "launches": 0}, {**conv, "launches": 2},
        {**gdn(2, 120), "op": "gdn_bound", "launches": 1},
        {**gdn(2, 120), "op": "gdn_bound", "launches": 1, "workspace": True}])
    assert bound0 == [] and conv0 == []
    assert [ln["kernel"] for ln in bound3] == ["gdn_recurrent_f16_k128_r8_decode"] * 3
    assert [ln["grid"] for ln in bound3] == [unbound[0]["grid"]] * 3
    assert len({ln["first_pointer"] for ln in bound3}) == 1 and bound3[0]["first_pointer"] != unbound[0]["first_pointer"]
    assert [ln["kernel"] for ln in conv2] == ["conv_decode_f16"] * 2
    assert chunked.startswith("ValueError | GatedDeltaNet: this call runs the chunked kernels; bind it with a workspace")
    assert [ln["kernel"] for ln in chunked_ws] == [ln["kernel"] for ln in planned_launches(driver, [gdn(2, 120)])[0]]


def test_chunked_workspace_follows_the_geometry(driver):
    ws = dict(op="gdn_workspace")
    results = planned_launches(driver, [{**gdn(2, 120), **ws}, {**gdn(32, 32), **ws},
                                        {**gdn(2, 120, knobs={"engine": "recurrent"}), **ws}])
    # per token: W [48, 128] and P [48, 64] in fp16, Q and K [16, 128] in fp16, gamma [48] in fp32
    assert results == [120 * (2 * 48 * 192 + 4 * 16 * 128 + 4 * 48), 0, 0]


def test_what_no_kernel_serves_is_a_plan_error(driver):
    """A knob or shape no kernel serves raises PlanError naming it, a contract violation the contract's
    ContractError with the message ORT gives; nothing is launched."""
    results = planned_launches(driver, [
        gdn(1, 4, dk=640, dv=8), gdn(1, 64, dk=64, dv=64, knobs={"engine": "chunked"}),
        gdn(1, 8192, knobs={"scan_width": 32}), gdn(64, 64, knobs={"rec_rows": 8, "rec_groups": 8}),
        gdn(1, 64, knobs={"prep_heads": 2}), gdn(1, 1, knobs={"rec_rows": 3}), gdn(1, 1, hk=5, hv=8)])
    assert results[6] == "ContractError | " + contract.format_message("GatedDeltaNet", "gdn_heads_v", 8, 5)
    results = results[:6]
    # a given output of another shape: the library finds it in the call that would launch, nothing is launched
    (short,) = planned_launches(driver, [gdn(2, 10, short_output=True)])
    assert short == "ValueError | GatedDeltaNet: output output must be float16 [10, 48, 128], got float16 [9, 48, 128]"
    assert all(isinstance(r, str) and r.startswith("PlanError | GatedDeltaNet: ") for r in results), results
    assert "no supported plan (head_size_qk 640 > 512)" in results[0]
    assert "the chunked engine needs float16/bfloat16, head sizes 128/128" in results[1]
    assert "scan_width 32 is not instantiated: (64, 128)" in results[2]
    assert "exceeds 32 value rows per warp" in results[3]
    assert "prep_heads 2 does not divide the value heads per key head (3)" in results[4]
    assert "rec_rows 3 is not instantiated for key size 128: (1, 2, 4, 8)" in results[5]


def test_scan_width_and_shared_memory_follow_the_grid_and_the_image(driver):
    """The narrow scan while its grid fits one wave of 132 CTAs (1 x 48 heads x 2 halves = 96), then the wide one
    (2 x 48 x 2 = 192 narrow CTAs become 96 wide ones). The sm_90 image (sm_90a) runs the scan on wgmma with its
    own stage layout and, in the narrow width, a producer warpgroup; the other images on mma.sync. Same kernel
    names, so only the shared memory and the block differ."""
    expected = {90: ((211968, 256), (168960, 256)), 80: ((141824, 128), (158208, 256)),
                100: ((141824, 128), (158208, 256))}
    for cc, ((narrow_smem, narrow_threads), (wide_smem, wide_threads)) in expected.items():
        optin = H100_SMEM if cc == 90 else A100_SMEM
        narrow, wide, forced = (r[1] for r in planned_launches(
            driver, [gdn(1, 8192), gdn(2, 8192), gdn(1, 8192, knobs={"scan_width": 128})], cc=cc, smem=optin))
        assert (narrow["kernel"], narrow["grid"], narrow["block"], narrow["smem"]) == \
            ("gdn_chunked_f16_d128_v64", (2, 48, 1), (narrow_threads, 1, 1), narrow_smem), cc
        assert (wide["kernel"], wide["grid"], wide["block"], wide["smem"]) == \
            ("gdn_chunked_f16_d128_v128", (1, 48, 2), (wide_threads, 1, 1), wide_smem), cc
        assert forced["kernel"] == "gdn_chunked_f16_d128_v128"
    assert compiler.target(90) == "sm_90a" and compiler.target(80) == "sm_80"


def test_recurrent_grids_rows_and_groups(driver):
    (prep, chunk, tail), (decode1,), (verify,), (decode,), (verify8,), (longer,), (knob,), (knob_f32,) = \
        planned_launches(driver, [gdn(2, 120), gdn(1, 1, "bfloat16"), gdn(32, 128, capacity=4), gdn(32, 32),
                                  gdn(32, 256, capacity=8), gdn(32, 288), gdn(1, 1, "bfloat16", knobs={"rec_rows": 2}),
                                  gdn(1, 1, "float32")])
    # (100 + 20 + 2 * 63) // 64 = 3 chunks at most for rows of 100 and 20 tokens (the tail pass serves the short row)
    assert (prep["grid"], prep["block"], prep["smem"]) == ((3, 48, 1), (256, 1, 1), 115200)
    assert (chunk["grid"], chunk["block"], chunk["smem"]) == ((1, 48, 2), (256, 1, 1), 168960)
    assert (tail["grid"], tail["block"], tail["smem"], tail["row_groups"]) == ((8, 48, 2), (128, 1, 1), 0, 1)
    assert decode1["kernel"] == "gdn_recurrent_bf16_k128_r4_decode"
    # large batches: 8 value rows per warp; verify shares its prologue over 4 row groups per warp, decode takes one
    # (more blocks in flight, measured faster)
    assert (verify["kernel"], verify["row_groups"], verify["grid"]) == ("gdn_recurrent_f16_k128_r8", 4, (1, 48, 32))
    assert (decode["kernel"], decode["row_groups"], decode["grid"]) == \
        ("gdn_recurrent_f16_k128_r8_decode", 1, (4, 48, 32))
    # verify of up to 8 drafts keeps 4 groups (the block's prologue covers the rows in one pass); rows averaging more
    # take one group per warp, so that the block shares each chunk's prologue
    assert (verify8["kernel"], verify8["row_groups"]) == ("gdn_recurrent_f16_k128_r8", 4)
    assert (longer["kernel"], longer["row_groups"], longer["grid"]) == ("gdn_recurrent_f16_k128_r8", 1, (4, 48, 32))
    # rows per warp without a decode instantiation (a tuning knob) take the general one
    assert knob["kernel"] == "gdn_recurrent_bf16_k128_r2"
    assert knob_f32["kernel"] == "gdn_recurrent_f32_k128_r4"


def test_prep_serves_a_whole_group_per_block_only_on_large_grids(driver):
    # 16 key heads, 3 value heads each: 1 x 1024 is 16 x 16 = 256 group blocks (under 264: a head per block)
    results = planned_launches(driver, [gdn(1, 1024), gdn(1, 1056), gdn(1, 8192), gdn(1, 8192, knobs={"prep_heads": 1}),
                                        gdn(1, 64, knobs={"prep_heads": 3})])
    assert [r[0]["grid"] for r in results] == [(16, 48, 1), (17, 16, 1), (128, 16, 1), (128, 48, 1), (1, 16, 1)]


def test_conv_and_replay_grids(driver):
    state_bytes = 2 * 10240 * 3 * 2
    conv = dict(op="conv", dtype="float16", batch=2, tokens=600, channels=10240)
    results = planned_launches(driver, [
        {**conv, "state_offset": 0},  # in place: the state pass after the output pass
        conv,  # apart: the output grid's first rows are the state pass
        {**conv, "state_offset": state_bytes},  # adjacent, not overlapping
        {**conv, "state_offset": -(state_bytes - 1)},  # one byte of overlap
        dict(conv, dtype="bfloat16", batch=1, tokens=8191),  # from 2048 tokens on: runs of 16 tokens per thread
        dict(conv, batch=1, tokens=256, channels=64),  # at most 256 tokens: a token per thread
        dict(conv, dtype="float32", batch=32, tokens=32),  # decode: one fused launch; 16 bytes of fp32 = 4 channels
        dict(conv, batch=32, tokens=128, capacity=4),  # verify: the fused short-row kernel
        dict(op="replay_gdn", batch=3, hk=16, hv=48, dk=128, dv=100, capacity=4),
        dict(op="replay_conv", dtype="float16", batch=3, channels=10240, state_len=3, capacity=4)])
    in_place, apart, adjacent, overlap, long_runs, short, decode, verify, gdn_replay, conv_replay = results
    # 16 bytes of channels per thread: 10240 channels are 10 blocks of 128 threads at fp16, 20 at fp32
    assert [(ln["kernel"], ln["grid"], ln.get("state_rows")) for ln in in_place] == \
        [("conv_output_f16", (10, 75, 1), 0), ("conv_state_f16", (10, 2, 1), None)]  # runs of 8: 600 / 8 = 75
    for launches in (apart, adjacent):
        assert [(ln["kernel"], ln["grid"], ln["state_rows"]) for ln in launches] == [("conv_output_f16", (10, 77, 1), 2)]
    assert [ln["kernel"] for ln in overlap] == ["conv_output_f16", "conv_state_f16"]
    assert [(ln["kernel"], ln["grid"]) for ln in long_runs] == [("conv_output_bf16", (10, 1 + 512, 1))]
    assert short[0]["grid"] == (1, 1 + 256, 1)
    assert [(ln["kernel"], ln["grid"], ln["block"]) for ln in decode] == [("conv_decode_f32", (20, 32, 1), (128, 1, 1))]
    assert [(ln["kernel"], ln["grid"]) for ln in verify] == [("conv_rows_f16", (10, 32, 1))]
    # GDN replay: 2 warps of 8 value rows per block
    assert [(ln["kernel"], ln["grid"], ln["block"]) for ln in gdn_replay] == [("gdn_replay_f32", (7, 48, 3), (64, 1, 1))]
    assert [(ln["kernel"], ln["grid"]) for ln in conv_replay] == [("conv_replay_f16", (10, 3, 1))]
