"""The library's CUDA variants, checked without a GPU: the launcher's parameter structs and launch plans
agree with onnx_hybrid.cuda_ops.plan (what the kernels were tested with), images are handed over by copy
and never replaced, prepare_cuda compiles offline or loads a prepared folder, and a CUDA session request
on a CPU-only ORT still runs our CPU kernels. The GPU half is tests/cuda/test_cuda_ep.py."""

import ctypes
import itertools

import numpy as np
import onnxruntime as ort
import pytest

from native_util import GDN, check_gdn
from onnx_hybrid import cli
from onnx_hybrid.cuda_ops import plan
from onnx_hybrid.ops import contract, library
from onnx_hybrid_testing import single_op
from onnx_hybrid_testing.cases import random_gdn_case

# (arch, opt-in shared memory per block): H100/H200, A100, RTX 30xx/40xx (too little for the chunked
# kernel), Turing (too old for it).
DEVICES = [(90, 232448), (80, 166912), (86, 101376), (75, 65536)]
DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("struct", [plan.GdnParams, plan.ConvParams])
def test_param_structs_match_the_ctypes_mirror(struct):
    layout = library.cuda_struct_layout(struct.__name__)
    assert layout.pop("size") == ctypes.sizeof(struct)
    expected = {name: getattr(struct, name).offset for name, _ in struct._fields_}
    assert layout == expected  # same fields, same order, same offsets


def test_unknown_struct_is_an_error():
    with pytest.raises(ValueError, match="unknown struct 'Nope'"):
        library.cuda_struct_layout("Nope")


def gdn_geometry(dims):
    """The geometry and params the library's planner builds from the same dims (Hq = Hk = hk, default Hv)."""
    batch, total, hv, dk, dv, per_key, aligned, *hk = dims
    hk = hk[0] if hk else hv
    geo = contract.GdnGeometry("ragged", batch, total, hk, hk, hv, dk, dv, bool(per_key), 0, (), (), 0)
    return geo, plan.GdnParams(state_in=None if aligned else 8)


def python_gdn_plan(dims, dtype, arch, smem, engine):
    geo, params = gdn_geometry(dims)
    return [(ln.kernel, ln.grid, ln.block, ln.smem, ln.params.tail_only, ln.params.row_groups)
            for ln in plan.gdn_plan(geo, dtype, params, arch=arch, smem_optin=smem, engine=engine)]


def gdn_geometries():
    rng = np.random.default_rng(7)
    fixed = [  # decode and prefill of the real models, odd sizes, the chunked threshold, big batches, fewer
        # tokens than rows
        (1, 1, 32, 128, 128, 0, 1), (64, 64, 48, 128, 128, 0, 1), (4, 4096, 32, 128, 128, 0, 1),
        (3, 95, 16, 128, 128, 0, 1), (3, 96, 16, 128, 128, 0, 1), (2, 200, 8, 128, 128, 0, 0),
        (2, 200, 8, 128, 128, 1, 1), (5, 17, 3, 96, 80, 0, 1), (1, 8, 2, 512, 64, 0, 1), (7, 7, 5, 33, 31, 1, 1),
        (512, 512, 64, 128, 128, 0, 1), (256, 256, 32, 256, 256, 0, 1), (2, 0, 4, 64, 64, 0, 1),
        (3, 2, 4, 512, 64, 0, 1),
        # verify of up to 8 drafts, and rows a little longer (one row group per warp)
        (32, 256, 48, 128, 128, 0, 1), (32, 288, 48, 128, 128, 0, 1), (128, 1152, 48, 256, 128, 0, 1),
        # GVA (Hv = 3 Hk, 2 Hk): the prep kernel serves a whole group per block from 264 shared blocks up
        (1, 8192, 48, 128, 128, 0, 1, 16), (4, 1024, 48, 128, 128, 0, 1, 16), (4, 1000, 48, 128, 128, 0, 1, 16),
        (1, 1056, 48, 128, 128, 0, 1, 16), (1, 1024, 48, 128, 128, 0, 1, 16), (3, 4000, 32, 128, 128, 0, 1, 16),
    ]
    drawn = [(int(rng.integers(1, 300)), 0, int(rng.integers(1, 65)), int(rng.choice([16, 64, 100, 128, 256, 300])),
              int(rng.integers(1, 257)), int(rng.integers(0, 2)), int(rng.integers(0, 2))) for _ in range(25)]
    drawn = [(b, b * int(rng.integers(0, 80)), *rest) for b, _, *rest in drawn]
    return fixed + drawn


def test_gdn_plan_matches_cuda_ops_plan():
    plans = errors = 0
    for dims, dtype, (arch, smem), engine in itertools.product(gdn_geometries(), DTYPES, DEVICES,
                                                               ["auto", "recurrent", "chunked"]):
        try:
            expected = python_gdn_plan(dims, dtype, arch, smem, engine)
        except plan.PlanError as error:
            with pytest.raises(ValueError) as raised:
                library.cuda_plan("gdn", dtype, dims, arch=arch, smem_optin=smem, engine=engine)
            # the same reason, without the op-name prefix that the kernel's status adds
            assert str(raised.value).removeprefix("onnx_hybrid_cuda_plan: ") == str(error).removeprefix(
                f"{GDN}: "), dims
            errors += 1
            continue
        assert library.cuda_plan("gdn", dtype, dims, arch=arch, smem_optin=smem, engine=engine) == expected, \
            (dims, dtype, arch, engine)
        plans += 1
    assert plans > 800 and errors > 100  # both sides of the comparison were exercised


def test_gdn_workspace_matches_cuda_ops_plan():
    sized = 0
    for dims, dtype, (arch, smem), engine in itertools.product(gdn_geometries(), DTYPES, DEVICES,
                                                               ["auto", "recurrent", "chunked"]):
        geo, params = gdn_geometry(dims)
        try:
            chunked = plan.gdn_uses_chunked(geo, dtype, params, arch=arch, smem_optin=smem, engine=engine)
        except plan.PlanError:
            continue  # the plan comparison checks the error
        expected = plan.chunk_workspace_bytes(geo) if chunked else 0
        assert library.cuda_gdn_workspace_bytes(dtype, dims, arch=arch, smem_optin=smem, engine=engine) == \
            expected, (dims, dtype, arch, engine)
        sized += expected > 0
    assert sized > 20  # chunked plans were compared, not only zeros


# (batch, tokens, channels): both sides of one token per row (decode), of CONV_ROW_TOKENS (8 per row), of
# CONV_SHORT_TOKENS (256) and of CONV_LONG_TOKENS (2048).
CONV_DIMS = [(1, 1, 1), (4, 4, 8192), (4, 5, 8192), (3, 100, 129), (8, 256, 64), (8, 257, 64), (32, 256, 64),
             (32, 257, 64), (64, 1000, 4096), (1, 2047, 64), (1, 2048, 64), (1, 4096, 10240), (2, 0, 10)]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dims", CONV_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_plan_matches_cuda_ops_plan(dims, dtype, in_place):
    batch, total, channels = dims
    geo = contract.ConvGeometry(batch, total, channels, 4, 3, 0)
    # the library's stand-in addresses: final_state in place, or far from initial_state
    params = plan.ConvParams(state_in=1 << 20, state_out=1 << 20 if in_place else 1 << 40)
    expected = [(ln.kernel, ln.grid, ln.block, ln.smem, ln.params.state_rows, 0)
                for ln in plan.conv_plan(geo, dtype, params)]
    assert library.cuda_plan("conv", dtype, (*dims, int(in_place)), arch=90, smem_optin=232448) == expected


def test_planned_kernels_exist_in_the_image():
    names = set(plan.kernel_names())
    for dims, dtype in itertools.product(gdn_geometries(), DTYPES):
        for engine in ("auto", "recurrent"):
            try:
                launches = library.cuda_plan("gdn", dtype, dims, arch=90, smem_optin=232448, engine=engine)
            except ValueError:
                continue
            assert {ln[0] for ln in launches} <= names
    planned = {ln[0] for dims, dtype, in_place in itertools.product(CONV_DIMS, DTYPES, (0, 1))
               for ln in library.cuda_plan("conv", dtype, (*dims, in_place), arch=90, smem_optin=232448)}
    assert {"conv_decode_bf16", "conv_rows_f16", "conv_output_f32", "conv_state_f32"} <= planned <= names


# Images live for the whole process (they are never replaced), so these tests use compute capabilities no
# GPU has (1.x) and leave the real ones to prepare_cuda.
def test_set_cuda_image_copies_the_bytes_and_never_replaces_an_image():
    original = b"\x7fELF image one"
    buffer = ctypes.create_string_buffer(original, len(original))
    lib = library.control()
    assert lib.onnx_hybrid_set_cuda_image(1, 0, buffer, len(original)) == 0
    buffer[0:4] = b"XXXX"  # the library kept its own copy: the original bytes are still "the same image"
    library.set_cuda_image(10, original)
    with pytest.raises(library.CudaPrepareError, match=r"a different image is already set for sm_10"):
        library.set_cuda_image(10, bytes(buffer))
    library.set_cuda_image(11, bytes(buffer))  # another capability is independent
    assert {10, 11} <= set(library.cuda_images())


def test_set_cuda_image_rejects_empty_images_and_bad_capabilities():
    with pytest.raises(library.CudaPrepareError, match="non-empty image"):
        library.set_cuda_image(12, b"")
    lib = library.control()
    assert lib.onnx_hybrid_set_cuda_image(1, 10, b"x", 1) == -1
    assert lib.onnx_hybrid_set_cuda_image(0, 0, b"x", 1) == -1
    assert lib.onnx_hybrid_set_cuda_image(2**31 - 1, 0, b"x", 1) == -1  # 10 * major would overflow an int


def test_prepare_cuda_compiles_offline_for_a_given_arch():
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    assert library.prepare_cuda(arch=90) == [90]
    assert library.prepare_cuda(arch=90) == [90]  # the same bytes again (from the kernel cache): accepted
    assert 90 in library.cuda_images()


def test_prepare_cuda_loads_a_prepared_folder(tmp_path, monkeypatch):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    folder = tmp_path / "cubins"
    assert cli.main(["prepare-cuda", "--arch", "90", "-o", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["sm90.cubin"]
    assert library.prepare_cuda(directory=folder) == [90]
    monkeypatch.setenv(library.IMAGES_ENV, str(folder))
    assert library.prepare_cuda() == [90]
    so = ort.SessionOptions()
    library.register(so)  # with the variable set, registration loads the folder (same bytes: accepted)


def test_prepare_cuda_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(library.CudaPrepareError, match="no sm<arch>.cubin in .*onnx-hybrid prepare-cuda"):
        library.prepare_cuda(directory=tmp_path)
    monkeypatch.delenv(library.IMAGES_ENV, raising=False)
    if not library._visible_cuda_archs():
        with pytest.raises(library.CudaPrepareError, match="no CUDA device visible"):
            library.prepare_cuda()


def test_prepare_cuda_cli_rejects_an_arch_nvrtc_lacks(tmp_path, capsys):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    assert cli.main(["prepare-cuda", "--arch", "91", "-o", str(tmp_path)]) == cli.USAGE_ERROR
    assert "cannot target sm_91" in capsys.readouterr().err


def test_cuda_gdn_engine_option():
    for value in ("chunked", "recurrent", "auto"):
        library.set_option("cuda_gdn_engine", value)
    with pytest.raises(ValueError, match="cuda_gdn_engine = auto|chunked|recurrent"):
        library.set_option("cuda_gdn_engine", "fast")


def test_cuda_programmatic_launch_option():
    library.set_option("cuda_programmatic_launch", "off")
    library.set_option("cuda_programmatic_launch", "auto")
    with pytest.raises(ValueError, match=r"cuda_programmatic_launch = auto\|off"):
        library.set_option("cuda_programmatic_launch", "on")


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_cuda_session_request_falls_back_to_our_cpu_kernels():
    """On a CPU-only ORT the CUDA variants are registered but never chosen; the CPU kernels run."""
    if "CUDAExecutionProvider" in ort.get_available_providers() and library._visible_cuda_archs():
        pytest.skip("a usable CUDA EP is present: tests/cuda/test_cuda_ep.py covers this host")
    case = random_gdn_case(np.random.default_rng(3), [5, 1, 40])
    model = single_op.single_op_model(GDN, case.feeds, case.attributes).SerializeToString()
    so = ort.SessionOptions()
    library.register(so)
    session = ort.InferenceSession(model, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    check_gdn(case, single_op.run_session(session, case.feeds))


def test_register_warns_but_works_when_the_kernels_cannot_be_prepared(monkeypatch):
    """A GPU the installed NVRTC cannot target must not break CPU sessions: registration warns."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    monkeypatch.delenv(library.IMAGES_ENV, raising=False)
    # 2.9: a major no image here has (the 1.x images of the tests above would serve a 1.9 device)
    monkeypatch.setattr(library, "_visible_cuda_archs", lambda: [29])
    so = ort.SessionOptions()
    with pytest.warns(RuntimeWarning, match="CUDA kernels could not be prepared .*sm_29"):
        library.register(so)
    case = random_gdn_case(np.random.default_rng(4), [2, 3])
    model = single_op.single_op_model(GDN, case.feeds, case.attributes).SerializeToString()
    check_gdn(case, single_op.run_session(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]),
                                          case.feeds))


def test_has_cuda_image_applies_the_launchers_rule_to_the_folders(tmp_path, monkeypatch):
    """register() asks the library, not a copy of its rule: an sm75 image in $ONNX_HYBRID_CUDA_IMAGES serves 7.5
    and 7.7 (later minors of its major), not 7.2 nor 6.x; the library reads the variable at each call."""
    (tmp_path / "sm75.cubin").write_bytes(b"\x7fELF stand-in")
    assert not library.has_cuda_image(75)
    monkeypatch.setenv(library.IMAGES_ENV, str(tmp_path))
    assert library.has_cuda_image(75) and library.has_cuda_image(77)
    assert not library.has_cuda_image(72) and not library.has_cuda_image(65)
