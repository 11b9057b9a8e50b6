"""Lane-level model of the recurrent kernel's layouts (ops/native/cuda/kernels/gdn_recurrent.cu, RecLayout).

The kernel holds a value row on 8, 16 or 32 lanes (kLanes) and claims that every layout adds a row's dot
products in the same pairing as a 32-lane butterfly over one piece of NPL key columns per lane, so a row's bits
do not depend on the kernel that serves it. This models the kernel's index formulas and its summation (piece
chains, piece_sum inside the lane, transposed_warp_sum across the row's lanes) in float32 and checks: every key
column and row is held once, the reduced values land on the lanes the kernel reads them from, and the sums are
bitwise those of the 32-lane layout.
"""

import numpy as np
import pytest


def fma(a, b, c):
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def col(npl, lanes, lane, i):  # RecLayout::col
    return npl * ((lane & (lanes - 1)) + lanes * (i // npl)) + i % npl


def row(lanes, rows_per_lane, lane, j):  # RecLayout::row
    return (lane // lanes) * rows_per_lane + j


def transposed_warp_sum(x, n, off):
    """x: [32][n] per-lane values -> [32] (transposed_warp_sum<N, OFF>)."""
    x = [list(v) for v in x]
    while n > 1:
        new = []
        for lane in range(32):
            upper = (lane & off) != 0
            other = lane ^ off
            vals = []
            for j in range(n // 2):
                send_other = x[other][j] if (other & off) != 0 else x[other][j + n // 2]
                keep = x[lane][j + n // 2] if upper else x[lane][j]
                vals.append(np.float32(keep + send_other))
            new.append(vals)
        x, n, off = new, n // 2, off // 2
    s = [x[lane][0] for lane in range(32)]
    while off > 0:
        s = [np.float32(s[lane] + s[lane ^ off]) for lane in range(32)]
        off //= 2
    return s


def piece_sum(v):
    v = list(v)
    half = len(v) // 2
    while half > 0:
        for c in range(half):
            v[c] = np.float32(v[c] + v[c + half])
        half //= 2
    return v[0]


def reduce_group(S, k, q, npl, rows, lanes):
    """The kernel's reduce_rows for a group of `rows` rows: returns per lane the value it holds."""
    leaves, rpl = 32 // lanes, rows * lanes // 32
    red = []
    for lane in range(32):
        vals_k, vals_q = [], []
        for j in range(rpl):
            r = row(lanes, rpl, lane, j)
            dk, dq = [], []
            for c in range(leaves):
                a = b = np.float32(0)
                for e in range(npl):
                    kc = col(npl, lanes, lane, c * npl + e)
                    a = fma(S[r, kc], k[kc], a)
                    b = fma(S[r, kc], q[kc], b)
                dk.append(a)
                dq.append(b)
            vals_k.append(piece_sum(dk))
            vals_q.append(piece_sum(dq))
        red.append(vals_k + vals_q)
    return transposed_warp_sum(red, 2 * rpl, lanes // 2)


LAYOUTS = [(npl, rows, lanes) for npl in (1, 2, 4, 8, 16)
           for rows, lanes in ((8, 8), (8, 32), (4, 8), (4, 32), (2, 16), (1, 32))]


@pytest.mark.parametrize("npl,rows,lanes", LAYOUTS)
def test_layout_covers_and_sums_like_32_lanes(npl, rows, lanes):
    rng = np.random.default_rng(npl * 100 + rows * 10 + lanes)
    dk = 32 * npl
    leaves, rpl = 32 // lanes, rows * lanes // 32
    # every (row, key column) once
    held = {(row(lanes, rpl, lane, j), col(npl, lanes, lane, i)) for lane in range(32) for j in range(rpl)
            for i in range(leaves * npl)}
    assert len(held) == rows * dk == 32 * rpl * leaves * npl
    S = rng.standard_normal((rows, dk)).astype(np.float32)
    k = rng.standard_normal(dk).astype(np.float32)
    q = rng.standard_normal(dk).astype(np.float32)
    got = reduce_group(S, k, q, npl, rows, lanes)
    # reference: each row alone on 32 lanes, one piece per lane (the session-13 kernel's order)
    shift = int(np.log2(lanes)) - int(np.log2(2 * rpl))
    half = lanes // 2
    for r in range(rows):
        ref = reduce_group(S[r:r + 1], k, q, npl, 1, 32)  # lanes 0-15: S'.k, 16-31: S'.q
        for lane in range(32):
            slot = (lane & (lanes - 1)) >> shift
            my_row = row(lanes, rpl, lane, slot % rpl)
            if my_row != r:
                continue
            want = ref[16] if lane & half else ref[0]
            assert got[lane].tobytes() == want.tobytes(), (r, lane)
        # the delta of row j of a lane sits on lane u_lane + (j << kShift), a retrieval lane of that row
        for lane in range(32):
            u_lane = lane & ~(lanes - 1)
            for j in range(rpl):
                src = u_lane + (j << shift)
                assert not src & half and ((src & (lanes - 1)) >> shift) == j
                assert row(lanes, rpl, src, j) == row(lanes, rpl, lane, j)
