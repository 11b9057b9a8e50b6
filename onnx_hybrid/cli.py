"""Command-line entry points: ``export-hybrid`` and ``onnx-hybrid <subcommand>``.

User errors (a bad checkpoint, an existing output folder, a bad option, a failing file system) print one
line to stderr and exit with status 2; anything else is a bug and keeps its traceback. SIGINT and SIGTERM
unwind like an error (the export's staging folder is removed) and exit with 130 and 143.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import Callable

from . import __version__
from .configs.commands import SUBCOMMANDS as CONFIG_SUBCOMMANDS
from .configs.state_groups import FORMS, RELEASED
from .ops import contract

USAGE_ERROR = 2


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from .exporter import kv_pool
    from .exporter.export import DTYPES, EXECUTION_PROVIDERS, OP_DOMAINS
    from .exporter.graph.group_query_attention import KV_CACHES
    from .exporter.graph.quantized import WEIGHT_TYPES
    from .exporter.quantize import BLOCK_SIZES
    from .ops.library import DEFAULT_CUDA_ARCHS

    parser.add_argument("model_dir", help="Hugging Face checkpoint folder (config.json + *.safetensors)")
    parser.add_argument("-o", "--output", required=True, help="output folder (created; see --overwrite)")
    parser.add_argument("-e", "--execution-provider", choices=list(EXECUTION_PROVIDERS), default="cpu",
                        help="where onnxruntime-genai runs the export (written into genai_config.json for the "
                             "decoder and the MTP head). cuda: fp16 unless --dtype says otherwise, the library's "
                             "CUDA kernel images for --cuda-arch copied beside it, and ONNX Runtime's CUDA "
                             "PagedAttention in --paged exports. Default: cpu")
    parser.add_argument("--cuda-arch", type=int, action="append", default=None, metavar="CC", dest="cuda_archs",
                        help="GPU architecture the CUDA export carries kernels for, as a compute capability without "
                             "the dot (repeatable; default: " + ", ".join(map(str, DEFAULT_CUDA_ARCHS)) +
                             ": A100 and its sm_86/87 kin, L4/L40, H100/H200)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None,
                        help="activation and weight type (recurrent state and norm statistics stay fp32); default "
                             "fp32 for -e cpu, fp16 for -e cuda; bf16 graphs need an execution provider with bf16 "
                             "kernels, ORT's CPU EP has few")
    parser.add_argument("--state-update-capacity", type=int, default=0, metavar="N",
                        help=f"compact state-update slots per request, 0..{contract.MAX_STATE_UPDATE_CAPACITY}")
    parser.add_argument("--op-domain", choices=list(OP_DOMAINS), default=contract.DOMAIN,
                        help="domain of GatedDeltaNet / VarlenCausalConvWithState: ours (the library is copied "
                             "next to the model) or com.microsoft (ONNX Runtime's own kernels)")
    parser.add_argument("--all-logits", action="store_true",
                        help="return logits for every position, not only each row's last one")
    parser.add_argument("--manifest-format", choices=FORMS, default=RELEASED,
                        help="state_groups form in genai_config.json: released (onnxruntime-genai 0.18) or "
                             "bindings (PR #2454)")
    parser.add_argument("--paged", action="store_true",
                        help="packed tokens and PagedAttention over a block pool: the graph onnxruntime-genai's "
                             "Engine (dynamic batching) runs")
    parser.add_argument("--paged-attention", choices=list(OP_DOMAINS), default=None,
                        help="PagedAttention kernel of the paged export: onnx_hybrid (our CPU kernel, any dtype) or "
                             "com.microsoft (ONNX Runtime's CUDA kernel, fp16/bf16 pool); default: com.microsoft "
                             "with -e cuda, else --op-domain")
    parser.add_argument("--block-size", type=int, default=None, metavar="N",
                        help="tokens per KV block of the paged export (power of two >= 16; default 256)")
    parser.add_argument("--num-blocks", type=int, default=None, metavar="N",
                        help="KV blocks in the paged pool, written to engine.dynamic_batching; default with our "
                             f"PagedAttention: room for {kv_pool.DEFAULT_POOL_REQUESTS} full-context requests, at most "
                             f"{kv_pool.DEFAULT_POOL_BYTES >> 30} GiB of keys and values; with com.microsoft's (CUDA): "
                             "unset, onnxruntime-genai sizes it from a share of the GPU's free memory "
                             "(gpu_utilization_factor 0.5)")
    parser.add_argument("--no-mtp", dest="mtp", action="store_false",
                        help="skip the MTP drafter (mtp.onnx, hidden_states output, model.mtp) even if the checkpoint "
                             "has mtp.* weights")
    parser.add_argument("--max-draft-tokens", type=int, default=None, metavar="N",
                        help="speculative.max_draft_tokens written with an MTP head (default: the state-update "
                             "capacity when paged, else 1)")
    parser.add_argument("--logits-dtype", choices=list(DTYPES), default=None,
                        help="type of the main logits (default: --dtype); fp16 lets onnxruntime-genai 0.18's "
                             "MtpGenerator run on CPU, which fails on fp32 logits")
    parser.add_argument("--weights", choices=[*WEIGHT_TYPES, *DTYPES], default=None,
                        help="weight type of the linear projections: int4 / int8 block-quantize them (MatMulNBits or "
                             "our QuantizedLinear for int4, experts as QMoE) while they stream; default: the "
                             "activation dtype")
    parser.add_argument("--weight-block", type=int, choices=BLOCK_SIZES, default=BLOCK_SIZES[0], metavar="N",
                        help="quantization block along the input axis: " + ", ".join(map(str, BLOCK_SIZES)) +
                             f" (default {BLOCK_SIZES[0]}; int4 in our CPU exports keeps speculative verify steps "
                             "lossless at every block; through MatMulNBits only int8 block 32/64 does on every CPU)")
    parser.add_argument("--weight-asymmetric", action="store_true",
                        help="per-block zero points (default: symmetric blocks)")
    parser.add_argument("--accuracy-level", type=int, choices=range(5), default=None, metavar="N",
                        help="MatMulNBits/QMoE/QuantizedLinear accuracy_level: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 "
                             "activations (default 4 on cpu, where int4 projections then go to QuantizedLinear's "
                             "int8 kernel and int8 ones to MatMulNBits, whose rows at block 32/64 do not depend on "
                             "the rows beside them either, so speculative verify steps equal plain decoding; 0 on "
                             "cuda, where QuantizedLinear's rows are independent at any level and no MatMulNBits "
                             "setting's are)")
    parser.add_argument("--quantize-lm-head", action="store_true",
                        help="quantize the lm_head too, as the builder's int4 export does (0.8B, int4, 2 CPU threads: "
                             "decode 25.8 -> 47.2 tok/s; it is the largest matrix a decode step reads)")
    parser.add_argument("--quantize-embedding", action="store_true",
                        help="quantize the embedding table too (GatherBlockQuantized)")
    parser.add_argument("--quantize-gates", action="store_true",
                        help="quantize the GatedDeltaNet b and a gate projections too (0.12%% of a 9B layer's "
                             "weights; by default they keep the activation type, as the builder's do: quantized, "
                             "they move int8 logits about 5%% further from the unquantized export's)")
    parser.add_argument("--kv-cache", choices=list(KV_CACHES), default=None,
                        help="full-attention KV of a non-paged export: concat (grows per step) or shared "
                             "(GroupQueryAttention over buffers of search.max_length shared in place; what CUDA graph "
                             "capture needs, and faster on the CPU too). Default: shared, concat for fp32 -e cuda")
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                        help="write enable_cuda_graph for the CUDA provider: onnxruntime-genai captures decode "
                             "steps in CUDA graphs and replays them (default: on for -e cuda with shared KV buffers "
                             "and no MTP head); for batches > 1 run onnxruntime-genai with "
                             "ORTGENAI_SHARE_RECURRENT_STATE_UNDER_GRAPH_CAPTURE=0 (README)")
    parser.add_argument("--linear-op", action=argparse.BooleanOptionalAction, default=None,
                        help="projections in the activation type as onnx_hybrid::Linear instead of Gemm: the same "
                             "product, whose CUDA kernel reads a one-row decode step's weights at the copy rate "
                             "(default: on for -e cuda with fp16/bf16 and our ops, unless the export verifies drafts); "
                             "with --weights int4 also the 4-bit ones as onnx_hybrid::QuantizedLinear instead of "
                             "MatMulNBits (default: on the CPU at --accuracy-level 4, where "
                             "it multiplies int8 rows, faster than MatMulNBits; on CUDA where the export verifies "
                             "drafts, whose verify rows it keeps bit-equal to decode steps, or is --paged, whose "
                             "batched steps it reads the weights once for)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar and no summary (warnings and errors still go to stderr)")


PAGED_ONLY = ("paged_attention", "block_size", "num_blocks")


def _run_export(args: argparse.Namespace) -> None:
    from .exporter import ExportError, export
    from .exporter.summary import summarize

    paged_options = {name: getattr(args, name) for name in PAGED_ONLY if getattr(args, name) is not None}
    if paged_options and not args.paged:
        given = ", ".join(f"--{name.replace('_', '-')}" for name in paged_options)
        raise ExportError(f"{given}: options of the paged export, which needs --paged")
    start = time.perf_counter()
    out = export(args.model_dir, args.output, dtype=args.dtype, state_update_capacity=args.state_update_capacity,
                 op_domain=args.op_domain, overwrite=args.overwrite, all_logits=args.all_logits,
                 progress=not args.quiet, manifest_format=args.manifest_format, paged=args.paged,
                 mtp=args.mtp, max_draft_tokens=args.max_draft_tokens, logits_dtype=args.logits_dtype,
                 execution_provider=args.execution_provider, cuda_archs=args.cuda_archs, weights=args.weights,
                 weight_block=args.weight_block, weight_asymmetric=args.weight_asymmetric,
                 accuracy_level=args.accuracy_level, quantize_lm_head=args.quantize_lm_head,
                 quantize_embedding=args.quantize_embedding, quantize_gates=args.quantize_gates,
                 kv_cache=args.kv_cache, cuda_graph=args.cuda_graph,
                 linear_op=args.linear_op, **paged_options)
    if not args.quiet:
        print("\n".join(summarize(args.model_dir, out, time.perf_counter() - start).lines()))


def _add_prepare_cuda_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", type=int, action="append", required=True, metavar="CC",
                        help="compute capability without the dot, e.g. 90 for H100/H200, 80 for A100 (repeatable); "
                             "a cubin also runs on later minors of its major (sm_80 on sm_86)")
    parser.add_argument("-o", "--output", required=True,
                        help="folder for sm<CC>.cubin; point ONNX_HYBRID_CUDA_IMAGES (or "
                             "onnx_hybrid.ops.library.prepare_cuda(directory=...)) at it on the GPU host")


def _run_prepare_cuda(args: argparse.Namespace) -> None:
    from .ops.library import write_cuda_images

    for path in write_cuda_images(args.arch, args.output):
        print(path)


# Subcommands of `onnx-hybrid`: name -> (help, add_arguments, run); run may return an exit status.
SUBCOMMANDS: dict[str, tuple[str, Callable, Callable]] = {
    "export": ("export a Hugging Face hybrid checkpoint to ONNX (same as export-hybrid)",
               _add_export_arguments, _run_export),
    "prepare-cuda": ("compile the CUDA kernels of the custom-op library for given GPU architectures (no GPU "
                     "needed; CuPy and NVRTC are), for hosts that run CUDA sessions without CuPy",
                     _add_prepare_cuda_arguments, _run_prepare_cuda),
    **CONFIG_SUBCOMMANDS,
}


def _user_errors() -> tuple[type[BaseException], ...]:
    from .cuda_ops.compiler import KernelBuildError
    from .exporter.errors import ExportError

    # OSError: the environment, not a bug (no space left, no such folder, the custom-op library not built).
    return ExportError, contract.ContractError, KernelBuildError, OSError


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt (not an Exception) so that only cleanup code sees it."""


def _terminate(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    raise Terminated


def _run(prog: str, run: Callable, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(message)s")
    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        status = run(args)
    except _user_errors() as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return status or 0


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="export-hybrid", description=SUBCOMMANDS["export"][0])
    _add_version(parser)
    _add_export_arguments(parser)
    return _run(parser.prog, _run_export, parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onnx-hybrid", description="onnx-hybrid tools")
    _add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_arguments, run) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        add_arguments(sub)
        sub.set_defaults(run=run)
    args = parser.parse_args(argv)
    return _run(f"{parser.prog} {args.command}", args.run, args)


if __name__ == "__main__":
    sys.exit(main())
