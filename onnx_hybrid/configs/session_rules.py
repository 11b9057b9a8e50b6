"""Session-time rules: what ``og.Model`` checks against the decoder graph (docs/genai-config.md#session-rules)."""

from __future__ import annotations

import re
from typing import Iterator

from ..ops.contract import GATED_DELTA_NET, VARLEN_CAUSAL_CONV, conv_capsule_shape, gdn_capsule_width
from .findings import SESSION, Finding, Report
from .graph_io import GraphIO, TensorInfo
from .locations import binding_path, label_of, update_path
from .parse import GROUPS_PATH
from .state_groups import (
    FIXED, FIXED_CONV, FIXED_RECURRENT, KIND_BINDINGS, PAGED_KV, UPDATE_OUTPUT_KEY, StateGroup, StateManifest, expand,
)


def _compatible(a: int, b: int) -> bool:
    return a < 0 or b < 0 or a == b


class SessionRules:
    """ModelStateManifest::ValidateSession (docs/genai-config.md#session-rules): S1-S9 against the declared graph I/O,
    plus x.op_capacity and x.unbound_state."""

    def __init__(self, report: Report, manifest: StateManifest, form: str, graph: GraphIO):
        self.report, self.manifest, self.form, self.graph = report, manifest, form, graph

    def fail(self, rule: str, path: str, message: str, **kw) -> None:
        self.report.add(Finding(rule, SESSION, path, message, **kw))

    def run(self) -> None:
        for index, group in enumerate(self.manifest.groups):
            if group.kind not in KIND_BINDINGS and group.kind != FIXED:
                continue
            label = label_of(index, group, self.form)
            states = self.bindings(index, group, label)
            if group.kind == PAGED_KV:
                self.paged(label, index, states)
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
                        self.fail("S1", binding_path(self.form, index, group.kind, sem, side),
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
                              f"{x.runtime_dims()} and output '{y.name}' {y.runtime_dims()}", tensor=y.name,
                              expected=x.describe(), actual=y.describe())
                pairs.append((x, y))
        return pairs

    def paged(self, label: str, index: int, pairs: list) -> None:
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
                self.fail("S4", path, f"{label} has incompatible paged geometry between '{a.name}' {a.runtime_dims()} "
                          f"and '{t.name}' {t.runtime_dims()}", tensor=t.name, expected=a.describe(),
                          actual=t.describe())

    def update(self, index: int, group: StateGroup, label: str, pairs: list) -> None:
        update = group.state_update
        states = [y for _, y in pairs]
        count_path = update_path(self.form, index, group.kind, "capture_count")
        count = self.graph.inputs.get(update.capture_count)
        if count is None:
            self.fail("S5", count_path, f"{label} state_update capture_count input was not found: "
                      f"{update.capture_count}", tensor=update.capture_count, expected="int32 [batch]",
                      actual="absent")
        else:
            self.capture_count(count, label, count_path, states)
        if update.active:
            self.active(update.active, label, update_path(self.form, index, group.kind, "active"))
        rank = {FIXED_CONV: 3, FIXED_RECURRENT: 4}.get(group.kind)
        for state in states:
            if rank is not None and state.rank != rank:
                self.fail("S7", f"{GROUPS_PATH}[{index}].layer_ids",
                          f"{label} state output '{state.name}' must have rank {rank}, got {state.rank}",
                          tensor=state.name, expected=f"rank {rank}", actual=state.describe())
        if group.kind not in UPDATE_OUTPUT_KEY:
            return
        out_path = update_path(self.form, index, group.kind, "output")
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
