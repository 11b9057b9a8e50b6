"""What an export wrote, read back from the output folder: the CLI's closing summary."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..configs.provider_rules import providers as provider_names
from . import io_names as io
from .model_config import load_model_config

# ONNX element type names as the CLI's --dtype spells them.
DTYPE_NAMES = {"FLOAT": "fp32", "FLOAT16": "fp16", "BFLOAT16": "bf16"}
LAYER_KINDS = {"linear_attention": "linear attention", "full_attention": "full attention"}


@dataclass(frozen=True)
class ExportSummary:
    source: Path
    output: Path
    architecture: str
    layers: dict[str, int]  # layer kind -> count, in the checkpoint's order of first appearance
    moe_layers: int  # layers whose feed-forward block is a mixture of experts (the others are dense)
    dtype: str  # activation type of the graph
    op_domains: dict[str, tuple[str, ...]]  # custom domain -> its op types in the graph
    execution_providers: tuple[str, ...]  # those genai_config.json names; none means ORT's CPU default
    state_groups: int
    files: tuple[tuple[str, int], ...]  # (name, bytes), sorted by name
    elapsed_s: float

    def lines(self) -> list[str]:
        total = sum(self.layers.values())
        kinds = ", ".join(f"{count} {kind}" for kind, count in self.layers.items())
        ffn = ("dense" if not self.moe_layers else "MoE" if self.moe_layers == total
               else f"MoE in {self.moe_layers}, dense in {total - self.moe_layers}")
        domains = "; ".join(f"{domain} ({', '.join(ops)})" for domain, ops in self.op_domains.items()) or "none"
        size = sum(nbytes for _, nbytes in self.files)
        return [
            f"exported {self.source} -> {self.output} in {self.elapsed_s:.2f} s",
            f"  architecture        {self.architecture}",
            f"  layers              {total}: {kinds}; feed-forward {ffn}",
            f"  dtype               {self.dtype}",
            f"  custom ops          {domains}",
            f"  execution provider  {', '.join(self.execution_providers) or 'not named (CPU unless the runtime picks another)'}",
            f"  state groups        {self.state_groups}",
            f"  files               {len(self.files)}, {_size(size)}",
            *(f"    {name:<30} {_size(nbytes):>10}" for name, nbytes in self.files),
        ]


def summarize(model_dir, out_dir, elapsed_s: float) -> ExportSummary:
    """The summary of the export of ``model_dir`` in ``out_dir`` (reads its genai_config.json and graph)."""
    import onnx

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    cfg = load_model_config(model_dir)
    config = json.loads((out_dir / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    graph = onnx.load(out_dir / decoder["filename"], load_external_data=False).graph
    domains: dict[str, set[str]] = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            domains.setdefault(node.domain, set()).add(node.op_type)
    # A conv state is always in the activation type (the KV cache may not be: a com.microsoft paged pool).
    conv_states = {io.PAST_CONV % layer for layer in cfg.linear_layers}
    conv_state = next((i for i in graph.input if i.name in conv_states), None)
    elem = onnx.TensorProto.DataType.Name(conv_state.type.tensor_type.elem_type) if conv_state else "unknown"
    providers = tuple(provider_names(decoder["session_options"]))
    return ExportSummary(
        source=model_dir, output=out_dir, architecture=cfg.architecture,
        layers={LAYER_KINDS.get(kind, kind): count for kind, count in Counter(cfg.layer_types).items()},
        moe_layers=sum(cfg.moe_layers), dtype=DTYPE_NAMES.get(elem, elem.lower()),
        op_domains={domain: tuple(sorted(ops)) for domain, ops in sorted(domains.items())},
        execution_providers=providers, state_groups=len(decoder.get("state_groups", [])),
        files=tuple((p.relative_to(out_dir).as_posix(), p.stat().st_size) for p in sorted(out_dir.rglob("*"))
                    if p.is_file()),  # the CUDA kernel images in their folder too
        elapsed_s=elapsed_s)


def _size(nbytes: float) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    for unit in ("KB", "MB", "GB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.1f} {unit}"
