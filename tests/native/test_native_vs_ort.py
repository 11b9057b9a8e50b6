"""Our kernels against ONNX Runtime 1.32's own com.microsoft CPU kernels: the same node, domain switched,
in a plain session without our library (docs/op-contract.md#onnx-runtimes-own-kernels). Independent
implementations, so the check is within tolerance, not bitwise."""

import numpy as np
import onnxruntime as ort
import pytest

from native_util import CONV, GDN
from onnx_hybrid.ops.contract import MS_DOMAIN
from onnx_hybrid_testing.single_op import run_single_op
from onnx_hybrid_testing.cases import random_conv_case, random_gdn_case

pytestmark = pytest.mark.skipif(tuple(int(x) for x in ort.__version__.split(".")[:2]) < (1, 32),
                                reason="ORT's own CPU kernels for these ops arrived in onnxruntime 1.32")

TOL = {"float": 2e-5, "float16": 3e-2, "bfloat16": 3e-2}

GDN_CASES = {
    "ragged": dict(lengths=[40, 110, 50]),
    "ragged_short_rows": dict(lengths=[1, 3, 70, 1]),
    "capture": dict(lengths=[3, 5, 1], capacity=4, capture=[-1, 9, 2]),
    "capture_long": dict(lengths=[70, 4], capacity=8, capture=[8, 3], num_heads_v=6, num_heads_q=2),
    "gate_none_beta_none": dict(lengths=[9, 40], gate_activation="none", beta_activation="none"),
    "gated_rule": dict(lengths=[9, 40], update_rule="gated"),
    "delta_rule": dict(lengths=[9, 40], update_rule="delta", gate_activation="none"),
    "linear_rule": dict(lengths=[9, 40], update_rule="linear", gate_activation="none"),
    "packed": dict(lengths=[33, 4], layout="packed"),
    "rank4": dict(lengths=[64, 64], layout="rank4"),
    "dk128": dict(lengths=[70, 1], num_heads_q=2, num_heads_v=2, head_size_k=128, head_size_v=128),
    "fp16": dict(lengths=[5, 70], dtype="float16"),
    "bf16": dict(lengths=[5, 70], dtype="bfloat16", capacity=2, capture=[2, 2]),
}


def compare(op, case, dtype):
    ours = run_single_op(op, case.feeds, case.attributes)
    theirs = run_single_op(op, case.feeds, case.attributes, domain=MS_DOMAIN, with_library=False)
    assert set(ours) == set(theirs)
    for name in ours:
        tol = TOL[dtype] if name == "output" else TOL["float"]
        np.testing.assert_allclose(ours[name].astype(np.float64), theirs[name].astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=f"{name}: {case.describe()}")


@pytest.mark.parametrize("name", sorted(GDN_CASES))
def test_gdn_agrees_with_ort(name):
    kwargs = dict(GDN_CASES[name])
    case = random_gdn_case(np.random.default_rng(len(name)), kwargs.pop("lengths"), **kwargs)
    compare(GDN, case, kwargs.get("dtype", "float"))


CONV_CASES = {
    "ragged_capture": dict(lengths=[10, 5, 1, 8], capacity=8, capture=[-1, 0, 3, 9]),
    "dilation_2_no_bias": dict(lengths=[10, 2, 7], dilation=2, with_bias=False),
    "decode": dict(lengths=[1] * 5, kernel_size=4, activation="none"),
    "wide": dict(lengths=[6, 9], channels=513),
    "fp16": dict(lengths=[10, 5, 1, 8], dtype="float16"),
    "bf16": dict(lengths=[10, 5, 1, 8], dtype="bfloat16", capacity=2, capture=[2, 2, 2, 2]),
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv_agrees_with_ort(name):
    kwargs = dict(CONV_CASES[name])
    case = random_conv_case(np.random.default_rng(len(name)), kwargs.pop("lengths"), **kwargs)
    compare(CONV, case, kwargs.get("dtype", "float"))
