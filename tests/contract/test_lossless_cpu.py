"""Speculative decoding through the state ops is lossless on CPU (onnx_hybrid_testing.lossless, small geometry).

Our CPU kernels: a verify call of C + 1 tokens per request gives, bit for bit, the output rows and final state of
C + 1 plain one-token steps; the capsule replay (onnx_hybrid.ops.replay, the unfused rounding that
onnxruntime-genai's host replay computes) of every accepted prefix gives the plain state after as many steps; and
no token count, capture setting, chunk_size, batch neighbour or long prefill row in the same call changes a row's
bits. A replay with the state update fused into one multiply-add (the CUDA rounding) does not reproduce the CPU
states: the probe sees a one-rounding difference.

ORT's own com.microsoft CPU kernels (onnxruntime >= 1.32) go through the same probes; their results are recorded
(``record_property`` and the printed table), not asserted, except that they, too, round the state update unfused
(the fused replay differs from their states), a property of ORT's kernel this package's CPU replay relies on.
"""

import numpy as np
import onnxruntime as ort
import pytest

from onnx_hybrid_testing import lossless

ORT_HAS_OWN_KERNELS = tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 32)
FUSED = "replay (fused fma, CUDA rule) vs plain state"
CASES = [(op, dtype) for op in (lossless.GDN, lossless.CONV) for dtype in ("float", "float16")]


def probe(op, impl, dtype):
    return lossless.run_experiments(op, lossless.Runner(impl), dtype, geometry=lossless.GEOMETRIES["small"],
                                    requests=3, tokens=4, seed=5, prefill_tokens=(40,), chunk_sizes=(1,))


@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{op}-{dtype}" for op, dtype in CASES])
def test_our_cpu_kernels_are_lossless(op, dtype):
    checks = probe(op, "ours", dtype)
    kinds = {c.check for c in checks}
    assert {"verify output row vs plain step", "verify final_state vs plain state",
            "request alone vs in the batch: output", "decode rows + a prefill row: output"} <= kinds
    assert any(k.startswith("replay") for k in kinds)
    differing = [c for c in checks if not c.equal and c.check != FUSED]
    assert not differing, "\n".join(f"{c.check} [{c.item}]: max |diff| {c.max_abs:.3g}, {c.max_ulp} ulp"
                                    for c in differing)
    if op == lossless.GDN:  # negative control: the probe sees a one-rounding change of the state update
        fused = [c for c in checks if c.check == FUSED]
        assert len(fused) == 4 and not any(c.equal for c in fused)
        assert all(c.max_abs < 1e-6 for c in fused)


@pytest.mark.skipif(not ORT_HAS_OWN_KERNELS, reason="ORT's own CPU kernels for these ops arrived in onnxruntime 1.32")
@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{op}-{dtype}" for op, dtype in CASES])
def test_ort_cpu_kernels_recorded(op, dtype, record_property):
    checks = probe(op, "ort", dtype)
    summary = lossless.summarize(checks)
    record_property("ort_version", ort.__version__)
    record_property("summary", summary)
    print(f"\nonnxruntime {ort.__version__} CPU, {op} {dtype}:")
    for row in summary:
        print(f"  {row['check']:<58} {row['equal']}/{row['items']} equal, max |diff| {row['max_abs']:.3g}")
    assert len(checks) > 50  # every probe ran
    if op == lossless.GDN:
        fused = [c for c in checks if c.check == FUSED]
        assert fused and not any(c.equal for c in fused), (
            f"onnxruntime {ort.__version__}'s CPU GatedDeltaNet now matches a fused multiply-add replay: its state "
            "rounding changed, so onnx_hybrid.ops.replay (unfused) no longer reproduces it")
    equal = np.mean([c.equal for c in checks if c.check != FUSED])
    record_property("fraction_bitwise_equal", float(equal))


def test_fma_emulation_rounds_once():
    """lossless.fma_f32 is the correctly rounded a * b + c (checked against exact rationals), which a float64
    product-and-add then cast to float32 is not always (double rounding)."""
    from fractions import Fraction

    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(400).astype(np.float32) for _ in range(2))
    c = (rng.standard_normal(400) * 1e-3).astype(np.float32)
    # Built to double-round: (1 + 2^-12)^2 + 2^-60 = 1 + 2^-11 + 2^-24 + 2^-60 lies just above a float32 tie, and
    # float64 drops the 2^-60, leaving the tie (which rounds down to even instead of up).
    a, b, c = (np.append(x, np.float32(v)) for x, v in ((a, 1 + 2**-12), (b, 1 + 2**-12), (c, 2**-60)))
    assert np.float32(np.float64(a[-1]) * np.float64(b[-1]) + np.float64(c[-1])) == np.float32(1 + 2**-11)
    got = lossless.fma_f32(a, b, c)
    assert got[-1] == np.float32(1 + 2**-11 + 2**-23)
    for x, y, z, r in zip(a, b, c, got):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        nearest = min((np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))),
                      key=lambda v: abs(Fraction(float(v)) - exact))
        assert nearest == r, (x, y, z, r)
    assert lossless.ulp_distance(got, got).max() == 0
