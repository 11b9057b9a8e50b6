"""The validator's load rules and runtime notes against onnxruntime-genai 0.18.0 itself.

One real export (paged, capacity 3, MTP head, default flags): it validates with no warning and og.Engine
generates from it. Each mutation breaks one thing og.Model (or, for the head, og.Engine) needs to create its
sessions; the validator must report it, naming the file, and og must fail on the same mutated folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
og = pytest.importorskip("onnxruntime_genai")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

from onnx_hybrid.cli import export_main  # noqa: E402
from onnx_hybrid.configs import op_library, validate  # noqa: E402
from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint  # noqa: E402
from onnx_hybrid_testing.genai_driver import run_engine  # noqa: E402
from onnx_hybrid_testing.greedy import GreedyDriver, make_session  # noqa: E402

LIBRARY = "libonnx_hybrid_ortops.so"
PROMPT = [5, 17, 33, 2, 99]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("checkpoint") / "hf", "qwen3_5_text", seed=5, mtp=True)


@pytest.fixture(scope="module")
def package(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("package") / "paged"
    assert export_main([str(checkpoint), "-o", str(out), "--paged", "--state-update-capacity", "3", "-q"]) == 0
    return out


def og_failure(directory: Path, step: str = "model") -> str | None:
    """og's error creating og.Model (and with ``step`` "engine", og.Engine over it), or None."""
    try:
        model = og.Model(str(directory))
        if step == "engine":
            og.Engine(model)
    except Exception as error:  # og raises RuntimeError with the runtime's message
        return str(error)
    return None


def test_the_export_validates_without_warnings_and_og_engine_generates(package):
    report = validate(package)
    assert report.ok and not report.warnings, report.format()
    assert [note.rule for note in report.notes] == ["runtime.engine"]
    assert "og.Engine (dynamic batching) runs it; og.Generator does not" in report.notes[0].message
    assert len(run_engine(package, [PROMPT], 4).tokens[0]) == 4
    model = og.Model(str(package))
    generator = og.Generator(model, og.GeneratorParams(model))
    with pytest.raises(Exception, match="Invalid rank for input: input_ids"):  # the note's "og.Generator does not"
        generator.append_tokens(np.array([PROMPT], dtype=np.int32))
        generator.generate_next_token()


# --- mutations -------------------------------------------------------------------------------------------


def edit_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        path = directory / "genai_config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config, indent=4))
    return apply


def truncate(name: str, by: int) -> Callable[[Path], None]:
    return lambda directory: os.truncate(directory / name, (directory / name).stat().st_size - by)


def move_conv_to_another_domain(directory: Path) -> None:
    model = onnx.load(str(directory / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == contract.VARLEN_CAUSAL_CONV.name:
            node.domain = "onnx_hybrid.other"
    model.opset_import.append(onnx.helper.make_opsetid("onnx_hybrid.other", 1))
    onnx.save(model, str(directory / "model.onnx"))  # the tensors keep their external data records


def link_library_from_outside(directory: Path) -> None:
    elsewhere = directory.parent / "elsewhere"
    elsewhere.mkdir()
    shutil.move(directory / LIBRARY, elsewhere / LIBRARY)
    (directory / LIBRARY).symlink_to(elsewhere / LIBRARY)


def not_an_op_library(directory: Path) -> None:
    """A real shared library without RegisterCustomOps (ONNX Runtime ships one)."""
    shutil.copy(Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_shared.so", directory / LIBRARY)


@dataclass(frozen=True)
class LoadMutation:
    name: str
    edit: Callable[[Path], None]
    path: str  # the genai_config.json entry our finding names
    ours: str  # in our finding's message
    theirs: str  # in og's error
    step: str = "model"  # what fails in og: og.Model, or og.Engine (og.Model loads)
    file: str = ""  # the file our finding names (default: none checked)


MUTATIONS = [
    LoadMutation("decoder data missing", lambda d: (d / "model.onnx.data").unlink(), "model.decoder.filename",
                 "External data path does not exist", "External data path does not exist", file="model.onnx.data"),
    LoadMutation("decoder data short", truncate("model.onnx.data", 100), "model.decoder.filename", "is too short",
                 "are out of bounds or can not be read in full", file="model.onnx.data"),
    LoadMutation("head data missing", lambda d: (d / "mtp.onnx.data").unlink(), "model.mtp.filename",
                 "External data path does not exist", "External data path does not exist", step="engine",
                 file="mtp.onnx.data"),
    LoadMutation("library missing", lambda d: (d / LIBRARY).unlink(),
                 "model.decoder.session_options.custom_ops_library", "Failed to load library",
                 "Failed to load library", file=LIBRARY),
    LoadMutation("library not a shared object", lambda d: (d / LIBRARY).write_bytes(b"not a library"),
                 "model.decoder.session_options.custom_ops_library", "Failed to load library",
                 "Failed to load library", file=LIBRARY),
    LoadMutation("library without RegisterCustomOps", not_an_op_library,
                 "model.decoder.session_options.custom_ops_library", "Failed to get symbol RegisterCustomOps",
                 "Failed to get symbol RegisterCustomOps", file=LIBRARY),
    LoadMutation("library unset", edit_config(lambda c: c["model"]["decoder"]["session_options"].pop(
        "custom_ops_library")), "model.decoder.session_options.custom_ops_library",
        "onnx_hybrid:VarlenCausalConvWithState(-1) is not a registered function/op",
        "onnx_hybrid:VarlenCausalConvWithState(-1) is not a registered function/op", file="model.onnx"),
    LoadMutation("an op outside the library's domains", move_conv_to_another_domain,
                 "model.decoder.session_options.custom_ops_library",
                 "onnx_hybrid.other:VarlenCausalConvWithState(-1) is not a registered function/op",
                 "onnx_hybrid.other:VarlenCausalConvWithState(-1) is not a registered function/op", file="model.onnx"),
    LoadMutation("library path with ..", edit_config(lambda c: c["model"]["decoder"]["session_options"].update(
        custom_ops_library=f"../{LIBRARY}")), "model.decoder.session_options.custom_ops_library",
        "must not contain path traversal (..)", "must not contain path traversal (..)"),
    LoadMutation("library linked from outside the folder", link_library_from_outside,
                 "model.decoder.session_options.custom_ops_library", "not within an allowed directory",
                 "not within an allowed directory", file=LIBRARY),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_load_mutations_fail_in_og_and_in_the_validator(mutation, package, tmp_path):
    directory = shutil.copytree(package, tmp_path / "package")
    mutation.edit(directory)

    report = validate(directory)
    found = [f for f in report.errors if f.path == mutation.path and mutation.ours in f.message]
    assert found, report.format()
    assert mutation.file in found[0].message, found[0].format()

    if mutation.step == "engine":
        assert og_failure(directory) is None  # og.Model alone does not open the head
    error = og_failure(directory, mutation.step)
    assert error is not None and mutation.theirs in error, error


def broken_library(directory: Path, body: str) -> Path:
    """``directory``'s copy of the library replaced by one whose RegisterCustomOps runs ``body`` (C)."""
    source = directory.parent / "broken.c"
    source.write_text(f"#include <stdlib.h>\n#include <unistd.h>\n"
                      f"void *RegisterCustomOps(void *options, const void *api) {{ {body} return 0; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(directory / LIBRARY), str(source)], check=True)
    return directory


def test_a_crashing_library_is_a_finding_not_a_crash(package, tmp_path):
    """A library whose RegisterCustomOps aborts kills og.Model's process; the validator reports it."""
    directory = broken_library(shutil.copytree(package, tmp_path / "package"), "abort();")

    [finding] = [f for f in validate(directory).errors if f.rule == "load.op_library"]  # one probe for both graphs
    assert f"exited with signal {int(signal.SIGABRT)}" in finding.message and LIBRARY in finding.message, finding.format()
    og_run = subprocess.run([sys.executable, "-c", "import sys, onnxruntime_genai as og; og.Model(sys.argv[1])",
                             str(directory)], capture_output=True)
    assert og_run.returncode == -signal.SIGABRT


def test_a_hanging_library_is_a_finding_after_the_timeout(package, tmp_path, monkeypatch):
    """A library whose RegisterCustomOps never returns hangs og.Model; the validator gives up on it."""
    directory = broken_library(shutil.copytree(package, tmp_path / "package"), "for (;;) pause();")
    monkeypatch.setattr(op_library, "PROBE_TIMEOUT_S", 2)

    [finding] = [f for f in validate(directory).errors if f.rule == "load.op_library"]
    assert "took over 2 s" in finding.message and LIBRARY in finding.message, finding.format()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", "import sys, onnxruntime_genai as og; og.Model(sys.argv[1])",
                        str(directory)], capture_output=True, timeout=4)  # it never ends


# --- which runtime runs a non-paged export ------------------------------------------------------------------


def test_non_paged_compact_updates_are_noted_for_plain_ort_as_og_generator_fails(checkpoint, tmp_path):
    plain = export(checkpoint, tmp_path / "c0", mtp=False, progress=False)
    compact = export(checkpoint, tmp_path / "c3", state_update_capacity=3, mtp=False, progress=False)

    report = validate(plain)
    assert report.ok and not report.warnings and not report.notes, report.format()
    head = report.format().splitlines()[0]  # in the user's terms
    assert "state_groups not written (onnxruntime-genai 0.18 binds the states by the decoder's" in head
    model = og.Model(str(plain))
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.append_tokens(np.array([PROMPT], dtype=np.int32))
    generator.generate_next_token()

    report = validate(compact)
    assert report.ok and not report.warnings, report.format()
    [note] = report.notes
    assert note.rule == "runtime.plain_ort" and "plain ONNX Runtime runs it" in note.message
    assert "og.Generator does not feed the capture inputs" in note.message
    assert "og.Engine needs a --paged" in note.message
    model = og.Model(str(compact))
    generator = og.Generator(model, og.GeneratorParams(model))
    with pytest.raises(Exception, match="must contain a constructed tensor"):
        generator.append_tokens(np.array([PROMPT], dtype=np.int32))
        generator.generate_next_token()
    with pytest.raises(Exception, match="Fixed decoder state groups require engine.dynamic_batching"):
        og.Engine(model)
    driver = GreedyDriver(make_session(compact, contract.DOMAIN))
    assert len(driver.generate([PROMPT], 2, capture_count=3).tokens[0]) == 2

