"""Bitwise comparison of two trees' CUDA kernels on one GPU: a refactoring check (same inputs, same bits out).

    python3 <tree>/scripts/gpu_bitwise.py dump OUT.npz [SKIP]  # run the cases with that tree
    python3 scripts/gpu_bitwise.py compare A.npz B.npz          # every array bitwise equal?

Each tree is loaded in its own process (one `onnx_hybrid` per interpreter). The cases are drawn from fixed
seeds, so both dumps see the same inputs. GatedDeltaNet's recurrent engine: decode and verify at the 27B geometry,
ragged rows with capture, every update rule, per-key decay, key sizes 32..512 and several launch shapes
(rows:groups per warp); its chunked engine and the automatic choice on prefill rows (fp32, fp16, bf16, with and
without capture); the conv on decode, verify and prefill rows; both capsule replays with ragged accepted counts.
Outputs, final states and capsules are kept. SKIP: comma-separated substrings of case names to leave out (e.g.
decode128, whose states are 400 MB each), the same in both dumps.
"""

import sys

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np

G27 = dict(num_heads_q=16, num_heads_v=48, head_size_k=128, head_size_v=128)
D128 = dict(num_heads_q=2, num_heads_v=4, head_size_k=128, head_size_v=128)
SHAPES = (None, (8, 4), (4, 1), (2, 8), (8, 2), (1, 16))


def cases():
    """(name, random_gdn_case kwargs, launch shapes)."""
    for dtype in ("float16", "bfloat16"):
        yield f"27b-decode32-{dtype}", dict(lengths=(1,) * 32, capacity=4, capture=(1, 0) * 16, dtype=dtype,
                                             **G27), SHAPES[:4]
        yield f"27b-decode128-{dtype}", dict(lengths=(1,) * 128, dtype=dtype, **G27), SHAPES[:2]
        yield f"27b-verify32-{dtype}", dict(lengths=(4,) * 32, capacity=4, capture=(4,) * 32, dtype=dtype,
                                             **G27), SHAPES[:3]
        yield f"27b-verify8-{dtype}", dict(lengths=(8, 5, 7, 8) * 4, capacity=8, capture=(8, 3, 7, 6) * 4,
                                            dtype=dtype, **G27), SHAPES[:3]
        yield f"ragged-capture-{dtype}", dict(lengths=(1, 4, 4, 9, 0, 3), capacity=4, capture=(1, 4, 2, 4, 0, 3),
                                               dtype=dtype, **D128), SHAPES
        yield f"perkey-{dtype}", dict(lengths=(1, 1, 4, 6), per_key_decay=True, dtype=dtype, **D128), SHAPES[:3]
    yield "f32-decode", dict(lengths=(1,) * 8, **D128), SHAPES[:3]
    yield "linear", dict(lengths=(1, 3, 5), update_rule="linear", gate_activation="none", dtype="float16",
                         **D128), SHAPES[:2]
    yield "delta", dict(lengths=(1, 3, 5), update_rule="delta", gate_activation="none", dtype="float16",
                        **D128), SHAPES[:2]
    yield "gated", dict(lengths=(1, 3, 5), update_rule="gated", dtype="float16", **D128), SHAPES[:2]
    yield "no-l2norm", dict(lengths=(1, 2, 6), qk_l2_norm=0, dtype="float16", **D128), SHAPES[:2]
    for dk, dv in ((32, 16), (40, 24), (64, 32), (256, 64), (512, 40)):
        yield f"dk{dk}-dv{dv}", dict(lengths=(1, 4, 7, 1), num_heads_q=2, num_heads_v=6, head_size_k=dk,
                                     head_size_v=dv, capacity=4, capture=(1, 4, 4, 1), dtype="float16"), SHAPES[:1]


def prefill_cases():
    """(name, random_gdn_case kwargs, engines) for the chunked engine and the automatic choice."""
    for dtype in ("float", "float16", "bfloat16"):
        engines = ("recurrent", "auto") if dtype == "float" else ("chunked", "auto")  # no fp32 chunked kernel
        yield f"prefill-ragged-{dtype}", dict(lengths=(1, 100, 33, 257, 64), dtype=dtype, **D128), engines
        yield f"prefill-capture-{dtype}", dict(lengths=(70, 5, 130), capacity=4, capture=(4, 2, 3), dtype=dtype,
                                               **D128), engines
    yield "prefill-27b-2x700", dict(lengths=(700, 700), dtype="bfloat16", **G27), ("auto",)
    yield "prefill-perkey", dict(lengths=(90, 40), per_key_decay=True, dtype="float16", **D128), ("recurrent", "auto")


def conv_cases():
    """(name, random_conv_case kwargs)."""
    for dtype in ("float", "float16", "bfloat16"):
        yield f"conv-ragged-{dtype}", dict(lengths=(10, 5, 1, 8, 0, 300), channels=160, dtype=dtype)
        yield f"conv-decode-{dtype}", dict(lengths=(1,) * 32, channels=8192, capacity=4, capture=(1, 0) * 16,
                                           dtype=dtype)
        yield f"conv-verify-{dtype}", dict(lengths=(4, 3, 4, 1), channels=1000, capacity=4, capture=(4, 3, 2, 1),
                                           dtype=dtype)
    yield "conv-dilated", dict(lengths=(9, 17), channels=64, kernel_size=3, dilation=2, activation="none",
                               with_bias=False, dtype="float16")


def dump(path, skip=()):
    import ml_dtypes
    import torch

    from onnx_hybrid import cuda_ops
    from onnx_hybrid.ops import contract
    from onnx_hybrid_testing.cases import random_conv_case, random_gdn_case

    def to_gpu(x):
        x = np.ascontiguousarray(x)
        if x.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
        return torch.from_numpy(x).cuda()

    def to_host(t):  # a torch tensor (given outputs) or a CuPy array (outputs the call allocated)
        if not isinstance(t, torch.Tensor):
            a = t.get()
            return a.view(np.int16) if a.dtype == ml_dtypes.bfloat16 else a
        t = t.detach().cpu()
        return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()

    saved = {}
    for i, (name, kwargs, shapes) in enumerate(cases()):
        if any(x in name for x in skip):
            continue
        case = random_gdn_case(np.random.default_rng(100 + i), **kwargs)
        attrs = contract.resolve_attributes(contract.GATED_DELTA_NET, case.attributes)
        geo = contract.resolve_gdn({k: (None if v is None else np.shape(v)) for k, v in case.feeds.items()}, attrs)
        dev = {k: to_gpu(v) for k, v in case.feeds.items()}
        act = dev["query"].dtype
        for shape in shapes:
            outs = {"output": torch.full(tuple(geo.output_shape), float("nan"), dtype=act, device="cuda"),
                    "final_state": torch.full(tuple(geo.state_shape), float("nan"), device="cuda"),
                    "state_update": torch.full((geo.batch, geo.capsule_width), float("nan"), device="cuda")}
            knobs = {} if shape is None else dict(rec_rows=shape[0], rec_groups=shape[1])
            results = cuda_ops.gated_delta_net(dev, outputs=outs, engine="recurrent", **knobs, **case.attributes)
            torch.cuda.synchronize()
            tag = "plan" if shape is None else f"{shape[0]}x{shape[1]}"
            for part, t in zip(("out", "state", "capsule"), results):
                saved[f"{name}/{tag}/{part}"] = to_host(t)
    for i, (name, kwargs, engines) in enumerate(prefill_cases()):
        if any(x in name for x in skip):
            continue
        case = random_gdn_case(np.random.default_rng(500 + i), **kwargs)
        dev = {k: to_gpu(v) for k, v in case.feeds.items()}
        for engine in engines:
            results = cuda_ops.gated_delta_net(dev, engine=engine, **case.attributes)
            torch.cuda.synchronize()
            for part, t in zip(("out", "state", "capsule"), results):
                saved[f"{name}/{engine}/{part}"] = to_host(t)
            if case.attributes.get("state_update_capacity"):  # replay a ragged prefix of each row's capture
                capacity = case.attributes["state_update_capacity"]
                accepted = [int(x) for x in np.random.default_rng(i).integers(0, capacity + 1, len(case.lengths))]
                replayed = cuda_ops.replay_gdn(dev["initial_state"].clone(), results[2], accepted, capacity)
                torch.cuda.synchronize()
                saved[f"{name}/{engine}/replay"] = to_host(replayed)
    for i, (name, kwargs) in enumerate(conv_cases()):
        if any(x in name for x in skip):
            continue
        case = random_conv_case(np.random.default_rng(900 + i), **kwargs)
        dev = {k: to_gpu(v) for k, v in case.feeds.items()}
        results = cuda_ops.varlen_causal_conv(dev, **case.attributes)
        torch.cuda.synchronize()
        for part, t in zip(("out", "state", "capsule"), results):
            saved[f"{name}/{part}"] = to_host(t)
        if case.attributes.get("state_update_capacity"):
            capacity = case.attributes["state_update_capacity"]
            accepted = [int(x) for x in np.random.default_rng(i).integers(0, capacity + 1, len(case.lengths))]
            replayed = cuda_ops.replay_conv(dev["initial_state"].clone(), results[2], accepted)
            torch.cuda.synchronize()
            saved[f"{name}/replay"] = to_host(replayed)
    np.savez(path, **saved)
    print(f"{path}: {len(saved)} arrays from {cuda_ops.__file__}")


def compare(a_path, b_path):
    a, b = np.load(a_path), np.load(b_path)
    assert sorted(a.files) == sorted(b.files), "different case lists"
    differ = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
    print(f"bitwise: {len(a.files) - len(differ)} of {len(a.files)} arrays equal")
    for k in differ:
        print("  DIFFERS:", k)
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2], [x for x in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if x])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
