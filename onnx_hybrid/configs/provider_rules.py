"""``session_options.provider_options`` as onnxruntime-genai 0.18 reads it, and what a CUDA export needs beside it.

og.Config parses ``provider_options`` as a list of one-key objects (provider name -> options), every option value
a JSON string ("Expected a string but saw a number" otherwise); og.Model then refuses a provider name it does not
know ("Unknown provider name"), and a CUDA provider with ``enable_cuda_graph`` "1" where the KV buffers are not
shared ("Graph capture is not supported with past_present_share_buffer set to false"). All are checked for the
decoder and the MTP head. A CUDA export whose graph uses our ops also needs the library's kernel images in
``onnx_hybrid_cuda/`` beside the library (or in $ONNX_HYBRID_CUDA_IMAGES on the host that runs it), which is a
warning here: the validator may run elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from ..ops.library import IMAGE_FOLDER, image_file_name
from .genai_config import CUDA_GRAPH_OPTION
from .findings import PARSE, SESSION, WARNING, Finding, Report
from .parse import json_type

# The names og 0.18 accepts (its own error message lists them; "cuda" loads its CUDA interface).
PROVIDER_NAMES = frozenset({
    "cuda", "CUDAExecutionProvider", "CPU", "CPUExecutionProvider", "DML", "DmlExecutionProvider", "QNN",
    "QNNExecutionProvider", "OpenVINO", "OpenVINOExecutionProvider", "SNPE", "SNPEExecutionProvider", "XNNPACK",
    "XnnpackExecutionProvider", "WEBNN", "WebNNExecutionProvider", "WebGPU", "WebGpuExecutionProvider", "AZURE",
    "AzureExecutionProvider", "JS", "JsExecutionProvider", "VitisAI", "VitisAIExecutionProvider", "CoreML",
    "CoreMLExecutionProvider", "MIGraphX", "MIGraphXExecutionProvider",
})
CUDA_NAMES = frozenset({"cuda", "CUDAExecutionProvider"})


def _sections(config: dict):
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    for key in ("decoder", "mtp"):
        section = model.get(key)
        if isinstance(section, dict) and isinstance(section.get("session_options"), dict):
            yield f"model.{key}.session_options", section["session_options"]


def providers(session_options: dict) -> list[str]:
    """The provider names listed in ``session_options.provider_options``, in order (well-formed entries only)."""
    entries = session_options.get("provider_options", [])
    return [name for entry in (entries if isinstance(entries, list) else []) if isinstance(entry, dict)
            for name in entry]


def uses_cuda(session_options: dict) -> bool:
    """Whether ``session_options`` ask onnxruntime-genai for its CUDA provider."""
    return bool(CUDA_NAMES & set(providers(session_options)))


def _shares_kv_buffers(config: dict) -> bool:
    search = config.get("search")
    return isinstance(search, dict) and search.get("past_present_share_buffer") is True


def check_provider_options(config: dict, report: Report) -> None:
    """The parse and load rules of ``provider_options`` (og.Config, then og.Model)."""
    for path, options in _sections(config):
        entries = options.get("provider_options", [])
        if not isinstance(entries, list):
            report.add(Finding("parse.provider_options", PARSE, f"{path}.provider_options",
                               "must be a list of {provider: {option: string}} objects",
                               actual=type(entries).__name__))
            continue
        for index, entry in enumerate(entries):
            where = f"{path}.provider_options[{index}]"
            if not isinstance(entry, dict):
                report.add(Finding("parse.provider_options", PARSE, where, "must be an object {provider: {options}}",
                                   actual=type(entry).__name__))
                continue
            for name, values in entry.items():
                if not isinstance(values, dict):
                    report.add(Finding("parse.provider_options", PARSE, f"{where}.{name}",
                                       "must be an object of option strings", actual=type(values).__name__))
                    continue
                for key, value in values.items():
                    if not isinstance(value, str):
                        report.add(Finding("parse.provider_options", PARSE, f"{where}.{name}.{key}",
                                           f"Expected a string but saw a {json_type(value)}", expected="string",
                                           actual=value))
                if name in CUDA_NAMES and values.get(CUDA_GRAPH_OPTION) == "1" and not _shares_kv_buffers(config):
                    report.add(Finding(
                        "x.cuda_graph", SESSION, f"{where}.{name}.{CUDA_GRAPH_OPTION}",
                        "Graph capture is not supported with past_present_share_buffer set to false (onnxruntime-"
                        "genai captures only over shared KV buffers: re-export with --kv-cache shared, or set it "
                        "to \"0\")", expected="search.past_present_share_buffer true",
                        actual=values[CUDA_GRAPH_OPTION]))
                if name not in PROVIDER_NAMES:
                    report.add(Finding("x.provider_name", SESSION, f"{where}.{name}",
                                       f"Unknown provider name '{name}'",
                                       expected="one of " + ", ".join(sorted(PROVIDER_NAMES, key=str.lower))))


def check_cuda_images(config: dict, out_dir: Path, report: Report) -> None:
    """A CUDA export that names our library: the library finds its kernels in onnx_hybrid_cuda/ beside it."""
    for path, options in _sections(config):
        library = options.get("custom_ops_library")
        if not isinstance(library, str) or not uses_cuda(options):
            continue
        folder = (Path(out_dir) / library).parent / IMAGE_FOLDER
        if not sorted(folder.glob(image_file_name("*"))):
            report.add(Finding(
                "x.cuda_images", SESSION, f"{path}.custom_ops_library",
                f"the CUDA export has no kernel images in {folder}: CUDA sessions fail at the first GatedDeltaNet "
                "or conv node unless $ONNX_HYBRID_CUDA_IMAGES names a folder that has one for the GPU (re-export "
                "with -e cuda, or `onnx-hybrid prepare-cuda --arch CC -o FOLDER`)", severity=WARNING))
