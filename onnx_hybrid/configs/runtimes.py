"""Which runtime runs the export: a note, not a fault (measured with onnxruntime-genai 0.18.0).

* Paged exports (``engine.dynamic_batching``): og.Engine runs them; og.Generator feeds [batch, sequence]
  inputs and fails on the packed token axis.
* Non-paged exports with compact state updates (fixed groups declaring ``state_update``): plain ONNX Runtime
  runs them, feeding ``state_update_capture_count`` and ``state_update_active``; og.Generator does not feed
  those inputs and fails at the first token, and og.Engine refuses fixed state groups without dynamic batching.
* Other exports run in og.Generator and og.Engine alike: no note.
"""

from __future__ import annotations

from .findings import NOTE, RUNTIME, Finding, Report
from .parse import decoder_section
from .state_groups import StateManifest


def note_runtimes(config: dict, manifest: StateManifest | None, report: Report) -> None:
    engine = config.get("engine")
    paged = isinstance(engine, dict) and isinstance(engine.get("dynamic_batching"), dict)
    if paged:
        report.add(Finding(
            "runtime.engine", RUNTIME, "engine.dynamic_batching",
            "paged export: onnxruntime-genai's og.Engine (dynamic batching) runs it; og.Generator does not (it "
            "feeds [batch, sequence] inputs, not the packed token axis)",
            severity=NOTE))
    elif manifest is not None and manifest.capacity:
        capacity = manifest.capacity
        capture = decoder_section(config).get("inputs", {}).get("state_update_capture_count",
                                                                 "state_update_capture_count")
        report.add(Finding(
            "runtime.plain_ort", RUNTIME, "model.decoder.state_groups",
            f"state-update capacity {capacity} without --paged: plain ONNX Runtime runs it, feeding '{capture}' "
            "(e.g. onnx_hybrid_testing.greedy); onnxruntime-genai 0.18's og.Generator does not feed the capture "
            "inputs and fails at the first token, and og.Engine needs a --paged export. Export with capacity 0 "
            "for og.Generator", severity=NOTE))
