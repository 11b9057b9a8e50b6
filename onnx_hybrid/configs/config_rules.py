"""Config-time rules: what ``og.Config`` checks once the JSON is parsed (docs/genai-config.md#config-rules)."""

from __future__ import annotations

import re

from .findings import CONFIG, Finding, Report
from .locations import FIXED_KINDS, binding_path, label_of, update_path
from .parse import GROUPS_PATH
from .state_groups import (
    BINDINGS, FIXED_CONV, FIXED_RECURRENT, PAGED_KV, UPDATE_OUTPUT_FIELD, UPDATE_OUTPUT_KEY, StateGroup, StateManifest,
    expand,
)

_TEMPLATE = re.compile(r"^[^%]*%d[^%]*$")  # exactly one %d and no other %


class ConfigRules:
    """ModelStateManifest::ValidateConfig (docs/genai-config.md#config-rules): C1-C17, both forms."""

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
        label, path = label_of(index, group, self.form), f"{GROUPS_PATH}[{index}]"
        if not group.kind:
            self.fail("C2", f"{path}.kind", f"{label} is missing kind",
                      expected="paged_kv | fixed_conv | fixed_recurrent")
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
        count_path = update_path(self.form, index, group.kind, "capture_count")
        if not update.capture_count:
            self.fail("C8", count_path, f"{label} state_update is missing capture_count")
        elif "%" in update.capture_count:
            self.fail("C8", count_path,
                      f"{label} state_update capture_count must be a graph input name, not a template",
                      actual=update.capture_count)
        if "%" in update.active:
            self.fail("C9", update_path(self.form, index, group.kind, "active"),
                      f"{label} state_update active must be a graph input name, not a template",
                      actual=update.active)
        if not self.v3:  # the bindings form's per-kind fields are checked while parsing
            if group.kind == FIXED_CONV and update.key_head_count is not None:
                self.fail("C10", f"{path}.key_head_count",
                          f"{label} fixed_conv state_update does not use key_head_count",
                          actual=update.key_head_count)
            if group.kind == FIXED_RECURRENT and update.key_head_count is None:
                self.fail("C10", f"{path}.key_head_count",
                          f"{label} fixed_recurrent state_update requires key_head_count",
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
            path = (update_path(self.form, index, group.kind, "output") if sem.startswith("state_update")
                    else binding_path(self.form, index, group.kind, sem, side))
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
