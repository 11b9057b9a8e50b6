"""Feeds for one step of the paged export, as onnxruntime-genai's Engine builds them: requests packed on one
token axis, positions continuing each request's cached length, the block table and the capture inputs,
and the previous step's ``present.*`` fed back as ``past*`` (zeros before the first step)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

from ..exporter import io_names as io


def packed_feeds(graph: onnx.GraphProto, steps: Sequence[Sequence[int]], past: Sequence[int], state: dict | None, *,
                 block_table: np.ndarray, num_blocks: int, capture: Sequence[int] | None = None) -> dict:
    """``steps[b]``: the new tokens of request b after ``past[b]`` cached ones. ``capture``: capture counts
    (default: every token of the step). Only the inputs ``graph`` declares are returned."""
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
        if value.name in feeds:
            out[value.name] = feeds[value.name]
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        pool = value.type.tensor_type.shape.dim[0].dim_param == io.NUM_BLOCKS
        dims[0] = num_blocks if pool else len(steps)  # the KV block pool, or one state row per request
        out[value.name] = state[io.present_of(value.name)] if state else np.zeros(dims, dtype)
    return out
