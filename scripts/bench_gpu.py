"""GatedDeltaNet CUDA kernels against FLA 0.6.0 on the same inputs, both replayed from CUDA graphs.

27B geometry (Hk = 16, Hv = 48, D = 128), fp16/bf16 q/k/v, fp32 state, ragged cu_seqlens, qwen gate, sigmoid
beta, in-kernel L2 norm. FLA gets q/k already expanded to Hv heads and g / sigmoid(beta) precomputed
(outside the timed region: that is less work for FLA than for us). Each case first checks our output
against FLA's, then times graph replays with CUDA events (median), rotating input sets so that the working
set exceeds L2, at least GRAPH_CALLS calls per graph. Prints ours, FLA, ratio, and the fraction of the byte
floor (decode, verify) or of the FLOP floor (prefill) reached by our kernel. Our kernels use programmatic
dependent launch on sm_90+ unless ``--pdl off``; ``--pdl both`` also times them without it, ``--neighbour``
after a small torch kernel (which, like most of a model's kernels, does not opt in).
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import torch

from onnx_hybrid import cuda_ops
from onnx_hybrid.ops import library
from onnx_hybrid_testing.device_rates import copy_rate
from onnx_hybrid_testing.results import write_json

HK, HV, D = 16, 48, 128
L2_BYTES = 60e6
MATMUL_RATE = 790e12  # dense bf16 matrix rate measured on the H200: the prefill FLOP floor's rate
CHUNK_FLOP_PER_TOKEN_HEAD = 180e3  # FLOPs per token and value head of the chunk-64 algorithm at Dk = Dv = 128
# A graph of one call also times the graph's own launch, about 6 us on the H200: the conv's prefill at 27B,
# 1 x 4096 took 71.5 us per call in a graph of one call and 65.2 in a graph of four
# (docs/design-notes.md#graphs-of-four-calls).
# Calls whose inputs exceed the L2 get one input set each; they repeat it to make up these calls.
GRAPH_CALLS = 4


def copy_time(nbytes: int) -> float:
    """Seconds per device-to-device copy of nbytes / 2 bytes (nbytes read and written in all), timed as the
    kernels are: input sets rotated past the L2, graph replays. What a plain copy reaches at a kernel's size: the
    faster of a memcpy node (``copy_``) and a copy kernel on the SMs (int32 ``bitwise_or`` with 0). Captured in a
    graph, the memcpy node reached only 39-64% of the copy rate from 8 to 400 MB in one H200 run, the kernel
    48-98% (docs/design-notes.md#copy-reference)."""
    half = int(nbytes) // 2 // 4 * 4
    sets = [(torch.empty(half, dtype=torch.uint8, device="cuda"), torch.empty(half, dtype=torch.uint8, device="cuda"))
            for _ in range(rotated_sets(nbytes))]
    memcpy = graph_time([lambda a=a, b=b: b.copy_(a) for a, b in sets])
    kernel = graph_time([lambda a=a, b=b: torch.bitwise_or(a.view(torch.int32), 0, out=b.view(torch.int32))
                         for a, b in sets])
    return min(memcpy, kernel)


def rotated_sets(nbytes: int) -> int:
    """Input sets for one graph replay to touch more than twice the L2 (at most 16) with calls of nbytes each."""
    return max(1, min(16, math.ceil(2 * L2_BYTES / nbytes)))


def current_stream() -> int:
    """The raw handle of torch's current stream: asked for inside each call, so a graph capture records it."""
    return torch.cuda.current_stream().cuda_stream


def benchmark_arguments() -> argparse.ArgumentParser:
    """The options every GPU benchmark takes: dtypes, a case filter, whether FLA runs beside ours, and the
    calls per graph."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["float16", "bfloat16", "both"], default="both")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--fla-tune", choices=["case", "first"], default="case",
                    help="case: FLA's autotuned configs are forgotten before each case, so it tunes for that case's "
                         "shapes; first: kept for the process, as in sessions up to 24 (see retune_fla)")
    ap.add_argument("--graph-calls", type=int, default=GRAPH_CALLS,
                    help="calls per timed graph at least (input sets repeat to make them up)")
    ap.add_argument("--json", type=Path, help="also write the rows here (with date, commit, GPU, command)")
    return ap


def parse_benchmark_arguments(ap: argparse.ArgumentParser) -> argparse.Namespace:
    global GRAPH_CALLS
    args = ap.parse_args()
    GRAPH_CALLS = max(1, args.graph_calls)
    return args


def fla_autotuner(kernel):
    """The Triton autotuner under an FLA kernel's other decorators (``@triton.heuristics`` and the like)."""
    from triton.runtime.autotuner import Autotuner
    while kernel is not None and not isinstance(kernel, Autotuner):
        kernel = getattr(kernel, "fn", None)
    return kernel


def retune_fla(how: str) -> None:
    """With ``how == "case"``, forget the configs FLA's Triton autotuners chose, so its next call tunes for the
    case at hand. Their keys leave out the token and row counts (``causal_conv1d_update``: channels and width only;
    ``fused_recurrent``: block sizes and gate flags), so within one process every case would otherwise run with
    the config tuned for the first case that reached the kernel, a decode of one row for the recurrent and
    update kernels."""
    if how != "case":
        return
    import sys

    for name, module in list(sys.modules.items()):
        if name.startswith("fla.") and module is not None:
            for obj in list(vars(module).values()):
                if (tuner := fla_autotuner(obj)) is not None:
                    tuner.cache.clear()


def best_config_time(kernel, fns) -> tuple[float, str]:
    """Seconds per call of ``fns`` (graph_time) with each of the FLA kernel's autotune configs forced in turn
    (an autotuner of one config runs it without tuning), and the fastest config. For kernels of a few
    microseconds, whose own tuning (one do_bench per config) is noisy."""
    tuner = fla_autotuner(kernel)
    configs, best = tuner.configs, (float("inf"), "")
    try:
        for config in configs:
            tuner.configs = [config]
            best = min(best, (graph_time(fns), str(config)))
    finally:
        tuner.configs = configs
        tuner.cache.clear()
    return best


def benchmark_dtypes(choice: str) -> list[str]:
    return ["float16", "bfloat16"] if choice == "both" else [choice]


def make_inputs(lengths, dtype, capacity, gen, gates="float"):
    """One input set; ``gates`` "act" gives decay and beta in the activation type (as exports feed them)."""
    t, b = sum(lengths), len(lengths)
    gate_dtype = dtype if gates == "act" else torch.float32
    dev = "cuda"
    q = torch.randn(t, HK, D, dtype=dtype, device=dev, generator=gen)
    k = torch.randn(t, HK, D, dtype=dtype, device=dev, generator=gen)
    v = torch.randn(t, HV, D, dtype=dtype, device=dev, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=dev)
    feeds = {
        "query": q, "key": k, "value": v, "cu_seqlens": cu,
        "decay": torch.randn(t, HV, device=dev, generator=gen).to(gate_dtype),
        "beta": torch.randn(t, HV, device=dev, generator=gen).to(gate_dtype),
        "initial_state": 0.05 * torch.randn(b, HV, D, D, device=dev, generator=gen),
        "a_log": torch.log(torch.rand(HV, device=dev, generator=gen) * 7.5 + 0.5),
        "dt_bias": torch.rand(HV, device=dev, generator=gen) * 2 - 1,
    }
    if capacity:
        feeds["capture_count"] = torch.full((b,), capacity, dtype=torch.int32, device=dev)
    width = capacity * (HV + HK * D + HV * D)
    outs = {"output": torch.empty(t, HV, D, dtype=dtype, device=dev),
            "final_state": torch.empty(b, HV, D, D, device=dev),
            "state_update": torch.empty(b, width, device=dev)}
    g = -torch.exp(feeds["a_log"]) * torch.nn.functional.softplus(feeds["decay"].float() + feeds["dt_bias"])
    fla = {"q": q.repeat_interleave(HV // HK, dim=1)[None], "k": k.repeat_interleave(HV // HK, dim=1)[None],
           "v": v[None], "g": g[None].float(), "beta": torch.sigmoid(feeds["beta"].float())[None].to(dtype),
           "h0": feeds["initial_state"].transpose(-1, -2).contiguous(), "cu": cu.long(),
           "cu_cpu": cu.long().cpu()}
    if max(lengths) > 8:  # FLA's chunk index, built outside the captured region (its builder copies host->device)
        from fla.ops.utils.index import prepare_chunk_indices

        fla["chunk_indices"] = prepare_chunk_indices(fla["cu"], 64)
    return feeds, outs, fla


ATTRS = dict(gate_activation="qwen", beta_activation="sigmoid", qk_l2_norm=1, update_rule="gated_delta")


def make_workspace(feeds, outs, capacity):
    """The chunked kernels' scratch, allocated outside the captured region (one per case: replays are serial); as
    large as the chunked engine needs where it serves the shape (the --engines and --split timings force it)."""
    try:
        nbytes = cuda_ops.gdn_workspace_bytes(feeds, outputs=outs, engine="chunked", **ATTRS,
                                              state_update_capacity=capacity)
    except cuda_ops.PlanError:
        nbytes = 0
    return torch.empty(max(1, -(-nbytes // 4)), dtype=torch.int32, device="cuda")


def ours_fn(feeds, outs, capacity, workspace, rows=None, groups=None, engine="auto", prep_heads=None, only=None):
    """Our call; ``only``: launch only the plan's kernels whose names start with these prefixes."""
    attrs = dict(ATTRS, state_update_capacity=capacity)

    def run():
        cuda_ops.gated_delta_net(feeds, outputs=outs, stream=current_stream(),
                                 workspace=workspace, rec_rows=rows, rec_groups=groups, engine=engine,
                                 prep_heads=prep_heads, only_kernels=only, **attrs)
        return outs["output"]
    return run


def fla_fn(fla, tokens_per_row):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    def run():
        extra = {} if tokens_per_row <= 8 else {"cu_seqlens_cpu": fla["cu_cpu"], "chunk_indices": fla["chunk_indices"]}
        f = fused_recurrent_gated_delta_rule if tokens_per_row <= 8 else chunk_gated_delta_rule
        o, _ = f(fla["q"], fla["k"], fla["v"], g=fla["g"], beta=fla["beta"], scale=D ** -0.5,
                 initial_state=fla["h0"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                 cu_seqlens=fla["cu"], **extra)
        return o[0]
    return run


def after_neighbour(fn, scratch):
    """fn after a small torch kernel: a neighbour that does not opt in to programmatic launch."""
    def run():
        scratch.add_(1.0)
        return fn()
    return run


def set_programmatic_launch(enabled: bool) -> None:
    library.set_option("cuda_programmatic_launch", "auto" if enabled else "off")


def time_without_pdl(fns, default: bool) -> float:
    set_programmatic_launch(False)
    try:
        return graph_time(fns)
    finally:
        set_programmatic_launch(default)


def graph_time(fns, reps=20) -> float:
    """Seconds per call: one graph replays every fn (one per rotated input set) once, or in turn until it
    holds GRAPH_CALLS calls."""
    fns = list(fns) * math.ceil(GRAPH_CALLS / len(fns))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        graph.replay()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en) / 1e3 / len(fns))
    return statistics.median(times)


CASES = [
    ("decode B=1", [1], 0), ("decode B=32", [1] * 32, 0), ("decode B=128", [1] * 128, 0),
    ("verify 4 tok B=32 cap", [4] * 32, 4), ("verify 4 tok B=32", [4] * 32, 0),
    ("verify 4 tok B=128 cap", [4] * 128, 4), ("verify 4 tok B=128", [4] * 128, 0),
    # up to 8 drafted tokens per row (MTP / EAGLE-style drafters): the block-shared prologue's second chunk
    ("verify 8 tok B=32 cap", [8] * 32, 8), ("verify 8 tok B=128 cap", [8] * 128, 8),
    ("prefill 1x4096", [4096], 0), ("prefill 1x8192", [8192], 0), ("prefill 1x16384", [16384], 0),
    ("prefill 8x2048", [2048] * 8, 0),
    # short prompts: where the two launches and the prep's latency of the chunked engine cost most
    ("prefill 1x32", [32], 0), ("prefill 1x64", [64], 0), ("prefill 1x128", [128], 0), ("prefill 1x512", [512], 0),
    ("prefill 4x256", [256] * 4, 0), ("prefill 16x64", [64] * 16, 0),
]


def main() -> None:
    ap = benchmark_arguments()
    ap.add_argument("--once", action="store_true", help="run each case twice without graphs or timing (profilers)")
    ap.add_argument("--rows", default="", help="also time the recurrent kernel with these rows:groups per warp")
    ap.add_argument("--engines", default="", help="also time prefill cases with these engines (chunked, recurrent)")
    ap.add_argument("--split", action="store_true", help="also time the chunked engine's prep, and prep + scan")
    ap.add_argument("--prep-heads", default="",
                    help="also time prefill cases' prep kernel alone with these value heads per block (e.g. 1,3)")
    ap.add_argument("--pdl", choices=["on", "off", "both"], default="on",
                    help="programmatic dependent launch of our kernels (sm_90+); both: also time them without it")
    ap.add_argument("--gates", choices=["float", "act"], default="float",
                    help="decay and beta in fp32 (default) or in the activation type, as exports feed them")
    ap.add_argument("--neighbour", action="store_true",
                    help="also time each of our calls after a small torch kernel (one that does not opt in)")
    args = parse_benchmark_arguments(ap)
    set_programmatic_launch(args.pdl != "off")
    dtypes = benchmark_dtypes(args.dtype)
    rate = copy_rate()
    # the library launches programmatically on sm_90+ (with a driver that captures such launches)
    pdl = args.pdl != "off" and torch.cuda.get_device_capability()[0] >= 9
    print(f"# {datetime.date.today()} {torch.cuda.get_device_name()}  copy rate {rate / 1e12:.2f} TB/s  "
          f"programmatic launch {'on' if pdl else 'off'}")
    print(f"{'case':24s} {'dtype':9s} {'ours us':>9s} {'FLA us':>9s} {'FLA/ours':>9s} {'floor':>7s} {'max err':>8s}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for name, lengths, capacity in CASES:
            if args.cases and not any(c in name for c in args.cases.split(",")):
                continue
            state_bytes = 2 * len(lengths) * HV * D * D * 4
            inputs = [make_inputs(lengths, dtype, capacity, gen, args.gates)
                      for _ in range(rotated_sets(state_bytes))]
            workspace = make_workspace(inputs[0][0], inputs[0][1], capacity)
            ours = [ours_fn(f, o, capacity, workspace) for f, o, _ in inputs]
            if args.once:
                ours[0]()
                ours[0]()
                torch.cuda.synchronize()
                continue
            ours_out = ours[0]().float()
            ours_t = graph_time(ours)
            notes = []
            if args.pdl == "both":
                notes.append(f"without PDL: {time_without_pdl(ours, True) * 1e6:.1f} us")
            if args.neighbour:
                scratch = torch.zeros(256, device="cuda")
                pairs = [after_neighbour(fn, scratch) for fn in ours]
                alone = graph_time([lambda: scratch.add_(1.0)] * len(ours))
                with_pdl = "" if args.pdl == "off" else f"{graph_time(pairs) * 1e6:.1f} us with PDL, "
                without = ("" if args.pdl == "on"
                           else f"{time_without_pdl(pairs, args.pdl != 'off') * 1e6:.1f} us without")
                notes.append(f"after a torch kernel ({alone * 1e6:.1f} us alone): {with_pdl}{without}".rstrip(", "))
            fla_t, err = float("nan"), float("nan")
            if not args.no_fla:
                try:
                    retune_fla(args.fla_tune)
                    fla = [fla_fn(x, lengths[0]) for _, _, x in inputs]
                    fla_out = fla[0]().float()
                    err = ((ours_out - fla_out).abs().max() / fla_out.abs().max().clamp(min=1)).item()
                    fla_t = graph_time(fla)
                except Exception as exc:  # report and keep our number
                    print(f"# FLA failed on {name}: {type(exc).__name__}: {str(exc)[:200]}")
            tokens = sum(lengths)
            prefill = lengths[0] > 8  # else decode or verify: measured against the byte floor
            if not prefill:
                bytes_moved = state_bytes + len(lengths) * capacity * (HV + HK * D + HV * D) * 4
                floor = bytes_moved / rate / ours_t
            else:
                floor = CHUNK_FLOP_PER_TOKEN_HEAD * tokens * HV / MATMUL_RATE / ours_t
            print(f"{name:24s} {dtype_name:9s} {ours_t * 1e6:9.1f} {fla_t * 1e6:9.1f} {fla_t / ours_t:9.2f} "
                  f"{floor:7.1%} {err:8.1e}", flush=True)
            rows.append({"case": name, "dtype": dtype_name, "ours_us": ours_t * 1e6, "fla_us": fla_t * 1e6,
                         "floor": floor, "max_err": err, "notes": notes})
            for note in notes:
                print(f"#   {note}")
            if not prefill and args.rows:
                for variant in args.rows.split(","):
                    rows, groups = (int(x) for x in variant.split(":"))
                    t_rows = graph_time([ours_fn(f, o, capacity, workspace, rows, groups) for f, o, _ in inputs])
                    print(f"#   rows/warp {rows}, groups/warp {groups}: {t_rows * 1e6:.1f} us "
                          f"({floor * ours_t / t_rows:.1%} of floor)")
            if prefill and args.engines:
                for engine in args.engines.split(","):
                    t_eng = graph_time([ours_fn(f, o, capacity, workspace, engine=engine) for f, o, _ in inputs])
                    print(f"#   engine {engine}: {t_eng * 1e6:.1f} us")
            if prefill and args.split:
                for label, kernels in (("prep", ("gdn_chunk_prep",)),
                                       ("prep + scan", ("gdn_chunk_prep", "gdn_chunked"))):
                    t_k = graph_time([ours_fn(f, o, capacity, workspace, only=kernels) for f, o, _ in inputs])
                    print(f"#   {label}: {t_k * 1e6:.1f} us")
            if prefill and args.prep_heads:
                for heads in (int(n) for n in args.prep_heads.split(",")):
                    t_k = graph_time([ours_fn(f, o, capacity, workspace, prep_heads=heads, only=("gdn_chunk_prep",))
                                      for f, o, _ in inputs])
                    print(f"#   prep, {heads} value heads per block: {t_k * 1e6:.1f} us")
            del inputs, ours, workspace
            torch.cuda.empty_cache()
    write_json(args.json, "bench_gpu", torch.cuda.get_device_name(), rows, copy_rate=rate, programmatic_launch=pdl)


if __name__ == "__main__":
    main()
