"""The block-wise round-to-nearest quantizer (onnx_hybrid/exporter/quantize.py) in float64: every dequantized
weight is the nearest code's value (within half a step of the weight, but for the clipped far end of a symmetric
block's shorter side), symmetric and asymmetric, every block size, K that leaves the last block partial; the
packed layouts ONNX Runtime reads; and the same scales, codes and zero points as ONNX Runtime's own quantizer."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_hybrid.exporter.quantize import (BLOCK_SIZES, QuantSpec, columns_zero_points, dequantize, pack, quantize,
                                           stored_shapes, unpack)

ort_quantizer = pytest.importorskip("onnxruntime.capi._pybind_state")


def _weights(rows: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, k)) * rng.uniform(0.01, 3.0, size=(rows, 1))
    w[0, :] = 0.0  # an all-zero row: scale 0, every code the zero point
    w[1, :] = np.abs(w[1, :])  # one-signed rows: the asymmetric range still holds 0
    w[2, :] = -np.abs(w[2, :])
    return w


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("k", [1, 33, 128, 201])
def test_dequantized_is_round_to_nearest(bits, symmetric, block_size, k):
    spec = QuantSpec(bits, block_size, symmetric)
    w = _weights(6, k, seed=bits * 1000 + block_size + k)
    q = quantize(w, spec, np.float64)
    nb = -(-k // block_size)
    assert q.codes.dtype == np.uint8 and q.codes.shape == (6, nb, block_size * bits // 8)
    assert q.scales.shape == (6, nb) and q.scales.dtype == np.float64
    assert (q.zero_points is None) == symmetric
    got = dequantize(q, spec, k)

    # The oracle, written out: per block, scale and zero point, then each value's nearest code.
    padded = np.zeros((6, nb * block_size))
    padded[:, :k] = w
    blocks = padded.reshape(6, nb, block_size)
    if symmetric:
        # The largest magnitude (ties: the negative value) on code 0: ONNX Runtime's symmetric block scale.
        z = 2 ** (bits - 1)
        high, low = blocks.max(-1), blocks.min(-1)
        scale = np.where(np.abs(high) > np.abs(low), high, low) / -z + 0.0
        zero = np.full_like(scale, z)
        lo, hi = 0, 2 ** bits - 1
    else:
        low, high = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
        scale = (high - low) / (2 ** bits - 1)
        zero = np.where(scale > 0, np.floor(-low / np.where(scale > 0, scale, 1) + 0.5), 0)
        lo, hi = 0, 2 ** bits - 1
    safe = np.where(scale != 0, scale, 1)[..., None]
    codes = np.clip(np.floor(blocks / safe + zero[..., None] + 0.5), lo, hi)  # halves up
    want = ((codes - zero[..., None]) * scale[..., None]).reshape(6, -1)[:, :k]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(q.scales, scale)

    step = np.abs(np.repeat(scale, block_size, axis=1)[:, :k])
    err = np.abs(got - w)
    # Within half a step, except (symmetric) values of the extreme's other sign past the last code: a step at most.
    clipped = np.zeros(w.shape, bool)
    if symmetric:
        extreme = np.repeat(np.where(np.abs(high) > np.abs(low), high, low), block_size, axis=1)[:, :k]
        clipped = (np.sign(w) == -np.sign(extreme)) & (np.abs(w) > (z - 0.5) * step)
    assert np.all(err <= np.where(clipped, step, step / 2) * (1 + 1e-12)), np.max(err / step)
    assert np.mean(clipped) < 0.01  # rare: only a block's far end on its shorter side
    np.testing.assert_array_equal(got[0], 0.0)
    # The padding of the last block holds the zero point (dequantizes to 0).
    all_codes = unpack(q.codes, bits, block_size).reshape(6, -1)
    zeros = zero.astype(np.uint8)[:, -1:]
    np.testing.assert_array_equal(all_codes[:, k:], np.broadcast_to(zeros, all_codes[:, k:].shape))


def test_scales_rounded_to_their_type_before_the_codes():
    """fp16 scales: the codes are rounded against the stored fp16 scale, so dequantization with it stays
    within half a (stored) step."""
    spec = QuantSpec(4, 32, True)
    w = _weights(4, 96, seed=3).astype(np.float32)
    q = quantize(w, spec, np.float16)
    assert q.scales.dtype == np.float16
    step = np.abs(np.repeat(q.scales.astype(np.float64), 32, axis=1))
    err = np.abs(dequantize(q, spec, 96) - w)
    inside = np.abs(w) <= 7.5 * step * (1 - 1e-3)  # away from the clipped far end of the shorter side
    assert np.all(err[inside] <= step[inside] / 2 * (1 + 1e-6) + 1e-7)
    assert np.all(err <= step * (1 + 1e-6) + 1e-7)


def test_packing_is_low_nibble_first():
    codes = np.array([[1, 2, 3, 4, 15]], np.uint8)
    np.testing.assert_array_equal(pack(codes, 4), [[0x21, 0x43, 0x0F]])
    np.testing.assert_array_equal(unpack(pack(codes, 4), 4, 5), codes)
    np.testing.assert_array_equal(pack(codes, 8), codes)


def test_stored_shapes_per_form():
    spec = QuantSpec(4, 32, symmetric=False)
    assert stored_shapes("matmul", (48, 100), spec) == ((48, 4, 16), (48, 4), (48, 2))
    assert stored_shapes("gather", (160, 64), spec) == ((160, 32), (160, 2), (160, 1))
    assert stored_shapes("experts", (6, 48, 64), spec) == ((6, 48, 32), (6, 48, 2), (6, 48, 1))
    columns = QuantSpec(4, 24, symmetric=False)
    assert stored_shapes("columns", (6, 64, 24), columns) == ((6, 64, 12), (6, 64), (6, 32))
    assert stored_shapes("matmul", (8, 64), QuantSpec(8, 64)) == ((8, 1, 64), (8, 1), None)
    with pytest.raises(ValueError, match="one block spanning K=24"):
        stored_shapes("columns", (6, 64, 24), QuantSpec(4, 16))


def test_columns_zero_points_pack_along_n():
    spec = QuantSpec(4, 24, symmetric=False)
    per_row = pack(np.array([[3], [5], [7], [9], [11], [13]], np.uint8), 4)  # rows of E=2 experts, N=3
    np.testing.assert_array_equal(columns_zero_points(per_row, spec, 3), [[0x53, 0x07], [0xB9, 0x0D]])


@pytest.mark.parametrize("bad", [dict(bits=3), dict(block_size=0)])
def test_spec_rejects(bad):
    with pytest.raises(ValueError, match="bits|block_size"):
        QuantSpec(**bad)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("scale_type", [np.float32, np.float16])
def test_same_blocks_as_onnxruntimes_quantizer(bits, symmetric, block_size, scale_type):
    """ONNX Runtime's MatMulNBits quantizer (what onnxruntime-genai's builder calls) on the same weights: equal
    scales, zero points and codes, but for the padding of a partial last block (ours holds the zero point)."""
    n, k = 40, 3 * block_size + 17
    w = _weights(n, k, seed=bits + block_size).astype(scale_type)
    blocks, blob = -(-k // block_size), block_size * bits // 8
    codes = np.zeros((n, blocks, blob), np.uint8)
    zero_points = np.zeros(n * -(-blocks * bits // 8), np.uint8)
    scales = np.zeros(n * blocks, scale_type)
    quantize_ort = ort_quantizer.quantize_matmul_4bits if bits == 4 else ort_quantizer.quantize_matmul_8bits
    quantize_ort(codes, np.ascontiguousarray(w.T), scales, zero_points, block_size, n, k, symmetric)

    ours = quantize(w.astype(np.float32), QuantSpec(bits, block_size, symmetric), scale_type)
    np.testing.assert_array_equal(ours.scales, scales.reshape(n, blocks))
    real = unpack(ours.codes, bits, block_size).reshape(n, -1)[:, :k]
    np.testing.assert_array_equal(real, unpack(codes, bits, block_size).reshape(n, -1)[:, :k])
    if not symmetric:
        np.testing.assert_array_equal(ours.zero_points, zero_points.reshape(n, -1))
