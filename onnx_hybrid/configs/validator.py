"""Checks a genai_config.json `state_groups` manifest against onnxruntime-genai's rules and its graph.

Stages (spec/genai_config.md §4): the parse rules (4.1) and ``ValidateConfig`` (4.2) that ``og.Config``
applies, ``ValidateSession`` (4.3) that ``og.Model`` applies against the graph's declared I/O, and the
dynamic-batching rules of ``og.Engine`` (4.4). Rule ids C*/S* and their messages are the runtime's; rules
whose id starts with ``x.`` are ours: things 0.18.0 accepts that would still break a run (a decoder-level
capacity that differs from the groups', an update operator built for another capacity, a state input of a
layer that no group binds).

The graph is read without its weights, so validating a large export is fast.
"""

from __future__ import annotations

from pathlib import Path

from .config_rules import ConfigRules
from .engine_rules import check_engine
from .findings import CONFIG, PARSE, SESSION, WARNING, Finding, Report
from .graph_io import GraphIO
from .parse import GROUPS_PATH, decoder_section, detect_form, load_config, parse_state_groups
from .provider_rules import check_cuda_images, check_provider_options
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
    try:
        graph = GraphIO.load(graph_path)
    except Exception as exc:  # a missing, truncated or foreign file: report it, don't crash the CLI
        report.add(Finding("x.graph", SESSION, "model.decoder.filename",
                           f"cannot read the decoder graph {graph_path}: {exc}"))
        return report
    if manifest is not None:
        SessionRules(report, manifest, report.form, graph).run()
    check_engine(config, manifest, graph, report)
    return report


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
