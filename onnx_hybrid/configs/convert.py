"""Lossless conversion of `state_groups` between the released form and the bindings (#2454) form.

Both forms are read into the same :class:`StateManifest` and written back
(docs/genai-config.md#converting-between-the-forms).
Anything one form cannot express is refused with :class:`ConversionError` rather than dropped: groups of
one kind with different templates, a decoder-level capacity that differs from the groups', V2 checkpoint
fields (unless ``drop_checkpoints``), or a bindings-form fixed group with no update kind when no graph is
given to tell conv state (rank 3) from recurrent state (rank 4).
"""

from __future__ import annotations

import copy
import dataclasses

from .findings import Report
from .graph_io import GraphIO
from .parse import GROUPS_PATH, decoder_section, detect_form, parse_state_groups
from .state_groups import (
    FIXED, FIXED_CONV, FIXED_RECURRENT, FORMS, RELEASED, NotExpressible, StateGroup, StateManifest, expand,
    write_state_groups,
)


class ConversionError(ValueError):
    pass


def convert_config(config: dict, to: str, *, graph: GraphIO | None = None, drop_checkpoints: bool = False) -> dict:
    """A copy of ``config`` with its ``state_groups`` in form ``to`` ("released" or "bindings")."""
    if to not in FORMS:
        raise ConversionError(f"target form must be one of {', '.join(FORMS)}, got {to!r}")
    out = copy.deepcopy(config)
    decoder = decoder_section(out)
    source = detect_form(decoder)
    if source is None or source == to:
        return out
    report = Report("genai_config.json", form=source)
    manifest = parse_state_groups(decoder, source, report)
    if not report.ok or manifest is None:
        raise ConversionError("the config does not parse as the " + source + " form:\n"
                              + "\n".join(f.format() for f in report.errors))
    dropped = [f.path for f in report.warnings if f.rule == "parse.v2_checkpoint"]
    if dropped and not drop_checkpoints:
        raise ConversionError("V2 checkpoint fields have no equivalent in the released form: "
                              + ", ".join(dropped) + " (pass drop_checkpoints / --drop-checkpoints to drop them)")
    if to == RELEASED:
        manifest = _resolve_fixed_kinds(manifest, graph)
        # The released form states the capacity once more at decoder level; keep the two equal.
        manifest = dataclasses.replace(manifest, declared_capacity=manifest.capacity or None)
    elif manifest.declared_capacity not in (None, manifest.capacity):
        raise ConversionError(
            f"model.decoder.state_update_capacity is {manifest.declared_capacity} but the groups declare "
            f"{manifest.capacity}; the bindings form has only the groups' capacity")
    try:
        write_state_groups(decoder, manifest, to)
    except NotExpressible as exc:
        raise ConversionError(str(exc)) from None
    return out


def _resolve_fixed_kinds(manifest: StateManifest, graph: GraphIO | None) -> StateManifest:
    """Bindings-form fixed groups without an update kind become fixed_conv or fixed_recurrent by the
    rank of their state tensor in the graph."""
    groups = []
    for index, group in enumerate(manifest.groups):
        if group.kind == FIXED:
            kind = _kind_from_graph(group, graph)
            if kind is None:
                raise ConversionError(
                    f"{GROUPS_PATH}[{index}]: a fixed group without state_update does not say whether it holds "
                    "conv or recurrent state; convert from the export folder so the graph's state rank decides")
            group = StateGroup(kind, group.layer_ids, group.bindings, group.state_update)
        groups.append(group)
    return dataclasses.replace(manifest, groups=tuple(groups))


def _kind_from_graph(group: StateGroup, graph: GraphIO | None) -> str | None:
    binding = group.bindings.get("state")
    if graph is None or binding is None or not group.layer_ids:
        return None
    state = graph.inputs.get(expand(binding.input, group.layer_ids[0]))
    return {3: FIXED_CONV, 4: FIXED_RECURRENT}.get(state.rank if state else None)

