"""Feeds for one step of the paged export, as onnxruntime-genai's Engine builds them: requests packed on one
token axis, positions continuing each request's cached length, the block table and the capture inputs,
and the previous step's ``present.*`` fed back as ``past*`` (zeros before the first step); and
:func:`paged_greedy`, a greedy driver over those feeds (one packed prefill, then one token per request per step,
the KV pools bound in place on the session's device)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np
import onnx

from onnx_hybrid.exporter import io_names as io


def packed_feeds(graph: onnx.GraphProto, steps: Sequence[Sequence[int]], past: Sequence[int], state: dict | None, *,
                 block_table: np.ndarray, num_blocks: int, capture: Sequence[int] | None = None,
                 bound: Collection[str] = ()) -> dict:
    """``steps[b]``: the new tokens of request b after ``past[b]`` cached ones. ``capture``: capture counts
    (default: every token of the step). Only the inputs ``graph`` declares are returned, less ``bound``
    (inputs the caller binds itself, such as the pools kept on the device)."""
    lengths = [len(s) for s in steps]
    feeds = {
        io.INPUT_IDS: np.array([t for s in steps for t in s], dtype=np.int64),
        io.POSITION_IDS: np.concatenate([np.arange(p, p + n) for p, n in zip(past, lengths)]).astype(np.int64),
        io.CUMULATIVE_SEQUENCE_LENGTHS: np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        io.PAST_SEQUENCE_LENGTHS: np.array(past, dtype=np.int32),
        io.BLOCK_TABLE: np.asarray(block_table, dtype=np.int32),
        io.ATTENTION_METADATA: np.array([max(lengths), max(p + n for p, n in zip(past, lengths)), 0], np.int32),
        io.STATE_UPDATE_CAPTURE_COUNT: np.array(lengths if capture is None else capture, dtype=np.int32),
        io.STATE_UPDATE_ACTIVE: np.array([1], dtype=np.int32),
    }
    out = {}
    for value in graph.input:
        if value.name in bound:
            continue
        if value.name in feeds:
            out[value.name] = feeds[value.name]
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dims[0] = num_blocks if _is_pool(value) else len(steps)  # the KV block pool, or one state row per request
        out[value.name] = state[io.present_of(value.name)] if state else np.zeros(dims, dtype)
    return out


def _is_pool(value: onnx.ValueInfoProto) -> bool:
    dims = value.type.tensor_type.shape.dim
    return bool(dims) and dims[0].dim_param == io.NUM_BLOCKS


def pool_block_size(graph: onnx.GraphProto) -> int:
    """The static block size of the export's KV pools ``[num_blocks, block_size, Hkv, D]``."""
    for value in graph.input:
        if _is_pool(value):
            return value.type.tensor_type.shape.dim[1].dim_value
    raise ValueError("the graph has no paged KV input (first dimension num_blocks): not a paged export")


def interleaved_block_table(lengths: Sequence[int], block_size: int) -> tuple[np.ndarray, int]:
    """A block table for requests of ``lengths`` tokens each, and the pool size it needs. Blocks are dealt
    round-robin over the requests from the top of the pool down, so no request owns consecutive or
    identity-mapped blocks and a kernel that misreads the table writes or reads another request's KV."""
    need = [-(-n // block_size) for n in lengths]
    table = np.zeros((len(lengths), max(need)), np.int32)  # unused entries are never read
    next_block = sum(need) - 1
    for j in range(max(need)):
        for b, count in enumerate(need):
            if j < count:
                table[b, j], next_block = next_block, next_block - 1
    return table, sum(need)


@dataclass
class PagedGreedyResult:
    tokens: list[list[int]]  # generated tokens per request (prompt excluded)
    prefill_logits: np.ndarray  # [num_tokens, V]: every packed token of the prefill step
    last_prefill_logits: np.ndarray  # [B, V]: each request's last prompt token (what picks its first token)
    block_table: np.ndarray


def paged_greedy(session, graph: onnx.GraphProto, prompts: Sequence[Sequence[int]],
                 max_new_tokens: int) -> PagedGreedyResult:
    """Greedy decoding of ``prompts`` together through a paged export's ``session`` (``graph``: its graph,
    for the declared inputs): one packed prefill step, then one token per request per step, the conv and
    recurrent ``present.*`` fed back as the next step's ``past.*``.

    The KV pools stay on the session's device and each is bound as both its ``past_key_values.*`` input and
    its ``present.*`` output, updated in place as the Engine binds them: ORT's CUDA PagedAttention requires
    that aliasing (a distinct output buffer is not filled)."""
    import onnxruntime as ort

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    table, num_blocks = interleaved_block_table([len(p) + max_new_tokens for p in prompts], pool_block_size(graph))
    device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    names = [o.name for o in session.get_outputs()]
    steps, past, state = [list(p) for p in prompts], [0] * len(prompts), None
    tokens = [[] for _ in prompts]
    zeros = packed_feeds(graph, steps, past, None, block_table=table, num_blocks=num_blocks)
    pools = {value.name: ort.OrtValue.ortvalue_from_numpy(zeros[value.name], device, 0)
             for value in graph.input if _is_pool(value)}
    in_place = {name: pools[io.past_of(name)] for name in names if io.past_of(name) in pools}  # present -> pool
    result = None
    for _ in range(max_new_tokens):
        feeds = packed_feeds(graph, steps, past, state, block_table=table, num_blocks=num_blocks, bound=pools)
        binding = session.io_binding()
        for name, pool in pools.items():
            binding.bind_ortvalue_input(name, pool)
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in names:
            if name in in_place:
                binding.bind_ortvalue_output(name, in_place[name])
            else:
                binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        state = {name: value for name, value in zip(names, binding.copy_outputs_to_cpu()) if name not in in_place}
        last_rows = feeds[io.CUMULATIVE_SEQUENCE_LENGTHS][1:] - 1
        logits = state[io.LOGITS]
        if result is None:
            result = PagedGreedyResult(tokens, logits, logits[last_rows], table)
        next_ids = logits[last_rows].argmax(-1)
        for row, token in enumerate(next_ids):
            tokens[row].append(int(token))
        past = [p + len(s) for p, s in zip(past, steps)]
        steps = [[int(t)] for t in next_ids]
    return result
