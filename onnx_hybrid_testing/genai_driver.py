"""onnxruntime-genai as a client of an export, with nothing of onnx_hybrid imported: greedy tokens through
``og.Generator`` and concurrent requests through ``og.Engine`` (dynamic batching, optional external drafts).

Tests import it, and run it as a script in a fresh interpreter (``python genai_driver.py < job.json``) to show
that an export runs on onnxruntime-genai alone: the library named in genai_config.json loads itself and finds
its CUDA kernels beside it. The script reads one JSON job on stdin and prints one JSON result line.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import onnxruntime_genai as og


def greedy_tokens(model: og.Model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The tokens ``og.Generator`` picks greedily after ``prompt``; fewer than ``max_new_tokens`` when it meets
    an EOS or pad id."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + max_new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(prompt):]]


def batch_greedy_tokens(model: og.Model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The tokens one ``og.Generator`` over all ``prompts`` as a batch picks greedily, ``max_new_tokens`` per row.
    The prompts must be of one length: onnxruntime-genai 0.18 feeds a padded batch's pad tokens as tokens (its
    attention mask of an appended batch is all ones)."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError(f"batch prompts must be of one length, got lengths {[len(p) for p in prompts]}")
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, batch_size=len(prompts), max_length=len(prompts[0]) + max_new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(prompts, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)[len(prompts[0]):]] for i in range(len(prompts))]


def forced_logits(model: og.Model, prompt: list[int], tokens: list[int]) -> list[list[float]]:
    """The logits ``og.Generator`` computes before each of ``tokens`` when they are fed one by one after ``prompt``
    (teacher forcing through its decode path): one row per token, float32 values."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + len(tokens) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    rows = []
    for token in tokens:
        logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
        rows.append(logits.reshape(-1, logits.shape[-1])[-1].tolist())
        generator.append_tokens([token])
    return rows


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


def run_engine(model, prompts: list[list[int]], new_tokens: int,
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
                try:
                    request.set_draft_tokens(np.array(drafts, dtype=np.int32))
                except RuntimeError as error:  # the request is between steps (its tokens not yet committed)
                    if "ready to decode" not in str(error):
                        raise
                    continue
                rounds[k] += 1
    else:
        raise RuntimeError(f"the Engine still had pending requests after {4 * new_tokens * len(prompts)} steps")
    return EngineRun(tokens, engine.get_speculative_stats(), capacity, time.perf_counter() - start)


def run_job(job: dict) -> dict:
    """``{"model": folder, "mode": "generator" | "batch" | "engine" | "forced", "prompts": [[...]], "new_tokens": n,
    "drafts_from": [[...]] (engine, optional), "forced": [[...]] (forced), "cuda_graph": bool (optional)}`` ->
    ``{"tokens": [[...]], ...}`` or ``{"logits": [[[...]]]}`` (forced: per prompt, per forced token).
    ``cuda_graph`` (true or false) overrides the decoder's CUDA provider option ``enable_cuda_graph``."""
    config = og.Config(job["model"])
    if job.get("cuda_graph") is not None:
        config.set_provider_option("cuda", "enable_cuda_graph", "1" if job["cuda_graph"] else "0")
    model = og.Model(config)
    if job["mode"] == "generator":
        return {"tokens": [greedy_tokens(model, p, job["new_tokens"]) for p in job["prompts"]]}
    if job["mode"] == "batch":
        return {"tokens": batch_greedy_tokens(model, job["prompts"], job["new_tokens"])}
    if job["mode"] == "forced":
        return {"logits": [forced_logits(model, p, f) for p, f in zip(job["prompts"], job["forced"])]}
    if job["mode"] == "engine":
        return asdict(run_engine(model, job["prompts"], job["new_tokens"], job.get("drafts_from")))
    raise ValueError(f"unknown mode {job['mode']!r}")


if __name__ == "__main__":
    result = run_job(json.loads(sys.stdin.read()))
    result["onnx_hybrid_imported"] = any(name.split(".")[0] == "onnx_hybrid" for name in sys.modules)
    print(json.dumps(result))
