"""Our CPU kernels against their CPU peers, same inputs.

GatedDeltaNet against ONNX Runtime's own com.microsoft CPU kernel, same nodes: 0.8B geometry (Hk = Hv = 16,
Dk = Dv = 128), fp32, qwen gate, sigmoid beta, qk_l2_norm, 2 intra-op threads (the setting of the project's
CPU kernel goals). PagedAttention (ORT has no CPU kernel) against the plain-ONNX attention of the non-paged
export (Transpose, MatMul, Softmax, MatMul over a dense [B, Hkv, L, D] cache, GQA by broadcasting, causal
bias): 0.8B attention geometry (Hq 8, Hkv 2, D 256), fp32, 16-token blocks handed out in shuffled order.
Each case first checks that both produce the same outputs, then reports the median of --runs timed runs
after warm-up, and the ratio peer / ours. A third table times the 0.8B projections' int4 products at a decode
step's one row and a 128-token prefill's 128 rows (a CPU prefill is mostly these products): our QuantizedLinear at
accuracy level 4 (int8 input rows, the op of our CPU int4 exports) against ORT's com.microsoft::MatMulNBits at the
same level (the builder's int4 exports) and ORT's MatMul on the dequantized weights (fp32 exports), all block 32.

Usage: python scripts/bench_cpu.py [--runs 30] [--threads 2]   (prints Markdown tables)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np
import onnxruntime as ort

from onnx_hybrid.ops import reference
from onnx_hybrid_testing import cases, single_op
from onnx_hybrid.ops.contract import DOMAIN, GATED_DELTA_NET, MS_DOMAIN, PAGED_ATTENTION

GEOMETRY = dict(num_heads_q=16, num_heads_v=16, head_size_k=128, head_size_v=128)
CASES = [  # name, lengths, capacity, initial-state scale
    ("prefill 1x512", [512], 0, 1.0),
    ("prefill 4x128 (ragged)", [128] * 4, 0, 1.0),
    ("decode B=1", [1], 0, 1.0),
    ("decode B=8", [1] * 8, 0, 1.0),
    # A state decayed into the subnormal range (entries ~1e-39), as long-lived fast-decaying heads leave it.
    ("decode B=8, decayed state", [1] * 8, 0, 1e-38),
    ("verify 4 tokens, B=8, capacity 4", [4] * 8, 4, 1.0),
    ("verify 4 tokens, B=8, capacity 4, decayed state", [4] * 8, 4, 1e-38),
]
GOALS = {"prefill": 5.0, "decode": 2.0, "verify": 2.0}  # required ORT / ours


def timed(session, names, values, runs: int) -> tuple[float, float]:
    """Median wall time and median process CPU time (all threads) of one run. CPU time is the steadier
    number on a shared machine: other processes stretch wall time, not the work done."""
    options = ort.RunOptions()
    return timed_call(lambda: session.run_with_ort_values(names, values, options), runs)


def timed_call(call, runs: int) -> tuple[float, float]:
    for _ in range(max(3, runs // 5)):
        call()
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def timed_in_place(session, feeds, aliases: dict[str, str], runs: int) -> tuple[float, float]:
    """Like timed(), with each output in ``aliases`` bound to its input's buffer, as onnxruntime-genai
    binds one KV pool as both past and present."""
    binding = session.io_binding()
    for name, value in feeds.items():
        ort_value = single_op.to_ort_value(value)
        binding.bind_ortvalue_input(name, ort_value)
        if name in aliases:
            binding.bind_ortvalue_output(aliases[name], ort_value)
    for output in session.get_outputs():
        if output.name not in aliases.values():
            binding.bind_output(output.name)
    return timed_call(lambda: session.run_with_iobinding(binding), runs)


def bench_case(lengths, capacity, state_scale: float, runs: int, threads: int):
    rng = np.random.default_rng(0)
    case = cases.random_gdn_case(rng, lengths, capacity=capacity, **GEOMETRY)
    case.feeds["initial_state"] = (case.feeds["initial_state"] * np.float32(state_scale)).astype(np.float32)
    results, sessions = {}, {}
    for who, domain, library in (("ours", DOMAIN, True), ("ort", MS_DOMAIN, False)):
        model = single_op.single_op_model(GATED_DELTA_NET.name, case.feeds, case.attributes, domain=domain)
        sessions[who] = single_op.make_session(model, with_library=library, intra_op_threads=threads)
        results[who] = single_op.run_session(sessions[who], case.feeds)
    for name in results["ours"]:
        a, b = results["ours"][name], results["ort"][name]
        if not np.allclose(a, b, rtol=1e-3, atol=1e-4):
            raise AssertionError(f"{lengths}: {name} differs from ORT by {np.abs(a - b).max():.3e}")
    values = {n: single_op.to_ort_value(v) for n, v in case.feeds.items()}
    times = {}
    for who, session in sessions.items():
        names = [o.name for o in session.get_outputs()]
        times[who] = timed(session, names, values, runs)
    return times["ours"], times["ort"]


ATTENTION = dict(num_heads=8, kv_num_heads=2, head_size=256, block_size=16)
ATTENTION_CASES = [  # name, lengths, past
    ("decode B=8, 512 context", [1] * 8, [511] * 8),
    ("verify 4 tokens, B=8, 512 context", [4] * 8, [508] * 8),
    ("prefill 1x512", [512], [0]),
]


def dense_attention_model(batch, steps, total, hq, hkv, d):
    """The non-paged export's attention math on a dense cache: q [B, Hkv, G, S, D], k/v [B, Hkv, 1, L, D],
    bias [S, L] (0 or -inf, causal)."""
    from onnx import TensorProto, helper

    group, f = hq // hkv, TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
             helper.make_node("MatMul", ["q", "kt"], ["dot"]),
             helper.make_node("Mul", ["dot", "scale"], ["scores"]),
             helper.make_node("Add", ["scores", "bias"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "v"], ["out"])]
    graph = helper.make_graph(
        nodes, "dense_attention",
        [helper.make_tensor_value_info("q", f, [batch, hkv, group, steps, d]),
         helper.make_tensor_value_info("k", f, [batch, hkv, 1, total, d]),
         helper.make_tensor_value_info("v", f, [batch, hkv, 1, total, d]),
         helper.make_tensor_value_info("bias", f, [steps, total])],
        [helper.make_tensor_value_info("out", f, [batch, hkv, group, steps, d])],
        [helper.make_tensor("scale", f, [], [d ** -0.5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def bench_attention_case(lengths, past, runs: int, threads: int):
    case = cases.random_paged_attention_case(np.random.default_rng(0), lengths, past, **ATTENTION)
    hq, hkv, d, bs = (ATTENTION[k] for k in ("num_heads", "kv_num_heads", "head_size", "block_size"))
    batch, steps, total = len(lengths), lengths[0], past[0] + lengths[0]
    # The dense peer sees the same keys and values: the pool after this call's writes, gathered per request.
    _, key_pool, value_pool = reference.paged_attention(case.feeds, **case.attributes)
    positions = np.arange(total)
    table = case.feeds["block_table"][:, positions // bs]  # [B, L]

    def dense(pool):  # [B, L, Hkv, D] -> [B, Hkv, 1, L, D]
        return pool[table, positions % bs].astype(np.float32).transpose(0, 2, 1, 3)[:, :, None]

    q = case.feeds["query"].reshape(batch, steps, hkv, hq // hkv, d).transpose(0, 2, 3, 1, 4)
    bias = np.where(positions[None, :] <= past[0] + np.arange(steps)[:, None], 0.0, -np.inf).astype(np.float32)
    dense_feeds = dict(q=np.ascontiguousarray(q), k=dense(key_pool), v=dense(value_pool), bias=bias)

    ours = single_op.make_session(single_op.single_op_model(PAGED_ATTENTION.name, case.feeds, case.attributes),
                                  intra_op_threads=threads)
    peer = single_op.make_session(dense_attention_model(batch, steps, total, hq, hkv, d), with_library=False,
                                  intra_op_threads=threads)
    got = single_op.run_session(ours, case.feeds)["output"]
    want = single_op.run_session(peer, dense_feeds)["out"].transpose(0, 3, 1, 2, 4).reshape(got.shape)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        raise AssertionError(f"{lengths}: PagedAttention differs from dense attention by "
                             f"{np.abs(got - want).max():.3e}")
    pools = {"key_cache": "key_cache_out", "value_cache": "value_cache_out"}
    return timed_in_place(ours, case.feeds, pools, runs), timed_in_place(peer, dense_feeds, {}, runs)


# 0.8B projections at a prefill's rows: name, output features, in_features (the 128-row products of a 128-token
# prompt; gate|up packed, the GatedDeltaNet input projections packed).
PRODUCT_CASES = [("gate|up", 7168, 1024), ("GatedDeltaNet in_proj", 8192, 1024), ("down", 1024, 3584),
                 ("GatedDeltaNet out_proj", 1024, 2048)]
PRODUCT_ROWS = (1, 128)  # a decode step, a 128-token prefill


def bench_product_case(n: int, k: int, rows: int, runs: int, threads: int):
    """(QuantizedLinear, MatMulNBits, MatMul fp32) times for x [rows, k] @ w^T, w [n, k] quantized at block 32,
    the weights initializers as in an export."""
    from onnx import TensorProto, helper

    from onnx_hybrid.exporter.quantize import QuantSpec, dequantize, quantize

    rng = np.random.default_rng(n + k)
    spec = QuantSpec(4, 32)
    q = quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.02, spec)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    level = {"block_size": 32, "accuracy_level": 4}
    ours = single_op.single_op_model("QuantizedLinear", {"input": x, "weight": q.codes, "scales": q.scales}, level,
                                     initializers=("weight", "scales"))
    nbits = single_op.matmul_nbits_model(q.codes, q.scales, k, bits=4, **level)
    dense = np.ascontiguousarray(dequantize(q, spec, k).astype(np.float32).T)  # [k, n]
    f = TensorProto.FLOAT
    fp32 = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["A", "w"], ["Y"])], "fp32",
                          [helper.make_tensor_value_info("A", f, ["M", k])], [helper.make_tensor_value_info("Y", f, None)],
                          [helper.make_tensor("w", f, dense.shape, dense.tobytes(), raw=True)]),
        opset_imports=[helper.make_opsetid("", single_op.AI_ONNX_OPSET)], ir_version=single_op.IR_VERSION)
    times, outputs = [], []
    for model, feed, output, library in ((ours, "input", "output", True), (nbits, "A", "Y", False),
                                         (fp32, "A", "Y", False)):
        session = single_op.make_session(model, with_library=library, intra_op_threads=threads)
        outputs.append(session.run([output], {feed: x})[0])
        times.append(timed(session, [output], {feed: single_op.to_ort_value(x)}, runs))
    # Level 4 rounds x to int8 per block: the products agree to that rounding, not bit for bit.
    for name, got in (("QuantizedLinear", outputs[0]), ("MatMulNBits", outputs[1])):
        if not np.allclose(got, outputs[2], rtol=0.05, atol=0.05 * np.abs(outputs[2]).max()):
            raise AssertionError(f"{name} [{n}, {k}] differs from MatMul by {np.abs(got - outputs[2]).max():.3e}")
    return tuple(times)


def table_row(name: str, first: tuple[float, float], second: tuple[float, float]) -> str:
    """A Markdown row: name, both wall times, second / first, both CPU times, their ratio (inputs in seconds)."""
    (wall, cpu), (other_wall, other_cpu) = first, second
    return (f"| {name} | {wall * 1e3:.3f} ms | {other_wall * 1e3:.3f} ms | {other_wall / wall:.2f}x | "
            f"{cpu * 1e3:.3f} ms | {other_cpu * 1e3:.3f} ms | {other_cpu / cpu:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows here (with date, commit, CPU, command)")
    args = parser.parse_args()
    from onnx_hybrid.ops.library import cpu_isa
    from onnx_hybrid_testing.e2e import cpu_model
    from onnx_hybrid_testing.results import write_json

    rows = []

    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op threads, kernels: {cpu_isa()}, "
          f"median of {args.runs} runs")
    print(f"CPU: {cpu_model()}; load average {os.getloadavg()[0]:.2f} at start")
    print("| case | ours | ORT 1.32 com.microsoft | ORT / ours | ours CPU | ORT CPU | CPU ratio | goal |")
    print("|---|---|---|---|---|---|---|---|")
    for name, lengths, capacity, state_scale in CASES:
        (ours, ours_cpu), (theirs, theirs_cpu) = bench_case(lengths, capacity, state_scale, args.runs, args.threads)
        goal = GOALS[name.split()[0]]
        ratio = theirs / ours
        mark = "met" if ratio >= goal else f"missed ({ratio / goal:.0%} of goal)"
        print(table_row(name, (ours, ours_cpu), (theirs, theirs_cpu)) + f" >= {goal:.0f}x: {mark} |", flush=True)
        rows.append({"case": name, "peer": "ORT com.microsoft", "ours_s": ours, "peer_s": theirs, "ours_cpu_s": ours_cpu,
                     "peer_cpu_s": theirs_cpu, "goal": goal})
    print()
    print("| PagedAttention case | ours (paged pool) | plain-ONNX dense attention | peer / ours | ours CPU | peer CPU "
          "| CPU ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, lengths, past in ATTENTION_CASES:
        (ours, ours_cpu), (theirs, theirs_cpu) = bench_attention_case(lengths, past, args.runs, args.threads)
        print(table_row(name, (ours, ours_cpu), (theirs, theirs_cpu)), flush=True)
        rows.append({"case": name, "peer": "plain-ONNX dense attention", "ours_s": ours, "peer_s": theirs,
                     "ours_cpu_s": ours_cpu, "peer_cpu_s": theirs_cpu})
    print()
    print("| int4 product, rows | ours: QuantizedLinear | ORT MatMulNBits | ORT MatMul fp32 | MatMulNBits / ours | "
          "fp32 / ours | ours CPU | MatMulNBits CPU | fp32 CPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rows_in_call in PRODUCT_ROWS:
        for name, n, k in PRODUCT_CASES:
            (ours, ours_cpu), (nbits, nbits_cpu), (fp32, fp32_cpu) = bench_product_case(n, k, rows_in_call, args.runs,
                                                                                      args.threads)
            print(f"| {name} [{n}, {k}], {rows_in_call} | {ours * 1e3:.3f} ms | {nbits * 1e3:.3f} ms | "
                  f"{fp32 * 1e3:.3f} ms | {nbits / ours:.2f}x | {fp32 / ours:.2f}x | {ours_cpu * 1e3:.3f} ms | "
                  f"{nbits_cpu * 1e3:.3f} ms | {fp32_cpu * 1e3:.3f} ms |", flush=True)
            for peer, (wall, cpu) in (("ORT MatMulNBits int4 block 32 accuracy_level 4", (nbits, nbits_cpu)),
                                      ("ORT MatMul fp32", (fp32, fp32_cpu))):
                rows.append({"case": f"{name} [{n}, {k}] x {rows_in_call} rows", "peer": peer, "ours_s": ours,
                             "peer_s": wall, "ours_cpu_s": ours_cpu, "peer_cpu_s": cpu,
                             "ours": "QuantizedLinear int4 block 32 accuracy_level 4"})
    write_json(args.json, "bench_cpu", cpu_model(), rows, onnxruntime=ort.__version__, threads=args.threads,
               kernels=cpu_isa(), runs=args.runs)


if __name__ == "__main__":
    main()
