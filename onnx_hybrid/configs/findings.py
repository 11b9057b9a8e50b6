"""Findings of the genai_config validator, and the report that collects them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

ERROR = "error"
WARNING = "warning"
NOTE = "note"  # no fault: what the user should know, e.g. which runtime runs the export

# Stages, in the order the runtime meets them (docs/genai-config.md#validation).
PARSE = "parse"  # JSON reading (og.Config raises while parsing)
CONFIG = "config"  # ModelStateManifest::ValidateConfig (og.Config)
SESSION = "session"  # ModelStateManifest::ValidateSession (og.Model)
ENGINE = "engine"  # 4.4: dynamic batching (og.Engine)
LOAD = "load"  # og.Model creating its ONNX Runtime sessions: external data files, the custom op library
RUNTIME = "runtime"  # which runtime runs the export (notes)

# How the report's head names each state_groups form (None: the export writes no state_groups).
FORM_TEXT = {
    None: "not written (onnxruntime-genai 0.18 binds the states by the decoder's input and output names)",
    "released": "released form (what onnxruntime-genai 0.18 parses)",
    "bindings": "bindings form (PR #2454; onnxruntime-genai 0.18 does not parse it)",
}


@dataclass(frozen=True)
class Finding:
    """One broken (or doubtful) rule.

    ``rule`` is onnxruntime-genai's rule id (C1..C17, S1..S9; docs/genai-config.md#validation) or ours (``parse.*``,
    ``engine.*``, ``load.*``, ``runtime.*`` notes, ``x.*``);
    ``message`` is onnxruntime-genai's message where it has one, so the two can be compared verbatim.
    """

    rule: str
    stage: str
    path: str  # JSON path in genai_config.json
    message: str
    tensor: str | None = None
    expected: Any = None
    actual: Any = None
    severity: str = ERROR

    def format(self) -> str:
        text = f"{self.severity.upper()} [{self.rule}] {self.path}: {self.message}"
        details = []
        if self.tensor is not None:
            details.append(f"tensor {self.tensor!r}")
        if self.expected is not None:
            details.append(f"expected {self.expected}")
        if self.actual is not None:
            details.append(f"actual {self.actual}")
        return text + (f" ({'; '.join(details)})" if details else "")


@dataclass
class Report:
    """Everything the validator found in one export folder."""

    config_path: str
    form: str | None = None  # "released" | "bindings" | None when there is no state_groups
    graph_path: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == NOTE]

    @property
    def ok(self) -> bool:
        return not self.errors

    def errors_at(self, *stages: str) -> list[Finding]:
        return [f for f in self.errors if f.stage in stages]

    def to_dict(self) -> dict:
        return {
            "config": self.config_path,
            "graph": self.graph_path,
            "form": self.form,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "notes": len(self.notes),
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def format(self) -> str:
        head = f"{self.config_path}: state_groups {FORM_TEXT.get(self.form, self.form)}"
        if self.graph_path:
            head += f", graph {self.graph_path}"
        lines = [head] + [f.format() for f in self.findings]
        lines.append("OK" if self.ok else f"FAILED: {len(self.errors)} error(s), {len(self.warnings)} warning(s)")
        return "\n".join(lines)
