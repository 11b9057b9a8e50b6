"""Checks a genai_config.json `state_groups` manifest against onnxruntime-genai's rules and its graph.

Stages (docs/genai-config.md#validation): the parse rules and ``ValidateConfig`` that ``og.Config`` applies,
``ValidateSession`` that ``og.Model`` applies against the graph's declared I/O, and the dynamic-batching
rules of ``og.Engine``. Rule ids C*/S* and their messages are the runtime's; rules
whose id starts with ``x.`` are ours: things 0.18.0 accepts that would still break a run (a decoder-level
capacity that differs from the groups', an update operator built for another capacity, a state input of a
layer that no group binds).

Load rules (``load.*``) check what og.Model needs to create its sessions, for the decoder and the MTP
head: the external data files and the custom op library. Notes (``runtime.*``) say which runtime runs the
export.

The graphs are read without their weights, so validating a large export is fast.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from .config_rules import ConfigRules
from .engine_rules import check_engine
from .external_data import check_external_data
from .findings import CONFIG, PARSE, SESSION, WARNING, Finding, Report
from .graph_io import GraphIO
from .op_library import SessionGraph, check_op_libraries
from .parse import GROUPS_PATH, decoder_section, detect_form, load_config, parse_state_groups
from .provider_rules import check_cuda_images, check_provider_options
from .runtimes import note_runtimes
from .session_rules import SessionRules
from .state_groups import BINDINGS, FORMS, RELEASED, StateManifest

CONFIG_FILE = "genai_config.json"


def validate(out_dir: str | Path, *, form: str | None = None) -> Report:
    """Validate ``out_dir/genai_config.json`` and, when the config names one, its decoder graph."""
    config_path = Path(out_dir) / CONFIG_FILE
    report = Report(str(config_path))
    try:
        config = load_config(config_path)
    except (OSError, ValueError) as exc:
        report.add(Finding("parse.json", PARSE, "$", f"cannot read {config_path}: {exc}"))
        return report
    manifest = _check_config(config, form, report)
    check_cuda_images(config, Path(out_dir), report)
    decoder = decoder_section(config)
    filename = decoder.get("filename")
    if not isinstance(filename, str) or not filename:
        report.add(Finding("x.filename", SESSION, "model.decoder.filename", "model.decoder.filename is missing"))
        return report
    graph_path = Path(out_dir) / filename
    report.graph_path = str(graph_path)
    decoder_graph = _read_graph(graph_path, "model.decoder", decoder, report)
    if decoder_graph is None:
        return report
    graph = GraphIO.from_model(decoder_graph.model)
    if manifest is not None:
        SessionRules(report, manifest, report.form, graph).run()
    check_engine(config, manifest, graph, report)
    _check_load(Path(out_dir), config, decoder_graph, report)
    note_runtimes(config, manifest, report)
    return report


def _read_graph(path: Path, section: str, session: dict, report: Report) -> SessionGraph | None:
    """The graph's structure, or None with a finding when the file is missing, truncated or foreign."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # report it, don't crash the CLI
        report.add(Finding("x.graph", SESSION, f"{section}.filename", f"cannot read the {section} graph {path}: {exc}"))
        return None
    options = session.get("session_options")
    return SessionGraph(section, path, model, options if isinstance(options, dict) else {})


def _check_load(out_dir: Path, config: dict, decoder: SessionGraph, report: Report) -> None:
    """What og.Model needs to create the sessions of the decoder and, when the config has one, the MTP head
    (which takes the decoder's session options unless it has its own)."""
    graphs = [decoder]
    mtp = config.get("model", {}).get("mtp")
    if isinstance(mtp, dict) and isinstance(mtp.get("filename"), str) and mtp["filename"]:
        session = mtp if isinstance(mtp.get("session_options"), dict) else {"session_options": decoder.session_options}
        head = _read_graph(out_dir / mtp["filename"], "model.mtp", session, report)
        graphs += [head] if head else []
    for graph in graphs:
        check_external_data(graph.path, graph.model, f"{graph.section}.filename", report)
    check_op_libraries(out_dir, graphs, report)


def validate_config(config: dict, *, form: str | None = None, path: str = CONFIG_FILE) -> Report:
    """The checks that need no graph: what ``og.Config`` applies, plus our config-level rules."""
    report = Report(path)
    _check_config(config, form, report)
    return report


def _check_config(config: dict, form: str | None, report: Report) -> StateManifest | None:
    if form is not None and form not in FORMS:
        raise ValueError(f"form must be one of {FORMS} or None, got {form!r}")
    check_provider_options(config, report)
    decoder = decoder_section(config)
    report.form = form or detect_form(decoder)
    if report.form == BINDINGS and form is None:
        report.add(Finding("form", PARSE, GROUPS_PATH,
                           "bindings (#2454) form: onnxruntime-genai 0.18 parses only the released form "
                           "(onnx-hybrid convert-config --to released)", severity=WARNING))
    manifest = parse_state_groups(decoder, report.form or RELEASED, report)
    if manifest is not None:
        num_layers = decoder.get("num_hidden_layers", 0)
        ConfigRules(report, manifest, report.form, num_layers if isinstance(num_layers, int) else 0).run()
    if report.form != BINDINGS and not report.errors_at(PARSE, CONFIG):
        _check_declared_capacity(decoder, manifest, report)
    return manifest


def _check_declared_capacity(decoder: dict, manifest: StateManifest | None, report: Report) -> None:
    """0.18.0 does not compare decoder.state_update_capacity with the groups, but the Engine sizes
    drafts by the former and the graph captures by the latter, so they must agree."""
    declared = decoder.get("state_update_capacity", 0)
    groups = manifest.capacity if manifest else 0
    if declared != groups:
        report.add(Finding(
            "x.decoder_capacity", CONFIG, "model.decoder.state_update_capacity",
            "model.decoder.state_update_capacity must equal the fixed groups' state_update capacity "
            "(0 when no group declares state_update)", expected=groups, actual=declared))
