"""Shared pieces of the end-to-end benchmarks (scripts/bench_e2e_cpu.py, bench_e2e_gpu.py, bench_speculative_cpu.py).

Synthetic checkpoints written once into a work folder, onnxruntime-genai's builder run on them, a view of a
paged MTP export without its head, greedy onnxruntime-genai Generator timings, the bytes of weights a decode
step reads, and the CPU model every benchmark table names.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def cpu_model() -> str:
    """The host CPU's brand string (lscpu's "Model name"), for benchmark headers; else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def synthetic_checkpoint(directory: Path, geometry) -> Path:
    """The synthetic checkpoint of ``geometry`` in ``directory``, written unless complete (config.json is
    written last, so its presence marks a complete folder)."""
    from .synthetic import write_checkpoint

    if not (directory / "config.json").is_file():
        write_checkpoint(directory, geometry)
    return directory


def with_mtp_head(base: Path, target: Path) -> Path:
    """``base`` plus a random MTP head in a folder of its own whose shards are links (base stays untouched)."""
    from .mtp import MTP_FILE, add_mtp_head, random_mtp_tensors

    if not (target / MTP_FILE).is_file():
        target.mkdir(parents=True, exist_ok=True)
        for source in base.iterdir():
            link = target / source.name
            if source.suffix == ".json":
                shutil.copy2(source, link)
            elif not link.exists():
                link.symlink_to(source.resolve())
        add_mtp_head(target, random_mtp_tensors(target))
    return target


def builder_command(checkpoint: Path, out: Path, precision: str, provider: str, cache: Path,
                    extra_options: dict[str, str] | None = None) -> list[str]:
    """onnxruntime-genai's model builder on a local checkpoint (``-i``: nothing is downloaded)."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
               "-p", precision, "-e", provider, "-c", str(cache)]
    if extra_options:
        command += ["--extra_options", *(f"{k}={v}" for k, v in extra_options.items())]
    return command


def builder_export(checkpoint: Path, out: Path, precision: str, provider: str, cache: Path,
                   extra_options: dict[str, str] | None = None) -> Path:
    """Run the builder unless ``out`` already holds its genai_config.json."""
    if not (out / "genai_config.json").is_file():
        subprocess.run(builder_command(checkpoint, out, precision, provider, cache, extra_options), check=True)
    return out


def without_mtp(package: Path, target: Path) -> Path:
    """``package`` (an export with ``model.mtp``) without its head, in ``target``: the weights and the op
    library hard-linked (ORT and onnxruntime-genai resolve symbolic links and refuse files outside the folder;
    one library file is one loaded library, whichever folder a session names), the rest copied, ``model.mtp``
    and ``speculative`` removed from genai_config.json."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for source in package.iterdir():
        if source.is_dir():  # the CUDA kernel images beside the library
            shutil.copytree(source, target / source.name, copy_function=os.link)
        elif source.suffix in (".data", ".so"):
            if not source.name.startswith("mtp."):
                os.link(source, target / source.name)
        elif source.name != "genai_config.json" and not source.name.startswith("mtp."):
            shutil.copy2(source, target / source.name)
    config = json.loads((package / "genai_config.json").read_text())
    config["model"].pop("mtp", None)
    config.pop("speculative", None)
    (target / "genai_config.json").write_text(json.dumps(config, indent=4))
    return target


def load_model(package: Path, *, graph: bool | None = None, threads: int | None = None, spinning: bool = True):
    """og.Model of ``package`` (on the execution provider its genai_config.json names). ``graph`` (true or false)
    overrides enable_cuda_graph, which onnxruntime-genai 0.18 reads as a CUDA provider option of the decoder
    session; None keeps what the export says.
    ``threads``: intra-op threads of the decoder and the MTP head. ``spinning=False`` turns the thread pools'
    spinning off: where a decoder and a head share the cores, one's spinning pool steals the other's time."""
    import onnxruntime_genai as og

    package = Path(package)
    genai = json.loads((package / "genai_config.json").read_text())
    config = og.Config(str(package))
    if graph is not None:
        config.set_provider_option("cuda", "enable_cuda_graph", "1" if graph else "0")
    if threads or not spinning:
        option = {"session_options": {**({"intra_op_num_threads": threads} if threads else {}),
                                      **({} if spinning else {"allow_spinning": "0"})}}
        head = {"mtp": option} if "mtp" in genai["model"] else {}
        config.overlay(json.dumps({"model": {"decoder": option, **head}}))
    return og.Model(config)


def generator_run(model, prompts: np.ndarray, new_tokens: int, repeats: int, warm_up: bool = True) -> dict:
    """Greedy og.Generator runs of ``prompts`` ([batch, length] int32) for exactly ``new_tokens`` tokens each
    (``min_length`` keeps EOS from ending a row early), ``repeats`` timed runs after a warm-up run (prepacking,
    allocations, graph capture; none if not ``warm_up``); best, not mean, since interference only adds time.
    Returns the prefill time (``append_tokens``, which includes the first logits), the decode rate of the whole
    run (``decode_tok_s``: what a request of that length sees), the steady rate (``decode_steady_tok_s``: batch
    over the median step once the first decode step has run), that first step's time (``first_step_ms``: with
    CUDA graphs, onnxruntime-genai captures each new generator's step there and backs up the recurrent states
    around the capture), and the first row's tokens."""
    import onnxruntime_genai as og

    batch, length = prompts.shape
    prefill, decode, steady, first, tokens = [], [], [], [], []
    skip = 1 if warm_up else 0
    for _ in range(repeats + skip):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, batch_size=batch, max_length=length + new_tokens,
                                  min_length=length + new_tokens)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompts)
        gen.get_logits()  # a copy to the host: the device has finished the prefill
        t1 = time.perf_counter()
        steps = []
        while not gen.is_done():
            s0 = time.perf_counter()
            gen.generate_next_token()  # picks a token on the host side: each call waits for its step
            steps.append(time.perf_counter() - s0)
        produced = batch * (len(gen.get_sequence(0)) - length)  # also waits for the device
        t2 = time.perf_counter()
        prefill.append(t1 - t0)
        decode.append(produced / (t2 - t1) if t2 > t1 else float("nan"))
        # The first call picks from the prompt's logits (no model run); the second runs the first decode step.
        first.append(steps[1] if len(steps) > 1 else float("nan"))
        later = steps[2:]
        steady.append(batch / float(np.median(later)) if later else float("nan"))
        tokens = [int(t) for t in gen.get_sequence(0)][length:]
        del gen
    return {"prefill_ms": 1e3 * min(prefill[skip:]), "decode_tok_s": max(decode[skip:]),
            "decode_steady_tok_s": max(steady[skip:]), "first_step_ms": 1e3 * min(first[skip:]), "tokens": tokens}


def _gathered(op_type: str, index: int) -> bool:
    """Whether input ``index`` of an ``op_type`` node is a table it only reads rows of (an embedding, a
    quantized one's scales and zero points, rotary cos/sin caches): a decode step reads a row, not the table."""
    return ((op_type == "Gather" and index == 0) or (op_type == "GatherBlockQuantized" and index != 1)
            or (op_type.endswith("RotaryEmbedding") and index in (2, 3)))


def weight_bytes(model_path: Path) -> dict[str, int]:
    """Bytes of the graph's initializers (external data included, nothing loaded): ``total``, and
    ``per_token``, what one decode step reads: all but tables it only reads rows of (see ``_gathered``;
    a tied lm_head's MatMul still counts)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    uses: dict[str, set[bool]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses.setdefault(name, set()).add(_gathered(node.op_type, index))
    total = per_token = 0
    for tensor in graph.initializer:
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            size = (count + 1) // 2
        else:
            size = count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
        total += size
        if uses.get(tensor.name) != {True}:
            per_token += size
    return {"total": total, "per_token": per_token}

