"""Load rule: the custom op library that ``session_options.custom_ops_library`` names exists in the export
folder, loads, and registers every custom domain and op the graph uses.

og.Model resolves a relative name against the export folder, refuses ``..`` in it, refuses a file (after
following links) outside that folder and its working directory (``custom_ops_library path is not within an
allowed directory``), fails on a file it cannot load (``Failed to load library``) and on a
node no registered library provides (``<domain>:<op>(-1) is not a registered function/op``). Registering and
loading run in a child process (``library_probe.py``) with a timeout, so that a broken library is reported,
never fatal to the validator.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from .findings import LOAD, WARNING, Finding, Report

# Domains whose ops ONNX Runtime itself defines; any other domain must come from the custom op library.
ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.training", "com.microsoft",
                         "com.microsoft.nchwc", "com.microsoft.experimental", "com.ms.internal.nhwc",
                         "org.pytorch.aten"})
PROBE_TIMEOUT_S = 120  # registering a library and loading a graph's structure take seconds even for large models
_PROBE = Path(__file__).with_name("library_probe.py")


@dataclass(frozen=True)
class SessionGraph:
    """A graph og.Model opens a session for, and where genai_config.json describes that session."""

    section: str  # "model.decoder" or "model.mtp"
    path: Path
    model: onnx.ModelProto  # structure only
    session_options: dict


def custom_ops(model: onnx.ModelProto) -> list[str]:
    """``domain:op`` of every node outside ONNX Runtime's own domains, in graph order, once each."""
    return list(dict.fromkeys(f"{n.domain}:{n.op_type}" for n in model.graph.node if n.domain not in ORT_DOMAINS))


def weightless(model: onnx.ModelProto) -> bytes:
    """``model`` serialized with its initializers declared as graph inputs instead: ONNX Runtime loads its
    structure without any weights."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    declared = {value.name for value in graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in graph.initializer if t.name not in declared)
    del graph.initializer[:]
    return copy.SerializeToString()


def check_op_libraries(out_dir: Path, graphs: list[SessionGraph], report: Report) -> None:
    """Resolve each graph's library as og.Model does, then probe each library once with every graph naming it."""
    probes: dict[Path, list[SessionGraph]] = {}
    for graph in graphs:
        library = _library(out_dir, graph, report)
        if library is not None:
            probes.setdefault(library, []).append(graph)
    if probes and importlib.util.find_spec("onnxruntime") is None:
        report.add(Finding("load.op_library", LOAD, f"{graphs[0].section}.session_options.custom_ops_library",
                           "not checked: the onnxruntime package is not installed", severity=WARNING))
        return
    for library, users in probes.items():
        _probe(library, users, report)


def _library(out_dir: Path, graph: SessionGraph, report: Report) -> Path | None:
    path = f"{graph.section}.session_options.custom_ops_library"
    name = graph.session_options.get("custom_ops_library")
    if name is not None and not isinstance(name, str):
        report.add(Finding("load.op_library", LOAD, path, f"{path} must be a string", expected="a file name",
                           actual=name))
        return None
    if not name:
        ops = custom_ops(graph.model)
        if ops:
            report.add(Finding("load.op_library", LOAD, path,
                               f"{ops[0]}(-1) is not a registered function/op: {graph.path.name} uses custom ops "
                               f"({', '.join(ops)}) but {path} is unset", expected="the op library's file name",
                               actual=None))
        return None
    if ".." in Path(name).parts:
        report.add(Finding("load.op_library", LOAD, path,
                           f"custom_ops_library must not contain path traversal (..): {name}",
                           expected="a file name in the export folder", actual=name))
        return None
    library = out_dir / name  # an absolute name stays absolute
    if not library.is_file():
        report.add(Finding("load.op_library", LOAD, path, f"Failed to load library {name}: {library} does not exist",
                           expected="a file in the export folder", actual="absent"))
        return None
    real = library.resolve()  # og.Model follows symbolic links before it checks the folder
    if not real.is_relative_to(out_dir.resolve()):
        report.add(Finding("load.op_library", LOAD, path,
                           f"custom_ops_library path is not within an allowed directory: {real} (og.Model loads a "
                           "library only from the export folder, or from the working directory it runs in)",
                           expected=f"a file in {out_dir.resolve()}", actual=str(real)))
        return None
    return library


def _probe(library: Path, graphs: list[SessionGraph], report: Report) -> None:
    first = f"{graphs[0].section}.session_options.custom_ops_library"

    def fail(message: str, path: str = first, **kw) -> None:
        report.add(Finding("load.op_library", LOAD, path, message, **kw))

    with tempfile.TemporaryDirectory(prefix="onnx-hybrid-probe-") as scratch:
        models = []
        for index, graph in enumerate(graphs):
            models.append(Path(scratch) / f"{index}.onnx")
            models[-1].write_bytes(weightless(graph.model))
        command = [sys.executable, str(_PROBE), str(library), *map(str, models)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            fail(f"Failed to load library {library}: registering it and loading the graphs took over "
                 f"{PROBE_TIMEOUT_S} s")
            return
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (ValueError, IndexError):
        result = None
    if result is None:  # the child died (a crash in the library) or printed no report
        status = f"signal {-done.returncode}" if done.returncode < 0 else f"status {done.returncode}"
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        fail(f"Failed to load library {library}: the process registering it exited with {status} ({tail[0]})")
        return
    if result["library"]:
        fail(f"Failed to load library {library}: {result['library']}", expected="an ONNX Runtime custom op library",
             actual=library.name)
        return
    for graph, error in zip(graphs, result["models"]):
        if error:
            fail(f"{graph.path.name} does not load with {library.name}: {error}",
                 path=f"{graph.section}.session_options.custom_ops_library",
                 expected=f"a library registering {', '.join(custom_ops(graph.model)) or 'its custom ops'}",
                 actual=library.name)
