"""Small GPU driver for tools that wrap a whole process (compute-sanitizer): runs every kernel once on
malformed offsets (negative, decreasing, beyond T, cu[0] != 0, cu[B] != T) and on a normal mixed batch,
then synchronises. A memory fault shows up as a sanitizer error or a CUDA error here."""

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np
import torch

from onnx_hybrid import cuda_ops
from onnx_hybrid_testing.cases import random_conv_case, random_gdn_case

MALFORMED = [[0, 6, 12], [0, 5, 3, 12], [-4, 6, 12], [0, 40, 12], [3, 6, 12], [0, 6, 9], [0, 2**30, -2**30, 12]]
D128 = dict(num_heads_q=2, num_heads_v=4, head_size_k=128, head_size_v=128)


def gpu(x):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x)).cuda()


def device_feeds(case, offsets_name, cu):
    """The case's feeds on the GPU with ``cu`` as its offsets and initial_state resized to len(cu) - 1 rows."""
    b = len(cu) - 1
    state = case.feeds["initial_state"]
    feeds = {k: gpu(v) for k, v in case.feeds.items()}
    feeds[offsets_name] = gpu(np.asarray(cu, np.int32))
    feeds["initial_state"] = gpu(np.resize(state, (b,) + state.shape[1:]))
    return feeds


def main():
    rng = np.random.default_rng(0)
    for cu in MALFORMED:
        b = len(cu) - 1
        for kw, engine in ((dict(), "recurrent"), (dict(dtype="float16", **D128), "chunked")):
            case = random_gdn_case(rng, lengths=(6, 6), capacity=4, **kw)
            feeds = device_feeds(case, "cu_seqlens", cu)
            feeds["capture_count"] = gpu(np.full(b, 4, np.int32))
            cuda_ops.gated_delta_net(feeds, engine=engine, **case.attributes)
            state = feeds["initial_state"]
            cuda_ops.replay_gdn(state, cuda_ops.gated_delta_net(feeds, engine=engine, **case.attributes)[2],
                                [9, -1] + [2] * (b - 2), 4)
        conv = random_conv_case(rng, lengths=(6, 6), capacity=2, capture=(1, 1))
        feeds = device_feeds(conv, "cumulative_sequence_length", cu)
        feeds["capture_count"] = gpu(np.ones(b, np.int32))
        _, st, cap = cuda_ops.varlen_causal_conv(feeds, **conv.attributes)
        cuda_ops.replay_conv(st, cap, [5] + [1] * (b - 1))
    # the conv's output pass (over kConvShortTokens tokens: runs of tokens per thread; from
    # kConvLongTokens on, longer runs) with its state pass in the same grid and, in place, after it; on the
    # 16-byte path (fp16, 64 channels) and the element path (fp32, 12 channels), on malformed offsets of 600 and
    # 4200 tokens
    for cu in ([0, 300, 600], [0, 250, 100, 600], [-40, 300, 600], [0, 4000, 600], [30, 300, 600], [0, 300, 500],
               [0, 2**30, -2**30, 600], [0, 2100, 1000, 4200], [0, 9000, 4200], [-7, 4190, 4100, 4000]):
        b = len(cu) - 1
        half = max(cu[-1], 600) // 2
        for kw in (dict(dtype="float16", channels=64), dict()):
            conv = random_conv_case(rng, lengths=(half, half), capacity=2, capture=(1, 1), **kw)
            feeds = device_feeds(conv, "cumulative_sequence_length", cu)
            feeds["capture_count"] = gpu(np.full(b, 2, np.int32))
            cuda_ops.varlen_causal_conv(feeds, **conv.attributes)
            cuda_ops.varlen_causal_conv(feeds, outputs={"final_state": feeds["initial_state"]}, **conv.attributes)
    # the chunked kernels on long rows: a well-formed mixed batch (full, partial and short rows), then
    # overlapping rows (more chunks than the prep grid's bound)
    for cu in ([0, 130, 170, 175, 239], [0, 140, 0, 140]):
        case = random_gdn_case(rng, lengths=(max(cu),), dtype="float16", **D128)
        feeds = device_feeds(case, "cu_seqlens", cu)
        cuda_ops.gated_delta_net(feeds, engine="chunked", **case.attributes)
    torch.cuda.synchronize()
    print("gpu_check: all kernels ran on malformed offsets without a CUDA error")


if __name__ == "__main__":
    main()
