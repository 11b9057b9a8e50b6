"""The shared library itself: interface, dependencies, registration, control functions, memory safety."""

import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from native_util import GDN, run_gdn
from onnx_hybrid.ops import library, library_path, register
from onnx_hybrid_testing import single_op
from onnx_hybrid.ops.contract import MS_DOMAIN
from onnx_hybrid_testing.cases import random_gdn_case
from file_modules import ROOT



def tool_output(*command):
    if not shutil.which(command[0]):
        pytest.fail(f"{command[0]} (binutils) is needed to inspect the library")
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_library_path_is_absolute_and_stable():
    path = library_path()
    assert os.path.isabs(path) and os.path.isfile(path) and path == library_path()


def test_exports_only_the_entry_point_and_control_functions():
    symbols = re.findall(r"^\S+ [A-Za-z] (\S+)$", tool_output("nm", "-D", "--defined-only", library_path()), re.M)
    assert "RegisterCustomOps" in symbols
    assert all(s == "RegisterCustomOps" or s.startswith("onnx_hybrid_") for s in symbols), symbols


def test_needs_only_glibc_and_libgcc_s():
    # libstdc++ is linked in (build_config.PORTABLE_LINK_ARGS): the wheel's library runs beside any other.
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", tool_output("readelf", "-d", library_path())))
    assert needed <= {"libgcc_s.so.1", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"}, needed
    assert "libc.so.6" in needed


def test_registers_into_many_session_options_and_twice_into_one():
    case = random_gdn_case(np.random.default_rng(0), [3, 40])
    model = single_op.single_op_model(GDN, case.feeds, case.attributes).SerializeToString()
    sessions = []
    for _ in range(4):
        so = ort.SessionOptions()
        register(so)
        register(so)  # idempotent on the same options
        sessions.append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]))
    results = [single_op.run_session(s, case.feeds)["output"] for s in sessions]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_control_functions():
    lib = library.control()
    assert lib.onnx_hybrid_abi_version() == library.ABI_VERSION
    assert library.cpu_isa() in ("avx512-vnni", "avx512", "avx2", "generic")
    with pytest.raises(ValueError, match="unknown key or value"):
        library.set_option("no_such_option", "1")
    with pytest.raises(ValueError, match="cpu_engine"):
        library.set_option("cpu_engine", "fastest")


def test_input_shapes_lent_and_copied_agree():
    """ORT >= 1.24 lends input shapes (read from its OrtApi slot); the API-21 copy stays for older runtimes.
    Both give the same outputs (with the gates in fp16, which both must read as fp16), and the same error for a
    tensor too deep for the inline shape."""
    case = random_gdn_case(np.random.default_rng(2), [3, 1, 6], capacity=2, capture=[2, 1, 2], dtype="float16")
    case.feeds.update({k: case.feeds[k].astype(np.float16) for k in ("decay", "beta")})
    model = single_op.single_op_model(GDN, case.feeds, case.attributes).SerializeToString()
    deep = {**case.feeds, "beta": case.feeds["beta"].reshape((1,) * 8 + case.feeds["beta"].shape)}
    deep_model = single_op.single_op_model(GDN, deep, case.attributes, validate=False).SerializeToString()
    lends = tuple(int(p) for p in ort.__version__.split(".")[:2]) >= (1, 24)
    results = {}
    try:
        for mode, expected in (("copied", "copied"), ("auto", "lent" if lends else "copied")):
            library.set_option("input_shapes", mode)
            so = ort.SessionOptions()
            register(so)
            assert library.input_shapes() == expected
            session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            results[expected] = single_op.run_session(session, case.feeds)
            deep_session = ort.InferenceSession(deep_model, so, providers=["CPUExecutionProvider"])
            with pytest.raises(Exception, match=r"input 'beta' has rank 10; the contract's tensors have rank 4"):
                single_op.run_session(deep_session, deep)
    finally:
        library.set_option("input_shapes", "auto")
        register(ort.SessionOptions())
    first, *rest = results.values()
    for other in rest:
        for name in first:
            np.testing.assert_array_equal(other[name], first[name])
    assert lends == ("lent" in results)


def test_com_microsoft_alias_is_opt_in_and_runs_our_kernels():
    case = random_gdn_case(np.random.default_rng(1), [5, 40], capacity=2, capture=[2, 1])
    ours = run_gdn(case)
    model = single_op.single_op_model(GDN, case.feeds, case.attributes, domain=MS_DOMAIN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library.enable_com_microsoft_alias()
    try:
        own_kernels = tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 32)
        assert any("overrides them" in str(w.message) for w in caught) == own_kernels
        aliased = single_op.run_session(single_op.make_session(model), case.feeds)
    finally:
        library.enable_com_microsoft_alias(False)
    for name, value in ours.items():
        np.testing.assert_array_equal(aliased[name], value)  # bitwise: the very same kernels ran
    # Off again: options registered from now on carry only the onnx_hybrid domain.
    so = ort.SessionOptions()
    register(so)
    if not own_kernels:
        with pytest.raises(Exception):
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_com_microsoft_alias_from_the_environment():
    code = ("import numpy as np\n"
            "from onnx_hybrid_testing import single_op\n"
            "from onnx_hybrid_testing.cases import random_gdn_case\n"
            "c = random_gdn_case(np.random.default_rng(2), [4, 1])\n"
            "a = single_op.run_single_op('GatedDeltaNet', c.feeds, c.attributes, domain='com.microsoft')\n"
            "b = single_op.run_single_op('GatedDeltaNet', c.feeds, c.attributes)\n"
            "assert all(np.array_equal(a[k], b[k]) for k in a)\n")
    env = {**os.environ, "ONNX_HYBRID_REGISTER_COM_MICROSOFT": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_missing_library_error_says_how_to_build():
    code = "from onnx_hybrid.ops import library_path\nlibrary_path()\n"
    env = {**os.environ, "ONNX_HYBRID_LIBRARY": "/nonexistent/libonnx_hybrid_ortops.so"}
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode != 0 and "pip install -e ." in result.stderr


def test_malformed_input_is_memory_safe_under_asan(asan_quick_run):
    """The quick selection of the ``asan`` tests (malformed offsets and paged metadata, a few valid edge calls)
    against the AddressSanitizer build, as `make asan` runs them all; the build and the child run beside the rest
    of the suite (tests/native/conftest.py)."""
    if not shutil.which("g++"):
        pytest.fail("g++ is needed to build the AddressSanitizer copy of the library")
    status, output = asan_quick_run()
    assert status == 0, output[-10000:]
    assert " passed" in output and "failed" not in output


def test_version_guard_returns_a_status_on_an_older_runtime():
    """RegisterCustomOps asks for API 21; a runtime without it gets an error status, not silence.

    A fake OrtApiBase stands in for an old ORT: GetApi(21) returns NULL, GetApi(1) a table whose first
    entry (OrtApi::CreateStatus) records the message.
    """
    import ctypes

    messages = []
    create_status = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)(
        lambda code, text: messages.append((code, text.decode())) or 0xBAD)
    table = (ctypes.c_void_p * 1)(ctypes.cast(create_status, ctypes.c_void_p))
    get_api = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)(
        lambda version: ctypes.addressof(table) if version == 1 else None)
    get_version = ctypes.CFUNCTYPE(ctypes.c_char_p)(lambda: b"1.20.1")

    class OrtApiBase(ctypes.Structure):
        _fields_ = [("GetApi", ctypes.c_void_p), ("GetVersionString", ctypes.c_void_p)]

    base = OrtApiBase(ctypes.cast(get_api, ctypes.c_void_p), ctypes.cast(get_version, ctypes.c_void_p))
    register_custom_ops = library.control().RegisterCustomOps
    register_custom_ops.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    register_custom_ops.restype = ctypes.c_void_p
    assert register_custom_ops(None, ctypes.addressof(base)) == 0xBAD
    assert messages == [(1, "onnx_hybrid: needs ONNX Runtime API 21 (ORT >= 1.21)")]  # 1 = ORT_FAIL
