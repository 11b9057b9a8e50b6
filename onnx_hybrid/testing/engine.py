"""onnxruntime-genai 0.18's Engine (dynamic batching) over a paged export, as the tests drive it.

``run_engine`` begins every prompt as a concurrent greedy request before the first step, collects each
request's tokens from the events, and can propose external drafts (``Request.set_draft_tokens``) from a
reference continuation with some drafts deliberately wrong, so verify steps end in full, partial and
zero accepts that the Engine commits by replaying our compact capsules (speculative.md §1.2, §5).
``tamper_capsules`` is the negative control: the same model with every GDN capsule multiplied by zero.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime_genai as og

from ..ops import contract


def set_eos(package: Path, token: int) -> None:
    """Make ``token`` the only EOS and the pad id, so runs that never produce it reach their length."""
    path = Path(package) / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"].update(eos_token_id=[token], pad_token_id=token)
    path.write_text(json.dumps(config, indent=4) + "\n")


def tamper_capsules(package: Path, directory: Path) -> Path:
    """A copy of ``package`` whose GatedDeltaNet capsules are zeroed by a Mul after the op: names, types and
    shapes stay, so the config validates and the Engine loads it, but every replay rebuilds a zero state."""
    shutil.copytree(package, directory)
    model = onnx.load(str(directory / "model.onnx"))
    for node in [n for n in model.graph.node if n.op_type == contract.GATED_DELTA_NET.name]:
        capsule = node.output[2]
        node.output[2] = capsule + ".untampered"
        model.graph.node.append(onnx.helper.make_node("Mul", [node.output[2], "tamper.zero"], [capsule]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros([1], np.float32), "tamper.zero"))
    onnx.save(model, str(directory / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return directory


def proposal(reference: list[int], done: int, capacity: int, round_index: int) -> list[int]:
    """The next ``capacity`` reference tokens; on odd rounds one of them is wrong, at a position that
    cycles through 0..capacity-1, so the accepted lengths cover every histogram bin."""
    drafts = list(reference[done:done + capacity])
    if round_index % 2:
        wrong = (round_index // 2) % capacity
        drafts[wrong] = drafts[wrong] - 1 if drafts[wrong] else 1
    return drafts


@dataclass
class EngineRun:
    tokens: list[list[int]]  # generated tokens per prompt
    stats: dict  # Engine.get_speculative_stats()
    draft_width: int  # Engine.max_draft_tokens_per_proposal(): the export's state_update capacity
    seconds: float  # wall time from the first Engine step to the last


def run_engine(model: Path | og.Model, prompts: list[list[int]], new_tokens: int,
               drafts_from: list[list[int]] | None = None) -> EngineRun:
    """Greedy requests for every prompt on a fresh Engine (its statistics are cumulative) over ``model``
    (an export folder or a loaded ``og.Model``); with ``drafts_from``, each decoding request gets external
    drafts from its reference continuation after every step while more than C + 1 of its tokens remain."""
    engine = og.Engine(model if isinstance(model, og.Model) else og.Model(str(model)))
    capacity = engine.max_draft_tokens_per_proposal()
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        options.set_max_generated_tokens(new_tokens)
        request.begin_turn(np.array(prompt, dtype=np.int32), options)
        requests.append(request)
    tokens: list[list[int]] = [[] for _ in requests]
    rounds = [0] * len(requests)
    events = engine.create_event_buffer(256)
    start = time.perf_counter()
    for _ in range(4 * new_tokens * len(prompts)):  # a bound, so a stuck Engine fails instead of hanging
        if not engine.has_pending_requests():
            break
        engine.run(events)
        for i in range(len(events)):
            event = events[i]
            if event.error_code != og.EngineErrorCode.NONE:
                raise RuntimeError(f"Engine step failed: error {event.error_code}, finish {event.finish_reason}")
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[next(k for k, r in enumerate(requests) if r == event.request)].append(event.token)
        for k, request in enumerate(requests):
            done = len(tokens[k])
            if drafts_from and done and new_tokens - done > capacity:
                drafts = proposal(drafts_from[k], done, capacity, rounds[k])
                request.set_draft_tokens(np.array(drafts, dtype=np.int32))
                rounds[k] += 1
    else:
        raise RuntimeError(f"the Engine still had pending requests after {4 * new_tokens * len(prompts)} steps")
    return EngineRun(tokens, engine.get_speculative_stats(), capacity, time.perf_counter() - start)
