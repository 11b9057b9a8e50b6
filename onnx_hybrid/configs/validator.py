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

import re
from pathlib import Path
from typing import Iterator

from ..ops.contract import GATED_DELTA_NET, VARLEN_CAUSAL_CONV, conv_capsule_shape, gdn_capsule_width
from .findings import CONFIG, ENGINE, ERROR, PARSE, SESSION, WARNING, Finding, Report
from .graph_io import GraphIO, TensorInfo
from .parse import GROUPS_PATH, detect_form, group_label, load_config, parse_state_groups
from .state_groups import (
    BINDINGS, FIXED, FIXED_CONV, FIXED_RECURRENT, FORMS, KIND_BINDINGS, PAGED_KV, RELEASED,
    UPDATE_OUTPUT_FIELD, UPDATE_OUTPUT_KEY, StateGroup, StateManifest, expand,
)

CONFIG_FILE = "genai_config.json"
_TEMPLATE = re.compile(r"^[^%]*%d[^%]*$")  # exactly one %d and no other %
FIXED_KINDS = (FIXED_CONV, FIXED_RECURRENT, FIXED)


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
    decoder = _decoder(config)
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
        _Session(report, manifest, report.form, graph).run()
    _check_engine(config, manifest, graph, report)
    return report


def validate_config(config: dict, *, form: str | None = None, path: str = CONFIG_FILE) -> Report:
    """The checks that need no graph: what ``og.Config`` applies, plus our config-level rules."""
    report = Report(path)
    _check_config(config, form, report)
    return report


def _decoder(config: dict) -> dict:
    model = config.get("model") if isinstance(config, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    return decoder if isinstance(decoder, dict) else {}


def _check_config(config: dict, form: str | None, report: Report) -> StateManifest | None:
    if form is not None and form not in FORMS:
        raise ValueError(f"form must be one of {FORMS} or None, got {form!r}")
    decoder = _decoder(config)
    report.form = form or detect_form(decoder)
    if report.form == BINDINGS and form is None:
        report.add(Finding("form", PARSE, GROUPS_PATH,
                           "bindings (#2454) form: onnxruntime-genai 0.18 parses only the released form "
                           "(onnx-hybrid convert-config --to released)", severity=WARNING))
    manifest = parse_state_groups(decoder, report.form or RELEASED, report)
    if manifest is not None:
        num_layers = decoder.get("num_hidden_layers", 0)
        _Config(report, manifest, report.form, num_layers if isinstance(num_layers, int) else 0).run()
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


# --------------------------------------------------------------------------------------------------
# Where each name lives in the file (for finding paths)
# --------------------------------------------------------------------------------------------------


def _binding_path(form: str, index: int, kind: str, sem: str, side: str) -> str:
    if form == BINDINGS:
        return f"{GROUPS_PATH}[{index}].bindings.{sem}.{side}"
    in_key, out_key = KIND_BINDINGS[kind][sem]
    return f"model.decoder.inputs.{in_key}" if side == "input" else f"model.decoder.outputs.{out_key}"


def _update_path(form: str, index: int, kind: str, field: str) -> str:
    """``field``: "output", "capture_count" or "active"."""
    if form == BINDINGS:
        key = UPDATE_OUTPUT_FIELD.get(kind, "value") if field == "output" else field
        return f"{GROUPS_PATH}[{index}].state_update.{key}"
    if field == "output":
        return f"model.decoder.outputs.{UPDATE_OUTPUT_KEY[kind]}"
    return f"model.decoder.inputs.state_update_{field}"


def _label(index: int, group: StateGroup, form: str) -> str:
    if form == BINDINGS and group.kind in FIXED_KINDS:
        return group_label(index, FIXED)
    return group_label(index, group.kind)


# --------------------------------------------------------------------------------------------------
# 4.2 ValidateConfig
# --------------------------------------------------------------------------------------------------


class _Config:
    def __init__(self, report: Report, manifest: StateManifest, form: str, num_layers: int):
        self.report, self.manifest, self.form, self.num_layers = report, manifest, form, num_layers
        self.v3 = form == BINDINGS

    def fail(self, rule: str, path: str, message: str, **kw) -> None:
        self.report.add(Finding(rule, CONFIG, path, message, **kw))

    def run(self) -> None:
        groups = self.manifest.groups
        if not groups:
            self.fail("C1", GROUPS_PATH, "model.decoder.state_groups must not be empty")
            return
        names_seen: dict[str, int] = {}
        paged_seen: dict[int, int] = {}
        for index, group in enumerate(groups):
            self.group(index, group, names_seen, paged_seen)
        self.shared_update_contract()

    def group(self, index: int, group: StateGroup, names_seen: dict, paged_seen: dict) -> None:
        label, path = _label(index, group, self.form), f"{GROUPS_PATH}[{index}]"
        if not group.kind:
            self.fail("C2", f"{path}.kind", f"{label} is missing kind", expected="paged_kv | fixed_conv | fixed_recurrent")
            return
        if not group.layer_ids:
            self.fail("C3", f"{path}.layer_ids", f"{label} must contain at least one layer_id")
        if self.v3:
            wanted = {"key", "value"} if group.kind == PAGED_KV else {"state"}
            if set(group.bindings) != wanted:
                arity = "exactly key and value bindings" if group.kind == PAGED_KV else "exactly one state binding"
                self.fail("C4", f"{path}.bindings", f"{label} requires {arity}", expected=sorted(wanted),
                          actual=sorted(group.bindings))
        if group.state_update and group.kind == PAGED_KV:
            self.fail("C5", f"{path}.state_update", f"{label} only fixed state groups support state_update")
        elif group.state_update:
            self.update(index, group, label, f"{path}.state_update")
        for j, layer in enumerate(group.layer_ids):
            if not 0 <= layer < self.num_layers:
                self.fail("C12", f"{path}.layer_ids[{j}]",
                          f"{label} has layer_id {layer} outside [0, num_hidden_layers)",
                          expected=f"[0, {self.num_layers})", actual=layer)
            if layer in group.layer_ids[:j]:
                self.fail("C13", f"{path}.layer_ids[{j}]", f"{label} contains duplicate layer_id {layer}",
                          actual=layer)
            elif group.kind == PAGED_KV:
                if layer in paged_seen:
                    self.fail("C14", f"{path}.layer_ids[{j}]",
                              f"{label} overlaps another paged_kv group at layer_id {layer}",
                              expected=f"disjoint from state_groups[{paged_seen[layer]}]", actual=layer)
                paged_seen.setdefault(layer, index)
        self.templates(index, group, label, names_seen)

    def update(self, index: int, group: StateGroup, label: str, path: str) -> None:
        update = group.state_update
        if not 1 <= update.capacity <= 8:
            self.fail("C7", f"{path}.capacity", f"{label} state_update capacity must be in [1, 8]",
                      expected="[1, 8]", actual=update.capacity or None)
        count_path = _update_path(self.form, index, group.kind, "capture_count")
        if not update.capture_count:
            self.fail("C8", count_path, f"{label} state_update is missing capture_count")
        elif "%" in update.capture_count:
            self.fail("C8", count_path, f"{label} state_update capture_count must be a graph input name, not a template",
                      actual=update.capture_count)
        if "%" in update.active:
            self.fail("C9", _update_path(self.form, index, group.kind, "active"),
                      f"{label} state_update active must be a graph input name, not a template",
                      actual=update.active)
        if not self.v3:  # the bindings form's per-kind fields are checked while parsing
            if group.kind == FIXED_CONV and update.key_head_count is not None:
                self.fail("C10", f"{path}.key_head_count", f"{label} fixed_conv state_update does not use key_head_count",
                          actual=update.key_head_count)
            if group.kind == FIXED_RECURRENT and update.key_head_count is None:
                self.fail("C10", f"{path}.key_head_count", f"{label} fixed_recurrent state_update requires key_head_count",
                          expected="linear_num_key_heads (> 0)")

    def templates(self, index: int, group: StateGroup, label: str, names_seen: dict) -> None:
        """C15 (each template has one %d) and C16 (every expanded name is bound once)."""
        templates = []  # (semantic, side, template)
        for sem, binding in group.bindings.items():
            templates += [(sem, "input", binding.input), (sem, "output", binding.output)]
        update = group.state_update
        if update and group.kind in UPDATE_OUTPUT_KEY:
            sem = f"state_update.{UPDATE_OUTPUT_FIELD[group.kind]}" if self.v3 else "state_update"
            templates.append((sem, "output", update.output))
        well_formed = True
        for sem, side, template in templates:
            path = (_update_path(self.form, index, group.kind, "output") if sem.startswith("state_update")
                    else _binding_path(self.form, index, group.kind, sem, side))
            if not template:
                self.fail("C15", path, f"{label} binding '{sem}' is missing its {side} template")
                well_formed = False
            elif not _TEMPLATE.match(template):
                self.fail("C15", path, f"{label} binding '{sem}' has malformed {side} template '{template}'; "
                          "expected exactly one %d", expected="exactly one %d", actual=template)
                well_formed = False
        if not well_formed:
            return
        for layer in dict.fromkeys(group.layer_ids):  # a repeated id is C13, not a second binding
            for _, _, template in templates:
                name = expand(template, layer)
                if name in names_seen:
                    self.fail("C16", f"{GROUPS_PATH}[{index}]", f"{label} resolves more than one binding to '{name}'",
                              tensor=name, expected=f"bound once (already by state_groups[{names_seen[name]}])")
                names_seen.setdefault(name, index)

    def shared_update_contract(self) -> None:
        """C11 (one capacity, one enabled setting, and in the bindings form one pair of capture inputs)
        and C17 (all fixed groups or none declare state_update)."""
        fixed = [(i, g) for i, g in enumerate(self.manifest.groups) if g.kind in FIXED_KINDS]
        updates = [(i, g.state_update) for i, g in fixed if g.state_update]
        if updates and len(updates) != len(fixed):
            missing = [i for i, g in fixed if not g.state_update]
            self.fail("C17", f"{GROUPS_PATH}[{missing[0]}].state_update",
                      "All fixed state groups must declare state_update when any fixed group declares it",
                      expected="state_update", actual=None)
        updates = [(i, u) for i, u in updates if 1 <= u.capacity <= 8]  # a bad capacity is C7's
        if not updates:
            return
        first = updates[0][1]
        for index, update in updates[1:]:
            path = f"{GROUPS_PATH}[{index}].state_update"
            if self.v3 and (update.capacity, update.capture_count, update.active) != (
                    first.capacity, first.capture_count, first.active):
                self.fail("C11", path, "All fixed state_update groups must use the same capacity and "
                          "capture_count input, and the same active input",
                          expected=[first.capacity, first.capture_count, first.active],
                          actual=[update.capacity, update.capture_count, update.active])
            elif not self.v3 and update.capacity != first.capacity:
                self.fail("C11", f"{path}.capacity", "All fixed state_update groups must use the same capacity",
                          expected=first.capacity, actual=update.capacity)
            if update.enabled != first.enabled:
                self.fail("C11", f"{path}.enabled", "All fixed state_update groups must use the same enabled setting",
                          expected=first.enabled, actual=update.enabled)


# --------------------------------------------------------------------------------------------------
# 4.3 ValidateSession
# --------------------------------------------------------------------------------------------------


def _compatible(a: int, b: int) -> bool:
    return a < 0 or b < 0 or a == b


def _dims(info: TensorInfo) -> str:
    return "[" + ", ".join(str(d) for d in info.shape or ()) + "]"


class _Session:
    def __init__(self, report: Report, manifest: StateManifest, form: str, graph: GraphIO):
        self.report, self.manifest, self.form, self.graph = report, manifest, form, graph

    def fail(self, rule: str, path: str, message: str, **kw) -> None:
        self.report.add(Finding(rule, SESSION, path, message, **kw))

    def run(self) -> None:
        for index, group in enumerate(self.manifest.groups):
            if group.kind not in KIND_BINDINGS and group.kind != FIXED:
                continue
            label = _label(index, group, self.form)
            states = self.bindings(index, group, label)
            if group.kind == PAGED_KV:
                self.paged(label, index, group, states)
            elif group.state_update:
                self.update(index, group, label, states)
        self.unbound_states()

    def unbound_states(self) -> None:
        """x.unbound_state: a graph input that a group's template names for a layer outside every group
        with that template. 0.18.0 accepts this (it binds only the listed layers), and the run then
        fails on a missing feed or, worse, the runtime never carries that layer's state."""
        covered: dict[str, set[int]] = {}
        for group in self.manifest.groups:
            for binding in group.bindings.values():
                covered.setdefault(binding.input, set()).update(group.layer_ids)
        for template, layers in covered.items():
            if template.count("%d") != 1:
                continue
            pattern = re.compile(re.escape(template).replace("%d", r"(\d+)") + "$")
            for name in self.graph.inputs:
                match = pattern.match(name)
                if match and int(match.group(1)) not in layers:
                    self.fail("x.unbound_state", GROUPS_PATH,
                              f"graph input '{name}' matches the state template '{template}', but layer "
                              f"{match.group(1)} is in no group that binds it", tensor=name,
                              expected=f"layer {match.group(1)} in the group's layer_ids", actual=sorted(layers))

    def bindings(self, index: int, group: StateGroup, label: str) -> list[tuple[TensorInfo, TensorInfo]]:
        """S1-S3 for every layer and semantic; returns the (input, output) pairs that exist."""
        pairs = []
        for sem, binding in group.bindings.items():
            for layer in group.layer_ids:
                names = expand(binding.input, layer), expand(binding.output, layer)
                found = []
                for side, name, table in (("input", names[0], self.graph.inputs),
                                          ("output", names[1], self.graph.outputs)):
                    if name not in table:
                        self.fail("S1", _binding_path(self.form, index, group.kind, sem, side),
                                  f"{label} binding '{sem}' {side} was not found: {name}", tensor=name,
                                  expected=f"a graph {side}", actual="absent")
                    else:
                        found.append(table[name])
                if len(found) < 2:
                    continue
                x, y = found
                path = f"{GROUPS_PATH}[{index}].layer_ids"
                if x.dtype != y.dtype:
                    self.fail("S2", path, f"{label} binding '{sem}' has incompatible dtypes for input '{x.name}' "
                              f"and output '{y.name}'", tensor=y.name, expected=x.dtype, actual=y.dtype)
                if x.rank is not None and y.rank is not None and (
                        x.rank != y.rank or not all(map(_compatible, x.shape, y.shape))):
                    self.fail("S3", path, f"{label} binding '{sem}' has incompatible shapes for input '{x.name}' "
                              f"{_dims(x)} and output '{y.name}' {_dims(y)}", tensor=y.name,
                              expected=x.describe(), actual=y.describe())
                pairs.append((x, y))
        return pairs

    def paged(self, label: str, index: int, group: StateGroup, pairs: list) -> None:
        """S4: rank-4 paged tensors that all share one geometry."""
        tensors = [t for pair in pairs for t in pair]
        path = f"{GROUPS_PATH}[{index}]"
        for t in tensors:
            if t.rank != 4:
                self.fail("S4", path, f"{label} paged binding '{t.name}' must have rank 4, got {t.rank}",
                          tensor=t.name, expected="[num_blocks, block_size, num_key_value_heads, head_size]",
                          actual=t.describe())
        ranked = [t for t in tensors if t.rank == 4]
        for t in ranked[1:]:
            a = ranked[0]
            if t.dtype != a.dtype or not all(map(_compatible, a.shape, t.shape)):
                self.fail("S4", path, f"{label} has incompatible paged geometry between '{a.name}' {_dims(a)} "
                          f"and '{t.name}' {_dims(t)}", tensor=t.name, expected=a.describe(), actual=t.describe())

    def update(self, index: int, group: StateGroup, label: str, pairs: list) -> None:
        update = group.state_update
        states = [y for _, y in pairs]
        count_path = _update_path(self.form, index, group.kind, "capture_count")
        count = self.graph.inputs.get(update.capture_count)
        if count is None:
            self.fail("S5", count_path, f"{label} state_update capture_count input was not found: "
                      f"{update.capture_count}", tensor=update.capture_count, expected="int32 [batch]",
                      actual="absent")
        else:
            self.capture_count(count, label, count_path, states)
        if update.active:
            self.active(update.active, label, _update_path(self.form, index, group.kind, "active"))
        rank = {FIXED_CONV: 3, FIXED_RECURRENT: 4}.get(group.kind)
        for state in states:
            if rank is not None and state.rank != rank:
                self.fail("S7", f"{GROUPS_PATH}[{index}].layer_ids",
                          f"{label} state output '{state.name}' must have rank {rank}, got {state.rank}",
                          tensor=state.name, expected=f"rank {rank}", actual=state.describe())
        if group.kind not in UPDATE_OUTPUT_KEY:
            return
        out_path = _update_path(self.form, index, group.kind, "output")
        for layer, state in zip(group.layer_ids, self._states_by_layer(group)):
            name = expand(update.output, layer)
            out = self.graph.outputs.get(name)
            what = "value" if group.kind == FIXED_CONV else "capsule"
            if out is None:
                self.fail("S8" if what == "value" else "S9", out_path,
                          f"{label} state_update {what} output was not found: {name}", tensor=name,
                          expected="a graph output", actual="absent")
                continue
            if state is None or state.rank != rank:
                continue
            if group.kind == FIXED_CONV:
                self.conv_value(label, out_path, out, state, update.capacity)
            else:
                self.capsule(label, out_path, out, state, update.capacity, update.key_head_count or 0)
            self.producer_capacity(out, out_path, update.capacity)

    def _states_by_layer(self, group: StateGroup) -> Iterator[TensorInfo | None]:
        binding = group.bindings.get("state")
        for layer in group.layer_ids:
            yield self.graph.outputs.get(expand(binding.output, layer)) if binding else None

    def capture_count(self, count: TensorInfo, label: str, path: str, states: list[TensorInfo]) -> None:
        name = count.name
        if count.dtype != "int32":
            self.fail("S5", path, f"{label} state_update capture_count input '{name}' must have int32 dtype",
                      tensor=name, expected="int32", actual=count.dtype)
        if count.rank != 1:
            self.fail("S5", path, f"{label} state_update capture_count input '{name}' must have rank 1, got "
                      f"{count.rank}", tensor=name, expected="int32 [batch]", actual=count.describe())
            return
        for state in states:
            if state.rank and not _compatible(count.shape[0], state.shape[0]):
                self.fail("S5", path, f"{label} state_update capture_count input '{name}' has batch dimension "
                          f"incompatible with state output '{state.name}'", tensor=name,
                          expected=f"[{state.shape[0]}]", actual=count.describe())

    def active(self, name: str, label: str, path: str) -> None:
        active = self.graph.inputs.get(name)
        if active is None:
            self.fail("S6", path, f"{label} state_update active input was not found: {name}", tensor=name,
                      expected="int32 [1] graph input (or \"state_update_active\": \"\" to declare none)",
                      actual="absent")
            return
        if active.dtype != "int32":
            self.fail("S6", path, f"{label} state_update active input '{name}' must have int32 dtype",
                      tensor=name, expected="int32", actual=active.dtype)
        if active.rank != 1:
            self.fail("S6", path, f"{label} state_update active input '{name}' must have rank 1, got {active.rank}",
                      tensor=name, expected="int32 [1]", actual=active.describe())
        elif active.shape != (1,):
            self.fail("S6", path, f"{label} state_update active input '{name}' must have shape [1]",
                      tensor=name, expected="[1]", actual=active.describe())

    def conv_value(self, label: str, path: str, value: TensorInfo, state: TensorInfo, capacity: int) -> None:
        """S8: [B, capacity, C] in the state's dtype, against the conv state [B, C, K-1]."""
        expected = conv_capsule_shape(state.shape[0], capacity, state.shape[1])
        if value.dtype != state.dtype:
            self.fail("S8", path, f"{label} state_update value output '{value.name}' must have the same dtype as "
                      f"state output '{state.name}'", tensor=value.name, expected=state.dtype, actual=value.dtype)
        if value.rank != 3 or not (_compatible(value.shape[0], expected[0]) and value.shape[1] == capacity
                                   and _compatible(value.shape[2], expected[2])):
            self.fail("S8", path, f"{label} state_update value output '{value.name}' has incompatible batch, "
                      "capacity, or channel dimensions", tensor=value.name,
                      expected=_shape_text(expected), actual=value.describe())

    def capsule(self, label: str, path: str, capsule: TensorInfo, state: TensorInfo, capacity: int,
                key_heads: int) -> None:
        """S9: fp32 [B, capacity * (Hv + Hk*Dk + Hv*Dv)] against the V-major state [B, Hv, Dv, Dk]."""
        if state.dtype != "float" or capsule.dtype != "float":
            self.fail("S9", path, f"{label} gated_delta_net state and state_update capsule must have float dtype",
                      tensor=capsule.name, expected="float, float", actual=f"{state.dtype}, {capsule.dtype}")
        if capsule.rank != 2:
            self.fail("S9", path, f"{label} state_update capsule output '{capsule.name}' must have rank 2, got "
                      f"{capsule.rank}", tensor=capsule.name, expected="[batch, width]", actual=capsule.describe())
            return
        if not _compatible(capsule.shape[0], state.shape[0]):
            self.fail("S9", path, f"{label} state_update capsule output '{capsule.name}' has batch dimension "
                      f"incompatible with state output '{state.name}'", tensor=capsule.name,
                      expected=state.shape[0], actual=capsule.shape[0])
        _, hv, dv, dk = state.shape
        if min(hv, dv, dk) < 0:
            self.fail("S9", path, f"{label} state output '{state.name}' needs static head dims to size the "
                      "capsule", tensor=state.name, expected="[batch, Hv, Dv, Dk] with static Hv, Dv, Dk",
                      actual=state.describe())
            return
        width = gdn_capsule_width(capacity, hv, key_heads, dk, dv)
        if capsule.shape[1] != width:
            self.fail("S9", path, f"{label} state_update capsule output '{capsule.name}' width must be {width}",
                      tensor=capsule.name, expected=f"{capacity}*({hv} + {key_heads}*{dk} + {hv}*{dv}) = {width}",
                      actual=capsule.describe())

    def producer_capacity(self, out: TensorInfo, path: str, capacity: int) -> None:
        """x.op_capacity: the operator writing the update must capture as many slots as the config says."""
        producer = self.graph.producers.get(out.name)
        if producer is None or producer[0] not in (GATED_DELTA_NET.name, VARLEN_CAUSAL_CONV.name):
            return
        op_type, _, attrs = producer
        actual = attrs.get("state_update_capacity", 0)
        if actual != capacity:
            self.fail("x.op_capacity", path, f"the {op_type} node writing '{out.name}' has state_update_capacity "
                      f"{actual}, but the config declares capacity {capacity}", tensor=out.name,
                      expected=capacity, actual=actual)


def _shape_text(shape: list) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in shape) + "]"


# --------------------------------------------------------------------------------------------------
# 4.4 Engine (dynamic batching)
# --------------------------------------------------------------------------------------------------


def _check_engine(config: dict, manifest: StateManifest | None, graph: GraphIO, report: Report) -> None:
    engine = (config.get("engine") or {}).get("dynamic_batching") if isinstance(config.get("engine"), dict) else None
    decoder = _decoder(config)
    groups = manifest.groups if manifest else ()
    paged = [(i, g) for i, g in enumerate(groups) if g.kind == PAGED_KV]
    fixed = [g for g in groups if g.kind in FIXED_KINDS]

    def finding(rule: str, path: str, message: str, severity: str = ERROR, **kw) -> None:
        report.add(Finding(rule, ENGINE, path, message, severity=severity, **kw))

    if not isinstance(engine, dict):
        if fixed:
            finding("engine.dynamic_batching", "engine.dynamic_batching",
                    "Fixed decoder state groups require engine.dynamic_batching (og.Engine refuses this model; "
                    "og.Model and og.Generator run it)", severity=WARNING)
        if len(paged) > 1:
            finding("engine.paged_groups", GROUPS_PATH,
                    "Dynamic batching requires exactly one paged_kv decoder state group", severity=WARNING,
                    expected=1, actual=len(paged))
        return
    if "num_blocks" not in engine:
        finding("engine.num_blocks", "engine.dynamic_batching.num_blocks",
                "engine.dynamic_batching.num_blocks is unset: the pool is then sized by gpu_utilization_factor, "
                "which only GPUs have; on CPU og.Engine fails with 'The key-value cache budget is too small to "
                "hold the reserved decoder state.'", severity=WARNING)
    for key in ("num_hidden_layers", "num_key_value_heads", "head_size"):
        value = decoder.get(key, 0)
        if not isinstance(value, int) or value <= 0:
            finding("engine.geometry", f"model.decoder.{key}",
                    f"Dynamic batching requires model.decoder.{key} to be greater than zero.", actual=value)
    if len(paged) != 1:
        finding("engine.paged_groups", GROUPS_PATH,
                "Dynamic batching requires exactly one paged_kv decoder state group", expected=1, actual=len(paged))
    if paged:
        _check_paged_pool(paged[0][1], engine, decoder, graph, finding)
    for index, group in enumerate(groups):
        binding = group.bindings.get("state") if group.kind in FIXED_KINDS else None
        for layer in group.layer_ids if binding else ():
            state = graph.inputs.get(expand(binding.input, layer))
            if state is not None and state.rank and state.shape[0] >= 0:
                finding("engine.fixed_batch", _binding_path(report.form, index, group.kind, "state", "input"),
                        "Dynamic batching requires fixed decoder state groups with a dynamic batch axis, but this "
                        f"model declares a fixed (static) batch dimension of {state.shape[0]}", tensor=state.name,
                        expected="symbolic batch", actual=state.describe())
    position_name = (decoder.get("inputs") or {}).get("position_ids", "position_ids")
    position = graph.inputs.get(position_name)
    packed_geometry = position is not None and position.dtype == "int64" and (
        position.shape == (-1,) or (position.rank == 2 and position.shape[0] == 3 and position.shape[1] < 0))
    if groups and position is not None and not packed_geometry:
        finding("engine.position_ids", "model.decoder.inputs.position_ids",
                "Packed hybrid execution requires position_ids with dynamic int64 [num_tokens] or [3, num_tokens] "
                "geometry", tensor=position.name, expected="int64 [num_tokens] or [3, num_tokens]",
                actual=position.describe())


# Per pool axis: its name, the runtime's message tail, and the config field it is compared with.
_POOL_AXES = (
    ("num_blocks", " for the full-context paged cache pool.", "engine.dynamic_batching.num_blocks"),
    ("block_size", " from engine.dynamic_batching.block_size.", "engine.dynamic_batching.block_size"),
    ("num_key_value_heads", " from model.decoder.num_key_value_heads.", "model.decoder.num_key_value_heads"),
    ("head_size", " from model.decoder.head_size.", "model.decoder.head_size"),
)


def _check_paged_pool(group: StateGroup, engine: dict, decoder: dict, graph: GraphIO, finding) -> None:
    expected_axes = [engine.get("num_blocks", -1), engine.get("block_size", 256),
                     decoder.get("num_key_value_heads", -1), decoder.get("head_size", -1)]
    for sem, binding in group.bindings.items():
        for layer in group.layer_ids:
            for name, table in ((expand(binding.input, layer), graph.inputs),
                                (expand(binding.output, layer), graph.outputs)):
                tensor = table.get(name)
                if tensor is None or tensor.shape is None:
                    continue
                if tensor.rank != 4:
                    finding("engine.paged_pool", GROUPS_PATH,
                            f"Paged cache tensor '{name}' for layer {layer} must have rank 4 [num_blocks, block_size, "
                            f"num_key_value_heads, head_size]; got rank {tensor.rank} with shape {_dims(tensor)}.",
                            tensor=name, actual=tensor.describe())
                    continue
                for axis, ((axis_name, source, path), want, got) in enumerate(
                        zip(_POOL_AXES, expected_axes, tensor.shape)):
                    if isinstance(want, int) and want >= 0 and got >= 0 and got != want:
                        finding("engine.paged_pool", path,
                                f"Paged cache tensor '{name}' for layer {layer} has incompatible axis {axis} "
                                f"({axis_name}): graph dimension {got}; expected {want}{source}",
                                tensor=name, expected=want, actual=got)

