"""Where each tensor name lives in genai_config.json, for finding paths, and how the runtime labels groups."""

from __future__ import annotations

from .parse import GROUPS_PATH, group_label
from .state_groups import (
    BINDINGS, FIXED, FIXED_CONV, FIXED_RECURRENT, KIND_BINDINGS, UPDATE_OUTPUT_FIELD, UPDATE_OUTPUT_KEY, StateGroup,
)

FIXED_KINDS = (FIXED_CONV, FIXED_RECURRENT, FIXED)


def binding_path(form: str, index: int, kind: str, sem: str, side: str) -> str:
    if form == BINDINGS:
        return f"{GROUPS_PATH}[{index}].bindings.{sem}.{side}"
    in_key, out_key = KIND_BINDINGS[kind][sem]
    return f"model.decoder.inputs.{in_key}" if side == "input" else f"model.decoder.outputs.{out_key}"


def update_path(form: str, index: int, kind: str, field: str) -> str:
    """``field``: "output", "capture_count" or "active"."""
    if form == BINDINGS:
        key = UPDATE_OUTPUT_FIELD.get(kind, "value") if field == "output" else field
        return f"{GROUPS_PATH}[{index}].state_update.{key}"
    if field == "output":
        return f"model.decoder.outputs.{UPDATE_OUTPUT_KEY[kind]}"
    return f"model.decoder.inputs.state_update_{field}"


def label_of(index: int, group: StateGroup, form: str) -> str:
    if form == BINDINGS and group.kind in FIXED_KINDS:
        return group_label(index, FIXED)
    return group_label(index, group.kind)
