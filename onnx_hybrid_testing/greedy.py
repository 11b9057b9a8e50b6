"""A small greedy driver over an exported decoder: prefill, then one token per step, past <- present.

It feeds exactly what onnxruntime-genai feeds a non-paged model (left padding, ``position_ids =
cumsum(mask) - 1`` clipped at 0 on padding, the growing 2-D ``attention_mask``; shared KV buffers of
``max_length`` positions, prompt plus new tokens, when the graph declares them) and reads the graph's
own I/O to know which states exist, so it serves any export of this package. ``genai_driver.greedy_tokens``
is the same job done by onnxruntime-genai itself, the real client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from onnx_hybrid.exporter import io_names as io
from onnx_hybrid.ops import contract

_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32}


PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def make_session(model_dir, op_domain: str, threads: int = 2, provider: str = "cpu", *,
                 filename: str = "model.onnx") -> ort.InferenceSession:
    """A session over ``model_dir/filename`` on ``provider`` (``cpu`` or ``cuda``) with our kernel library
    registered when the model uses our domain."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if provider == "cuda" and hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels, if there
        ort.preload_dlls()
    if op_domain == contract.DOMAIN:
        from onnx_hybrid.ops import library
        library.register(options)
    return ort.InferenceSession(str(Path(model_dir) / filename), options, providers=[PROVIDERS[provider]])


@dataclass
class GreedyResult:
    tokens: list[list[int]]  # generated tokens per prompt (prompt excluded)
    prefill_logits: np.ndarray  # logits of the prefill step as returned ([B, 1 or S, V])
    extra_outputs: list[dict] = field(default_factory=list)  # per step: outputs not fed back (state updates)


class GreedyDriver:
    def __init__(self, session: ort.InferenceSession):
        self.session = session
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self.feedback = {name: io.past_of(name) for name in self.output_names if io.past_of(name)}

    def _empty_states(self, batch: int, max_length: int) -> dict[str, np.ndarray]:
        lengths = {io.BATCH: batch, io.PAST_SEQUENCE: 0, io.KV_BUFFER_LENGTH: max_length}
        states = {}
        for name, meta in self.inputs.items():
            if name in self.feedback.values():
                shape = [lengths.get(d, d) for d in meta.shape]
                states[name] = np.zeros(shape, _NUMPY[meta.type])
        return states

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, capture_count: int = 0,
                 state_update_active: int = 1, static_mask: bool = False) -> GreedyResult:
        """``static_mask`` feeds the mask as onnxruntime-genai does under CUDA graph capture: one [B, max_length]
        mask throughout, ones for the tokens so far and zeros beyond (prompts of one length: no padding)."""
        batch, width = len(prompts), max(len(p) for p in prompts)
        if static_mask and any(len(p) != width for p in prompts):
            raise ValueError("static_mask feeds prompts of one length")
        ids = np.zeros((batch, width), np.int64)
        mask = np.zeros((batch, width), np.int64)
        for row, prompt in enumerate(prompts):  # left padding
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        states = self._empty_states(batch, width + max_new_tokens)
        generated = [[] for _ in prompts]
        result = GreedyResult(generated, None)
        step_ids = ids
        for step in range(max_new_tokens):
            positions = np.cumsum(mask, axis=1) - 1
            fed_mask = mask
            if static_mask:
                fed_mask = np.zeros((batch, width + max_new_tokens), np.int64)
                fed_mask[:, :mask.shape[1]] = mask
            feeds = {io.INPUT_IDS: step_ids, io.ATTENTION_MASK: fed_mask,
                     io.POSITION_IDS: np.maximum(positions[:, -step_ids.shape[1]:], 0), **states}
            if io.STATE_UPDATE_CAPTURE_COUNT in self.inputs:
                feeds[io.STATE_UPDATE_CAPTURE_COUNT] = np.full([batch], capture_count, np.int32)
                feeds[io.STATE_UPDATE_ACTIVE] = np.array([state_update_active], np.int32)
            outs = dict(zip(self.output_names, self.session.run(self.output_names, feeds)))
            logits = outs.pop(io.LOGITS)
            if step == 0:
                result.prefill_logits = logits
            states = {self.feedback[name]: value for name, value in outs.items() if name in self.feedback}
            result.extra_outputs.append({k: v for k, v in outs.items() if k not in self.feedback})
            next_ids = logits[:, -1, :].argmax(-1)
            for row, token in enumerate(next_ids):
                generated[row].append(int(token))
            step_ids = next_ids[:, None].astype(np.int64)
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
        return result
