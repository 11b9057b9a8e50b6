"""`model.decoder.state_groups` of genai_config.json: a typed model of both forms, and the writer.

Two JSON forms describe the same thing (docs/genai-config.md#released-form, #bindings-form):

* **released** (onnxruntime-genai 0.18, the only form it parses): groups of kind ``paged_kv``,
  ``fixed_conv`` or ``fixed_recurrent``; tensor names are decoder-wide templates in
  ``model.decoder.inputs`` / ``outputs``; ``state_update {capacity, enabled, key_head_count}`` per group
  plus ``model.decoder.state_update_capacity``.
* **bindings** (PR #2454): groups of kind ``paged_kv`` or ``fixed`` carrying their own ``bindings``
  ``{semantic: {input, output}}`` and a ``state_update`` that names its kind, its capture inputs and
  its output template.

:class:`StateManifest` is the form-neutral meaning (what the runtime's ``ModelStateManifest`` holds once
names are resolved). :func:`manifest_for` builds it from a small description of a decoder and
:func:`write_state_groups` writes it into a decoder section in either form; ``parse.py`` reads it back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from ..ops.contract import MAX_STATE_UPDATE_CAPACITY

PAGED_KV = "paged_kv"
FIXED_CONV = "fixed_conv"
FIXED_RECURRENT = "fixed_recurrent"
FIXED = "fixed"  # bindings form only
RELEASED_KINDS = (PAGED_KV, FIXED_CONV, FIXED_RECURRENT)

RELEASED = "released"
BINDINGS = "bindings"
FORMS = (RELEASED, BINDINGS)

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

# Bindings-form state_update kinds and output fields, by released kind.
UPDATE_KIND = {FIXED_CONV: "causal_conv", FIXED_RECURRENT: "gated_delta_net"}
UPDATE_OUTPUT_FIELD = {FIXED_CONV: "value", FIXED_RECURRENT: "capsule"}
KIND_OF_UPDATE = {v: k for k, v in UPDATE_KIND.items()}


def _template(section: str, default: str):
    return field(default=default, metadata={"section": section})


@dataclass(frozen=True)
class StateNames:
    """Decoder-wide tensor names, keyed as in the released form's ``decoder.inputs`` / ``outputs``.

    ``%d`` stands for the layer id. The class defaults are the runtime's defaults for absent keys
    (docs/genai-config.md#name-templates-and-runtime-defaults), which differ from what exporters write
    (:data:`EXPORTER_NAMES`).
    """

    past_key_names: str = _template("inputs", "past_key_values.%d.key")
    past_value_names: str = _template("inputs", "past_key_values.%d.value")
    past_conv_names: str = _template("inputs", "past_key_values.%d.conv_state")
    past_recurrent_names: str = _template("inputs", "past_key_values.%d.recurrent_state")
    state_update_capture_count: str = _template("inputs", "state_update_capture_count")
    state_update_active: str = _template("inputs", "state_update_active")
    present_key_names: str = _template("outputs", "present.%d.key")
    present_value_names: str = _template("outputs", "present.%d.value")
    present_conv_names: str = _template("outputs", "present.%d.conv_state")
    present_recurrent_names: str = _template("outputs", "present.%d.recurrent_state")
    state_update_conv_value_names: str = _template("outputs", "state_update.%d.conv_value")
    state_update_recurrent_capsule_names: str = _template("outputs", "state_update.%d.recurrent_capsule")

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Template key -> section ("inputs" or "outputs")."""
        return {f.name: f.metadata["section"] for f in dataclasses.fields(cls)}

    @classmethod
    def from_decoder(cls, decoder: Mapping) -> "StateNames":
        """The names a released-form decoder section resolves to (absent keys take the defaults)."""
        found = {}
        for key, section in cls.keys().items():
            value = (decoder.get(section) or {}).get(key)
            if isinstance(value, str):
                found[key] = value
        return cls(**found)


RUNTIME_DEFAULTS = StateNames()
EXPORTER_NAMES = StateNames(
    past_conv_names="past.%d.conv",
    past_recurrent_names="past.%d.recurrent",
    present_conv_names="present.%d.conv",
    present_recurrent_names="present.%d.recurrent",
)

# Binding semantics of each released kind: semantic -> (input template key, output template key).
KIND_BINDINGS: dict[str, dict[str, tuple[str, str]]] = {
    PAGED_KV: {"key": ("past_key_names", "present_key_names"),
               "value": ("past_value_names", "present_value_names")},
    FIXED_CONV: {"state": ("past_conv_names", "present_conv_names")},
    FIXED_RECURRENT: {"state": ("past_recurrent_names", "present_recurrent_names")},
}
UPDATE_OUTPUT_KEY = {FIXED_CONV: "state_update_conv_value_names",
                     FIXED_RECURRENT: "state_update_recurrent_capsule_names"}
CAPTURE_KEYS = ("state_update_capture_count", "state_update_active")


@dataclass(frozen=True)
class Binding:
    input: str
    output: str


@dataclass(frozen=True)
class StateUpdate:
    """A fixed group's compact update contract, names resolved."""

    capacity: int
    output: str  # template of the conv value or the GDN capsule output
    capture_count: str = RUNTIME_DEFAULTS.state_update_capture_count
    active: str = RUNTIME_DEFAULTS.state_update_active  # "" when the graph has no such input
    enabled: bool = True
    key_head_count: int | None = None  # fixed_recurrent only


@dataclass(frozen=True)
class StateGroup:
    """One group, in either form. ``kind`` is a released kind, or ``fixed`` for a bindings-form group
    whose flavour (conv or recurrent) nothing in the file states."""

    kind: str
    layer_ids: tuple[int, ...]
    bindings: Mapping[str, Binding]
    state_update: StateUpdate | None = None


@dataclass(frozen=True)
class StateManifest:
    groups: tuple[StateGroup, ...]
    # decoder.state_update_capacity as written (released form only); None when absent.
    declared_capacity: int | None = None

    @property
    def capacity(self) -> int:
        """The update capacity the groups declare (0 when none do)."""
        return next((g.state_update.capacity for g in self.groups if g.state_update), 0)


class NotExpressible(ValueError):
    """The manifest cannot be written in the requested form without losing information."""


# --------------------------------------------------------------------------------------------------
# Building a manifest from a decoder description
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderStates:
    """What the writer needs to know about a decoder.

    ``layer_types`` holds ``linear_attention`` or ``full_attention`` per layer. Full-attention KV forms a
    ``paged_kv`` group only in paged exports; non-paged KV is the dense legacy cache and stays outside
    the manifest. ``capacity`` is the compact update capacity (0: no update tensors).
    """

    layer_types: tuple[str, ...]
    key_head_count: int  # linear_num_key_heads (Hk)
    capacity: int = 0
    paged: bool = False
    names: StateNames = EXPORTER_NAMES

    def __post_init__(self):
        unknown = sorted(set(self.layer_types) - {LINEAR_ATTENTION, FULL_ATTENTION})
        if unknown:
            raise ValueError(f"layer_types: expected {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}, got {unknown}")
        if not 0 <= self.capacity <= MAX_STATE_UPDATE_CAPACITY:
            raise ValueError(f"state update capacity must be in [0, {MAX_STATE_UPDATE_CAPACITY}], got {self.capacity}")
        if self.key_head_count <= 0 and LINEAR_ATTENTION in self.layer_types:
            raise ValueError(f"key_head_count must be positive, got {self.key_head_count}")


def manifest_for(decoder: DecoderStates) -> StateManifest:
    """Groups in the 0.18 builder's order: paged_kv (attention), fixed_conv, fixed_recurrent (linear)."""
    full = tuple(i for i, t in enumerate(decoder.layer_types) if t == FULL_ATTENTION)
    linear = tuple(i for i, t in enumerate(decoder.layer_types) if t == LINEAR_ATTENTION)
    names = decoder.names
    groups = []
    if decoder.paged and full:
        groups.append(StateGroup(PAGED_KV, full, _bindings_from_names(PAGED_KV, names)))
    if linear:
        for kind in (FIXED_CONV, FIXED_RECURRENT):
            update = None
            if decoder.capacity:
                update = StateUpdate(
                    capacity=decoder.capacity,
                    output=getattr(names, UPDATE_OUTPUT_KEY[kind]),
                    capture_count=names.state_update_capture_count,
                    active=names.state_update_active,
                    key_head_count=decoder.key_head_count if kind == FIXED_RECURRENT else None,
                )
            groups.append(StateGroup(kind, linear, _bindings_from_names(kind, names), update))
    return StateManifest(tuple(groups), declared_capacity=decoder.capacity if decoder.capacity else None)


def _bindings_from_names(kind: str, names: StateNames) -> dict[str, Binding]:
    return {sem: Binding(getattr(names, i), getattr(names, o)) for sem, (i, o) in KIND_BINDINGS[kind].items()}


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def write_state_groups(decoder: dict, manifest: StateManifest, form: str = RELEASED) -> dict:
    """Write ``manifest`` into a genai_config ``model.decoder`` section, in place, and return it.

    Keys of ``decoder.inputs`` / ``outputs`` that the manifest does not concern are kept. An empty
    manifest removes ``state_groups`` (the legacy contract).
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    inputs = decoder.setdefault("inputs", {})
    outputs = decoder.setdefault("outputs", {})
    for key in ("state_groups", "state_update_capacity"):
        decoder.pop(key, None)
    if form == RELEASED:
        templates = released_templates(manifest)
        for key, section in StateNames.keys().items():
            if key in CAPTURE_KEYS or key in UPDATE_OUTPUT_KEY.values():
                (inputs if section == "inputs" else outputs).pop(key, None)
        for key, value in templates.items():
            (inputs if StateNames.keys()[key] == "inputs" else outputs)[key] = value
        groups = [_released_group(g) for g in manifest.groups]
    else:
        # Capture names and update outputs move into the groups. Decoder-wide state templates are left
        # as they are: the groups' bindings win over them in this form.
        for key in CAPTURE_KEYS:
            inputs.pop(key, None)
        for key in UPDATE_OUTPUT_KEY.values():
            outputs.pop(key, None)
        groups = [_bindings_group(g) for g in manifest.groups]
    if groups:
        decoder["state_groups"] = groups
        if form == RELEASED and manifest.declared_capacity is not None:
            decoder["state_update_capacity"] = manifest.declared_capacity
    return decoder


def released_templates(manifest: StateManifest) -> dict[str, str]:
    """The decoder-wide templates the released form needs for ``manifest``.

    Raises :class:`NotExpressible` when two groups give one role different names (the released form has
    one template per role) or when a group's flavour is unknown.
    """
    found: dict[str, tuple[str, int]] = {}

    def put(key: str, value: str, index: int):
        if key in found and found[key][0] != value:
            raise NotExpressible(
                f"model.decoder.state_groups[{index}]: {key} would be {value!r}, but "
                f"state_groups[{found[key][1]}] already needs {found[key][0]!r}; the released form has one "
                f"template per role")
        found.setdefault(key, (value, index))

    for index, group in enumerate(manifest.groups):
        if group.kind not in KIND_BINDINGS:
            raise NotExpressible(
                f"model.decoder.state_groups[{index}]: cannot tell whether this fixed group holds conv or "
                f"recurrent state (no state_update kind); give the graph so its rank decides")
        for sem, (in_key, out_key) in KIND_BINDINGS[group.kind].items():
            put(in_key, group.bindings[sem].input, index)
            put(out_key, group.bindings[sem].output, index)
        if group.state_update:
            update = group.state_update
            put(UPDATE_OUTPUT_KEY[group.kind], update.output, index)
            put("state_update_capture_count", update.capture_count, index)
            put("state_update_active", update.active, index)
    return {key: value for key, (value, _) in found.items()}


def _released_group(group: StateGroup) -> dict:
    out: dict = {"kind": group.kind, "layer_ids": list(group.layer_ids)}
    if group.state_update:
        update = group.state_update
        out["state_update"] = {"capacity": update.capacity}
        if not update.enabled:
            out["state_update"]["enabled"] = False
        if update.key_head_count is not None:
            out["state_update"]["key_head_count"] = update.key_head_count
    return out


def _bindings_group(group: StateGroup) -> dict:
    kind = PAGED_KV if group.kind == PAGED_KV else FIXED
    out: dict = {
        "kind": kind,
        "layer_ids": list(group.layer_ids),
        "bindings": {sem: {"input": b.input, "output": b.output} for sem, b in group.bindings.items()},
    }
    if group.state_update:
        update = group.state_update
        body: dict = {"kind": UPDATE_KIND[group.kind], "capacity": update.capacity}
        if not update.enabled:
            body["enabled"] = False
        body["capture_count"] = update.capture_count
        if update.active:
            body["active"] = update.active
        body[UPDATE_OUTPUT_FIELD[group.kind]] = update.output
        if update.key_head_count is not None:
            body["key_head_count"] = update.key_head_count
        out["state_update"] = body
    return out


def expand(template: str, layer_id: int) -> str:
    """A template with its single ``%d`` replaced by ``layer_id``."""
    return template.replace("%d", str(layer_id), 1)
