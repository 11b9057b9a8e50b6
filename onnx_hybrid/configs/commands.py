"""`onnx-hybrid validate` and `onnx-hybrid convert-config` (registered by ``onnx_hybrid.cli``).

Each entry of :data:`SUBCOMMANDS` is ``name -> (help, add_arguments, run)``; ``run`` returns the exit
status: 0 when the config is valid (or was converted), 1 when validation found errors, 2 when a
conversion is impossible or the config cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .convert import ConversionError, convert_config
from .graph_io import GraphIO
from .parse import decoder_section, load_config
from .state_groups import FORMS
from .validator import CONFIG_FILE, validate

VALIDATION_FAILED = 1
CONVERSION_FAILED = 2


def _add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", help="export folder holding genai_config.json and the decoder graph")
    parser.add_argument("--json", action="store_true", help="print a machine-readable report")
    parser.add_argument("--form", choices=FORMS, default=None,
                        help="read state_groups as this form (default: detect it); 'released' applies "
                             "onnxruntime-genai 0.18's parser, which rejects the bindings form")


def _run_validate(args: argparse.Namespace) -> int:
    report = validate(args.out_dir, form=args.form)
    print(report.to_json() if args.json else report.format())
    return 0 if report.ok else VALIDATION_FAILED


def _add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", help="export folder holding genai_config.json (and the decoder graph)")
    parser.add_argument("--to", choices=FORMS, required=True, help="target form of state_groups")
    parser.add_argument("-o", "--output", help="write here instead of rewriting genai_config.json in place")
    parser.add_argument("--drop-checkpoints", action="store_true",
                        help="drop V2 checkpoint fields (they have no released-form equivalent)")


def _run_convert(args: argparse.Namespace) -> int:
    path = Path(args.out_dir) / CONFIG_FILE
    try:
        config = load_config(path)
    except (OSError, ValueError) as error:  # missing file, not JSON
        return _conversion_failed(f"cannot read {path}: {error}")
    try:
        graph = _graph_if_any(Path(args.out_dir), config)
    except Exception as error:  # a truncated or foreign file, as in validate
        return _conversion_failed(f"cannot read the decoder graph: {error}")
    try:
        converted = convert_config(config, args.to, graph=graph, drop_checkpoints=args.drop_checkpoints)
    except ConversionError as error:
        return _conversion_failed(error)
    target = Path(args.output) if args.output else path
    _write_atomically(target, json.dumps(converted, indent=4) + "\n")
    print(f"wrote {target} ({args.to} form)")
    return 0


def _conversion_failed(error) -> int:
    print(f"onnx-hybrid convert-config: error: {error}", file=sys.stderr)
    return CONVERSION_FAILED


def _write_atomically(target: Path, text: str) -> None:
    """Replace ``target`` in one step, so an interrupted in-place rewrite never leaves half a config."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # mkstemp's 0600 would hide the config from other users: keep the old file's mode
        os.chmod(tmp, target.stat().st_mode & 0o7777 if target.exists() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _graph_if_any(out_dir: Path, config: dict) -> GraphIO | None:
    """The decoder's declared I/O when the folder has it (it tells conv from recurrent fixed groups)."""
    filename = decoder_section(config).get("filename")
    if isinstance(filename, str) and (out_dir / filename).is_file():
        return GraphIO.load(out_dir / filename)
    return None


SUBCOMMANDS = {
    "validate": ("check genai_config.json state_groups against onnxruntime-genai's rules and the graph, and what "
                 "og.Model needs to load it (external data files, the custom op library)",
                 _add_validate_arguments, _run_validate),
    "convert-config": ("convert state_groups between the released and the bindings (#2454) form",
                       _add_convert_arguments, _run_convert),
}
