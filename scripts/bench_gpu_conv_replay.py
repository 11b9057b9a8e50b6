"""VarlenCausalConvWithState and both capsule replays on the GPU, against their byte floors.

The project's goal for conv and replay is at least 80% of their own byte floor: the bytes each must move
(inputs read, outputs written, state read and written, capsule written or read) at the device-to-device copy
rate measured in the same run. 27B geometry: conv channels 2 Hk Dk + Hv Dv = 10240 with 4 taps, GDN state
[Hv, Dv, Dk] = [48, 128, 128] fp32. The conv runs side by side with FLA 0.6.0's `causal_conv1d` (prefill,
verify; varlen) and `causal_conv1d_update` (decode) on the same inputs, both from CUDA graphs; FLA has no
capsule, so it does less work in the capture cases; for decode its update kernel is also timed with each of its
autotune configs, and the fastest counts (its own tuning of a kernel of a few microseconds varies from run to
run). The replays have no peer. Input sets rotate so that each replay of the graph touches more than twice the L2
(bench_gpu.py's method).
"""

from __future__ import annotations

import datetime

import torch

from bench_gpu import (D, HK, HV, benchmark_arguments, benchmark_dtypes, best_config_time, copy_time, current_stream,
                       graph_time, parse_benchmark_arguments, retune_fla, rotated_sets)
from onnx_hybrid import cuda_ops
from onnx_hybrid_testing.device_rates import copy_rate
from onnx_hybrid_testing.results import write_json

CHANNELS, TAPS = 2 * HK * D + HV * D, 4
GDN_SLOT = HV + HK * D + HV * D  # fp32 values per captured token (docs/op-contract.md#capsule-layout)

CONV_CASES = [  # name, tokens per row, rows, capture capacity
    ("conv decode B=1", 1, 1, 0), ("conv decode B=32", 1, 32, 0), ("conv decode B=128", 1, 128, 0),
    ("conv verify 4 B=32 cap", 4, 32, 4), ("conv verify 4 B=128 cap", 4, 128, 4),
    ("conv short 1x200", 200, 1, 0),  # at most kConvShortTokens tokens: one token per thread
    # mid-sized calls (more than kConvShortTokens tokens, fewer than kConvLongTokens): runs of
    # CONV_MEDIUM_TOKENS tokens per thread
    ("conv mid 1x512", 512, 1, 0), ("conv mid 1x1024", 1024, 1, 0), ("conv mid 1x2000", 2000, 1, 0),
    ("conv mid 4x300 cap", 300, 4, 4),
    ("conv prefill 1x4096", 4096, 1, 0), ("conv prefill 1x8192", 8192, 1, 0), ("conv prefill 8x2048", 2048, 8, 0),
]
REPLAY_CASES = [  # name, rows, capacity, accepted per row
    ("gdn replay B=32 2/4", 32, 4, 2), ("gdn replay B=128 2/4", 128, 4, 2), ("gdn replay B=128 4/4", 128, 4, 4),
    ("conv replay B=32 2/4", 32, 4, 2), ("conv replay B=128 2/4", 128, 4, 2),
]


def conv_inputs(tokens: int, rows: int, capacity: int, dtype, gen):
    t = tokens * rows
    dev = "cuda"
    x = torch.randn(t, CHANNELS, dtype=dtype, device=dev, generator=gen)
    feeds = {
        "input": x,
        "weight": (torch.randn(CHANNELS, 1, TAPS, device=dev, generator=gen) / 2).to(dtype),
        "bias": (0.1 * torch.randn(CHANNELS, device=dev, generator=gen)).to(dtype),
        "initial_state": torch.randn(rows, CHANNELS, TAPS - 1, dtype=dtype, device=dev, generator=gen),
        "cumulative_sequence_length": torch.arange(0, t + 1, tokens, dtype=torch.int32, device=dev),
    }
    if capacity:
        feeds["capture_count"] = torch.full((rows,), capacity, dtype=torch.int32, device=dev)
    outs = {"output": torch.empty_like(x), "final_state": torch.empty_like(feeds["initial_state"]),
            "state_update": torch.empty(rows, capacity, CHANNELS, dtype=dtype, device=dev)}
    # FLA's cache is [N, C, W]: the oldest slot first, then our three samples.
    fla_state = torch.cat([torch.zeros_like(feeds["initial_state"][..., :1]), feeds["initial_state"]], dim=-1)
    return feeds, outs, fla_state


def conv_bytes(tokens: int, rows: int, capacity: int, esize: int) -> int:
    t = tokens * rows
    return esize * (2 * t * CHANNELS + 2 * rows * CHANNELS * (TAPS - 1) + rows * capacity * CHANNELS)


def ours_conv(feeds, outs, capacity, in_place=False, only=None):
    """Our call; ``in_place``: final_state is initial_state, which takes the two-launch plan in prefill; ``only``:
    launch only the plan's kernels whose names start with these prefixes."""
    outs = dict(outs, final_state=feeds["initial_state"]) if in_place else outs

    def run():
        cuda_ops.varlen_causal_conv(feeds, outputs=outs, stream=current_stream(), only_kernels=only,
                                    activation="silu", dilation=1, state_update_capacity=capacity)
        return outs["output"]
    return run


def fla_conv(feeds, fla_state, tokens):
    from fla.modules.causal_conv1d import causal_conv1d, causal_conv1d_update
    from fla.ops.utils.index import prepare_chunk_indices

    weight = feeds["weight"][:, 0]
    if tokens == 1:
        cache = fla_state.clone()

        def run():  # updates the cache in place, as a decode step does
            y = causal_conv1d_update(feeds["input"], cache, weight=weight, bias=feeds["bias"], activation="silu")
            return y[0] if isinstance(y, tuple) else y
        return run
    cu = feeds["cumulative_sequence_length"].long()
    # FLA derives its chunk indices from the offsets on the host and copies them over during the call, which graph
    # capture refuses (its cache of them holds only the last set's). Prepared here, outside the graph, as
    # bench_gpu.py does for the GDN prefill; 64 is causal_conv1d's default chunk size.
    chunk_indices = prepare_chunk_indices(cu, 64)

    def run():
        y, _ = causal_conv1d(feeds["input"][None], weight=weight, bias=feeds["bias"], initial_state=fla_state,
                             output_final_state=True, activation="silu", cu_seqlens=cu, chunk_indices=chunk_indices)
        return y[0]
    return run


def split_times(sets, capacity) -> str:
    """The call in place (two launches: output pass, then state pass), and each of its kernels alone, each
    from its own graph."""
    t = graph_time([ours_conv(f, o, capacity, in_place=True) for f, o, _ in sets])
    parts = [f"in place {t * 1e6:.1f} us"]
    for prefix in ("conv_output", "conv_state"):
        t = graph_time([ours_conv(f, o, capacity, in_place=True, only=(prefix,)) for f, o, _ in sets])
        parts.append(f"{prefix} alone {t * 1e6:.1f} us")
    return "  (" + ", ".join(parts) + ")"


def bench_conv(dtype, rate, gen, fla_tune: str | None, only: list[str], split: bool, rows_out: list) -> None:
    """``fla_tune``: retune_fla's choice, or None to leave FLA out; each row is also appended to ``rows_out``."""
    esize = torch.tensor([], dtype=dtype).element_size()
    for name, tokens, rows, capacity in CONV_CASES:
        if only and not any(o in name for o in only):
            continue
        nbytes = conv_bytes(tokens, rows, capacity, esize)
        sets = [conv_inputs(tokens, rows, capacity, dtype, gen) for _ in range(rotated_sets(nbytes))]
        ours = [ours_conv(f, o, capacity) for f, o, _ in sets]
        ours_out = ours[0]().float()
        ours_t = graph_time(ours)
        fla_t, err, notes = float("nan"), float("nan"), []
        if fla_tune is not None:
            try:
                retune_fla(fla_tune)
                fla = [fla_conv(f, s, tokens) for f, _, s in sets]
                fla_out = fla[0]().float().reshape(ours_out.shape)
                err = ((ours_out - fla_out).abs().max() / fla_out.abs().max().clamp(min=1)).item()
                fla_t = graph_time(fla)
                if tokens == 1:  # FLA's own tuning of its update kernel is noisy at these sizes: each config timed too
                    from fla.modules.causal_conv1d.ops import causal_conv1d_update_kernel

                    best_t, config = best_config_time(causal_conv1d_update_kernel, fla)
                    notes.append(f"FLA's update kernel: {fla_t * 1e6:.1f} us as its autotune chose, "
                                 f"{best_t * 1e6:.1f} us with its best config ({config})")
                    fla_t = min(fla_t, best_t)
            except Exception as exc:  # report and keep our number
                print(f"# FLA failed on {name}: {type(exc).__name__}: {str(exc)[:200]}")
        parts = split_times(sets, capacity) if split and name.startswith("conv prefill") else ""
        print(f"{name:26s} {str(dtype)[6:]:9s} {ours_t * 1e6:9.1f} {fla_t * 1e6:9.1f} {fla_t / ours_t:9.2f} "
              f"{nbytes / rate / ours_t:7.1%} {nbytes / rate / copy_time(nbytes):7.1%} {err:8.1e}{parts}", flush=True)
        rows_out.append({"case": name, "dtype": str(dtype)[6:], "ours_us": ours_t * 1e6, "fla_us": fla_t * 1e6,
                         "floor": nbytes / rate / ours_t, "max_err": err, "notes": notes})
        for note in notes:
            print(f"#   {note}")
        del sets, ours
        torch.cuda.empty_cache()


def bench_replays(rate, gen, only: list[str], rows_out: list) -> None:
    for name, rows, capacity, accepted in REPLAY_CASES:
        if only and not any(o in name for o in only):
            continue
        acc = torch.full((rows,), accepted, dtype=torch.int32, device="cuda")
        if name.startswith("gdn"):
            state_bytes = rows * HV * D * D * 4
            nbytes = 2 * state_bytes + rows * accepted * GDN_SLOT * 4
            sets = [(torch.randn(rows, HV, D, D, device="cuda", generator=gen),
                     torch.randn(rows, capacity * GDN_SLOT, device="cuda", generator=gen),
                     torch.empty(rows, HV, D, D, device="cuda")) for _ in range(rotated_sets(nbytes))]
            fns = [lambda s=s, c=c, o=o: cuda_ops.replay_gdn(s, c, acc, capacity, out=o, stream=current_stream())
                   for s, c, o in sets]
        else:
            nbytes = 2 * 2 * rows * CHANNELS * (TAPS - 1) + 2 * rows * accepted * CHANNELS
            sets = [(torch.randn(rows, CHANNELS, TAPS - 1, device="cuda", generator=gen).half(),
                     torch.randn(rows, capacity, CHANNELS, device="cuda", generator=gen).half(),
                     torch.empty(rows, CHANNELS, TAPS - 1, device="cuda", dtype=torch.float16))
                    for _ in range(rotated_sets(nbytes))]
            fns = [lambda s=s, c=c, o=o: cuda_ops.replay_conv(s, c, acc, out=o, stream=current_stream())
                   for s, c, o in sets]
        t = graph_time(fns)
        print(f"{name:26s} {'float32' if name.startswith('gdn') else 'float16':9s} {t * 1e6:9.1f} {'':9s} {'':9s} "
              f"{nbytes / rate / t:7.1%} {nbytes / rate / copy_time(nbytes):7.1%}", flush=True)
        rows_out.append({"case": name, "dtype": "float32" if name.startswith("gdn") else "float16", "ours_us": t * 1e6,
                         "floor": nbytes / rate / t})
        del sets, fns
        torch.cuda.empty_cache()


def main() -> None:
    ap = benchmark_arguments()
    ap.add_argument("--split", action="store_true",
                    help="also time the prefill in place (two launches), and its output and state kernels apart")
    args = parse_benchmark_arguments(ap)
    only = [c for c in args.cases.split(",") if c]
    rate = copy_rate()
    print(f"# {datetime.date.today()} {torch.cuda.get_device_name()}  copy rate {rate / 1e12:.2f} TB/s")
    # copy: the floor's fraction that a plain device copy of the same bytes reaches, timed the same way
    print(f"{'case':26s} {'dtype':9s} {'ours us':>9s} {'FLA us':>9s} {'FLA/ours':>9s} {'floor':>7s} {'copy':>7s} "
          f"{'max err':>8s}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for dtype_name in benchmark_dtypes(args.dtype):
        bench_conv(getattr(torch, dtype_name), rate, gen, None if args.no_fla else args.fla_tune, only, args.split,
                   rows)
    bench_replays(rate, gen, only, rows)
    write_json(args.json, "bench_gpu_conv_replay", torch.cuda.get_device_name(), rows, copy_rate=rate)


if __name__ == "__main__":
    main()
