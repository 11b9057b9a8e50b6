"""Reading `state_groups` from a genai_config decoder section, in either form, with the parse rules of
docs/genai-config.md#parse-rules.

The released-form messages are onnxruntime-genai 0.18's (the part after its ``model:decoder:...:``
prefix), so a finding can be compared with what ``og.Config`` raises. Bindings-form messages are those of
the #2454 parser where they are known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..ops.contract import MAX_STATE_UPDATE_CAPACITY
from .findings import CONFIG, PARSE, WARNING, Finding, Report
from .state_groups import (
    BINDINGS, FIXED, FIXED_CONV, FIXED_RECURRENT, KIND_BINDINGS, KIND_OF_UPDATE, PAGED_KV, RELEASED,
    RELEASED_KINDS, UPDATE_OUTPUT_FIELD, UPDATE_OUTPUT_KEY, Binding, StateGroup, StateManifest,
    StateNames, StateUpdate,
)

GROUPS_PATH = "model.decoder.state_groups"
MOVE_BINDINGS = "move binding templates to model.decoder.inputs and model.decoder.outputs"
LEGACY_UPDATE_FIELDS = ("kind", "value", "capsule", "active", "capture_count")
V2_GROUP_FIELDS = ("checkpoint_count", "checkpoint_alignment")


class JsonObject(dict):
    """A JSON object that remembers every (key, value) pair, repeated keys included."""

    pairs: list[tuple[str, Any]]


def _object(pairs: list[tuple[str, Any]]) -> JsonObject:
    obj = JsonObject(pairs)
    obj.pairs = pairs
    return obj


def load_config(path: str | Path) -> dict:
    """genai_config.json as nested dicts (last repeated key wins, as in ``json.load``; the parser
    looks at ``JsonObject.pairs`` where a repeated key matters to the runtime)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f, object_pairs_hook=_object)


def decoder_section(config: dict) -> dict:
    """``model.decoder`` of a config (empty when missing or malformed)."""
    model = config.get("model") if isinstance(config, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    return decoder if isinstance(decoder, dict) else {}


def detect_form(decoder: dict) -> str | None:
    """``released``, ``bindings`` (any group uses a bindings-form feature) or None without state_groups."""
    groups = decoder.get("state_groups")
    if groups is None:
        return None
    for group in groups if isinstance(groups, list) else ():
        if not isinstance(group, dict):
            continue
        update = group.get("state_update")
        if "bindings" in group or group.get("kind") == FIXED or (
                isinstance(update, dict) and any(k in update for k in LEGACY_UPDATE_FIELDS)):
            return BINDINGS
    return RELEASED


def group_label(index: int, kind: Any) -> str:
    """The runtime's label of a group in messages."""
    return f"{GROUPS_PATH}[{index}] ({kind if isinstance(kind, str) and kind else 'invalid'})"


def parse_state_groups(decoder: dict, form: str, report: Report) -> StateManifest | None:
    """The manifest of ``decoder`` read as ``form``; None when a parse rule fails (the runtime stops
    there too) or when there is no ``state_groups``."""
    reader = _Reader(report)
    declared = reader.decoder_capacity(decoder, form)
    reader.template_types(decoder)
    if "state_groups" not in decoder:
        return None
    groups = decoder["state_groups"]
    if not isinstance(groups, list):
        reader.parse("model.decoder", 'Unknown value "state_groups"', actual=json_type(groups))
        return None
    if form == RELEASED:
        names = StateNames.from_decoder(decoder)
        parsed = [reader.released_group(i, g, names) for i, g in enumerate(groups)]
    else:
        parsed = [reader.bindings_group(i, g) for i, g in enumerate(groups)]
    if reader.failed:
        return None
    return StateManifest(tuple(parsed), declared_capacity=declared)


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"


class _Reader:
    def __init__(self, report: Report):
        self.report = report
        self.failed = False

    def parse(self, path: str, message: str, *, expected: Any = None, actual: Any = None) -> None:
        self.failed = True
        self.report.add(Finding("parse", PARSE, path, message, expected=expected, actual=actual))

    def config(self, rule: str, path: str, message: str, **kw) -> None:
        self.report.add(Finding(rule, CONFIG, path, message, **kw))

    def warn(self, rule: str, path: str, message: str, **kw) -> None:
        self.report.add(Finding(rule, PARSE, path, message, severity=WARNING, **kw))

    # -- typed scalars -----------------------------------------------------------------------------

    def integer(self, value: Any, path: str) -> int | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.parse(path, f"Expected a number but saw a {json_type(value)}", expected="integer",
                       actual=value)
            return None
        if isinstance(value, float) and not value.is_integer():
            self.parse(path, f"value {value} is not an integer", expected="integer", actual=value)
            return None
        return int(value)

    def string(self, value: Any, path: str) -> str | None:
        if not isinstance(value, str):
            self.parse(path, f"Expected a string but saw a {json_type(value)}", expected="string",
                       actual=value)
            return None
        return value

    def boolean(self, value: Any, path: str) -> bool | None:
        if not isinstance(value, bool):
            self.parse(path, f"Expected a bool but saw a {json_type(value)}", expected="bool", actual=value)
            return None
        return value

    # -- decoder-level fields --------------------------------------------------------------------------

    def decoder_capacity(self, decoder: dict, form: str) -> int | None:
        if "state_update_capacity" not in decoder:
            return None
        path = "model.decoder.state_update_capacity"
        if form == BINDINGS:
            self.warn("parse.v3_decoder_capacity", path,
                      "decoder-level state_update_capacity belongs to the released form; the bindings form "
                      "keeps the capacity in each group")
        value = self.integer(decoder["state_update_capacity"], path)
        if value is not None and not 0 <= value <= 8:
            self.parse(path, "state_update_capacity must be between 0 and 8", expected="[0, 8]", actual=value)
            return None
        return value

    def template_types(self, decoder: dict) -> None:
        for key, section in StateNames.keys().items():
            value = (decoder.get(section) or {}).get(key)
            if key in (decoder.get(section) or {}):
                self.string(value, f"model.decoder.{section}.{key}")

    def layer_ids(self, group: JsonObject, path: str) -> tuple[int, ...]:
        # The runtime's streaming parser appends the ids of a repeated "layer_ids" key.
        ids: list[int] = []
        for key, value in getattr(group, "pairs", group.items()):
            if key != "layer_ids":
                continue
            if not isinstance(value, list):
                self.parse(path, 'Unknown value "layer_ids"', expected="array", actual=json_type(value))
                continue
            for j, item in enumerate(value):
                n = self.integer(item, f"{path}.layer_ids[{j}]")
                if n is not None:
                    ids.append(n)
        return tuple(ids)

    def repeated(self, obj: dict, key: str) -> bool:
        return [k for k, _ in getattr(obj, "pairs", ())].count(key) > 1

    def is_group(self, group: Any, path: str) -> bool:
        if not isinstance(group, dict):
            self.parse(path, 'Unknown value ""', expected="object", actual=json_type(group))
        return isinstance(group, dict)

    def group_kind(self, value: Any, path: str, allowed: tuple[str, ...]) -> str:
        kind = self.string(value, path) or ""
        if kind and kind not in allowed:
            self.parse(path, f"Unsupported decoder state group kind '{kind}'", expected=list(allowed), actual=kind)
        return kind

    # -- released form ------------------------------------------------------------------------------

    def released_group(self, index: int, group: Any, names: StateNames) -> StateGroup | None:
        path = f"{GROUPS_PATH}[{index}]"
        if not self.is_group(group, path):
            return None
        kind = ""
        for key, value in group.items():
            if key == "bindings":
                self.parse(f"{path}.bindings",
                           f"Legacy decoder state group bindings are no longer supported; {MOVE_BINDINGS}")
            elif key == "kind" and value == FIXED:
                self.parse(f"{path}.kind", "Decoder state group kind 'fixed' is no longer supported; use "
                           f"'fixed_conv' or 'fixed_recurrent' and {MOVE_BINDINGS}",
                           expected=list(RELEASED_KINDS), actual=value)
            elif key == "kind":
                kind = self.group_kind(value, f"{path}.kind", RELEASED_KINDS)
            elif key not in ("layer_ids", "state_update"):
                self.parse(f"{path}.{key}", f'Unknown value "{key}"', expected="kind, layer_ids, state_update")
        ids = self.layer_ids(group, path)
        update = None
        if "state_update" in group:
            update = self.released_update(group, kind, names, f"{path}.state_update")
        if kind in KIND_BINDINGS:
            bindings = {sem: Binding(getattr(names, i), getattr(names, o))
                        for sem, (i, o) in KIND_BINDINGS[kind].items()}
        else:
            bindings = {}
        return StateGroup(kind, ids, bindings, update)

    def released_update(self, group: dict, kind: str, names: StateNames, path: str) -> StateUpdate | None:
        if self.repeated(group, "state_update"):
            self.parse(path, "Duplicate decoder state_update declaration")
        body = group["state_update"]
        if not isinstance(body, dict):
            self.parse(path.rsplit(".", 1)[0], 'Unknown value "state_update"', expected="object",
                       actual=json_type(body))
            return None
        capacity, enabled, heads = 0, True, None
        for key, value in body.items():
            field_path = f"{path}.{key}"
            if key in LEGACY_UPDATE_FIELDS:
                self.parse(field_path, f"Legacy decoder state_update field '{key}' is no longer supported; "
                           "move state-update binding templates to model.decoder.inputs and model.decoder.outputs")
            elif key == "capacity":
                capacity = self.capacity(value, field_path) or 0
            elif key == "enabled":
                enabled = self.boolean(value, field_path)
            elif key == "key_head_count":
                heads = self.integer(value, field_path)
                if heads is not None and heads <= 0:
                    self.parse(field_path, "Decoder state update key_head_count must be positive",
                               expected="> 0", actual=heads)
            else:
                self.parse(field_path, f'Unknown value "{key}"', expected="capacity, enabled, key_head_count")
        output_key = UPDATE_OUTPUT_KEY.get(kind)
        return StateUpdate(
            capacity=capacity,
            output=getattr(names, output_key) if output_key else "",
            capture_count=names.state_update_capture_count,
            active=names.state_update_active,
            enabled=bool(enabled),
            key_head_count=heads,
        )

    def capacity(self, value: Any, path: str) -> int | None:
        n = self.integer(value, path)
        if n is not None and not 1 <= n <= MAX_STATE_UPDATE_CAPACITY:
            # onnxruntime-genai 0.18's own message, which states the bound literally.
            self.parse(path, "Decoder state update capacity must be in [1, 8]",
                       expected=f"[1, {MAX_STATE_UPDATE_CAPACITY}]", actual=n)
            return None
        return n

    # -- bindings form (#2454) ----------------------------------------------------------------------

    def bindings_group(self, index: int, group: Any) -> StateGroup | None:
        path = f"{GROUPS_PATH}[{index}]"
        if not self.is_group(group, path):
            return None
        kind = ""
        for key, value in group.items():
            if key == "kind":
                kind = self.group_kind(value, f"{path}.kind", (PAGED_KV, FIXED))
            elif key in V2_GROUP_FIELDS:
                self.warn("parse.v2_checkpoint", f"{path}.{key}",
                          "V2 checkpoint field: ignored by the #2454 runtime, no released-form equivalent")
            elif key not in ("layer_ids", "bindings", "state_update"):
                self.parse(f"{path}.{key}", f'Unknown value "{key}"',
                           expected="kind, layer_ids, bindings, state_update")
        ids = self.layer_ids(group, path)
        bindings = self.bindings(group.get("bindings"), f"{path}.bindings")
        update = None
        if "state_update" in group:
            update, kind = self.bindings_update(group, index, kind, f"{path}.state_update")
        return StateGroup(kind, ids, bindings, update)

    def bindings(self, body: Any, path: str) -> dict[str, Binding]:
        if body is None:
            return {}
        if not isinstance(body, dict):
            self.parse(path, 'Unknown value "bindings"', expected="object", actual=json_type(body))
            return {}
        out = {}
        for sem, value in getattr(body, "pairs", body.items()):
            sem_path = f"{path}.{sem}"
            if sem not in ("key", "value", "state"):
                self.parse(sem_path, f'Unknown value "{sem}"', expected="key, value, state")
                continue
            if sem in out:
                self.parse(sem_path, f"Duplicate decoder state binding semantic '{sem}'")
                continue
            if not isinstance(value, dict):
                self.parse(sem_path, f'Unknown value "{sem}"', expected="object", actual=json_type(value))
                continue
            templates = {"input": "", "output": ""}
            for key, template in value.items():
                if key in templates:
                    templates[key] = self.string(template, f"{sem_path}.{key}") or ""
                elif key == "checkpoints":
                    self.warn("parse.v2_checkpoint", f"{sem_path}.{key}",
                              "V2 checkpoint field: ignored by the #2454 runtime, no released-form equivalent")
                else:
                    self.parse(f"{sem_path}.{key}", f'Unknown value "{key}"', expected="input, output")
            out[sem] = Binding(templates["input"], templates["output"])
        return out

    def bindings_update(self, group: dict, index: int, kind: str, path: str) -> tuple[StateUpdate | None, str]:
        """The update and the group's released kind (from the update kind; ``fixed`` if unknown)."""
        if self.repeated(group, "state_update"):
            self.parse(path, "Duplicate decoder state_update declaration")
        body = group["state_update"]
        if not isinstance(body, dict):
            self.parse(path.rsplit(".", 1)[0], 'Unknown value "state_update"', expected="object",
                       actual=json_type(body))
            return None, kind
        fields: dict[str, Any] = {}
        for key, value in body.items():
            field_path = f"{path}.{key}"
            if key == "capacity":
                fields[key] = self.capacity(value, field_path) or 0
            elif key == "enabled":
                fields[key] = self.boolean(value, field_path)
            elif key == "key_head_count":
                fields[key] = self.integer(value, field_path)
            elif key in ("kind", "capture_count", "active", "value", "capsule"):
                fields[key] = self.string(value, field_path)
            else:
                self.parse(field_path, f'Unknown value "{key}"')
        label = group_label(index, kind)
        update_kind = fields.get("kind")
        if not update_kind:
            self.config("C6", path, f"{label} state_update is missing kind", expected=list(KIND_OF_UPDATE))
        elif update_kind not in KIND_OF_UPDATE:
            self.parse(f"{path}.kind", f"Unsupported decoder state update kind '{update_kind}'",
                       expected=list(KIND_OF_UPDATE), actual=update_kind)
        # A fixed group's flavour comes from its update kind; paged_kv keeps its kind (C5 rejects it).
        released_kind = KIND_OF_UPDATE.get(update_kind or "", FIXED) if kind == FIXED else kind
        heads = fields.get("key_head_count")
        if released_kind == FIXED_CONV and ("capsule" in fields or heads or "value" not in fields):
            self.config("C10", path, f"{label} causal_conv state_update requires only value",
                        expected="value, no capsule, no key_head_count",
                        actual=sorted(k for k in fields if k in ("value", "capsule", "key_head_count")))
        if released_kind == FIXED_RECURRENT and ("value" in fields or "capsule" not in fields
                                                 or not heads or heads <= 0):
            self.config("C10", path, f"{label} gated_delta_net state_update requires capsule and key_head_count",
                        expected="capsule and key_head_count > 0",
                        actual={k: fields[k] for k in ("value", "capsule", "key_head_count") if k in fields})
        output_field = UPDATE_OUTPUT_FIELD.get(released_kind)
        update = StateUpdate(
            capacity=fields.get("capacity", 0),
            output=(fields.get(output_field) or "") if output_field else "",
            capture_count=fields.get("capture_count") or "",
            active=fields.get("active") or "",
            enabled=bool(fields.get("enabled", True)),
            key_head_count=heads if released_kind == FIXED_RECURRENT else None,
        )
        return update, released_kind
