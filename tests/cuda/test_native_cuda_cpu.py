"""The library's CUDA variants, checked without a GPU: images are handed over by copy and never replaced,
prepare_cuda compiles offline or loads a prepared folder, and a CUDA session request on a CPU-only ORT still runs
our CPU kernels. The planner: tests/cuda/test_launch_plan.py. The GPU half is tests/cuda/test_cuda_ep.py."""

import ctypes

import numpy as np
import onnxruntime as ort
import pytest

from native_util import GDN, check_gdn
from onnx_hybrid import cli
from onnx_hybrid.ops import library
from onnx_hybrid_testing import single_op
from onnx_hybrid_testing.cases import random_gdn_case

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
