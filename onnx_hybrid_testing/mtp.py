"""MTP heads for test and benchmark checkpoints (Hugging Face drops ``mtp.*`` on save; we add it back).

* :func:`add_mtp_head` writes ``mtp.*`` tensors into an existing checkpoint folder as one more safetensors
  file (listed in the index when the checkpoint is sharded) and declares ``mtp_num_hidden_layers: 1``. The
  head's decoder layer copies the tensor names and shapes of the checkpoint's first full-attention layer, so
  it is dense or MoE exactly as the main layers are.
* :func:`fit_drafting_head` builds a head that drafts well from the main model's own greedy runs: with the
  layer's ``o_proj`` and ``down_proj`` zeroed (every expert's and the shared expert's too) the layer is the
  identity through its residual, the pre-fc norms are scale 1 and ``mtp.norm`` is the main final norm, so
  ``logits = lm_head(final_norm(fc · [norm(embed(t_{i+1})); norm(h_i)]))``. ``fc`` is then the least-squares
  map from those features to the main model's own next normalised hidden ``h_{i+1} / (1 + w_final)``: the
  head drafts what the main model would say next wherever that is linear enough in (token, hidden).
* :func:`reference_head` is the head's math in float64 NumPy (docs/model.md#mtp-head), dense heads, one
  sequence, empty KV cache.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from onnx_hybrid.exporter.checkpoint import Checkpoint
from onnx_hybrid.exporter.model_config import FULL, load_model_config

MTP_FILE = "model-mtp.safetensors"
_ZEROED = re.compile(r"(self_attn\.o_proj|down_proj)")  # residual-branch outputs of the head's layer
_STORED = {"BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16), "F32": np.dtype(np.float32)}


def mtp_shapes(model_dir) -> tuple[dict[str, tuple[int, ...]], np.dtype]:
    """Every ``mtp.*`` tensor a one-layer head of this checkpoint has, and the checkpoint's weight dtype."""
    cfg = load_model_config(model_dir)
    checkpoint = Checkpoint(model_dir)
    layer = f"model.layers.{cfg.layer_types.index(FULL)}."
    h = cfg.hidden_size
    shapes = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
              "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    for name, stored in checkpoint.tensors.items():
        if name.startswith(layer):
            shapes["mtp.layers.0." + name[len(layer):]] = stored.shape
    dtype = _STORED[checkpoint.get("model.embed_tokens.weight").dtype]
    return shapes, dtype


def random_mtp_tensors(model_dir, seed: int = 0) -> dict[str, np.ndarray]:
    """A random head (zero-centred norms randomised, matrices scaled by 1/sqrt(fan_in))."""
    shapes, dtype = mtp_shapes(model_dir)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            value = 0.3 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[-1])
        tensors[name] = value.astype(dtype)
    return tensors


def add_mtp_head(model_dir, tensors: dict[str, np.ndarray]) -> Path:
    """Write (or replace) the checkpoint's ``mtp.*`` tensors and declare one MTP layer in config.json."""
    model_dir = Path(model_dir)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, model_dir / MTP_FILE,
              metadata={"format": "pt"})
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if not k.startswith("mtp.")}
        data["weight_map"].update({name: MTP_FILE for name in tensors})
        index.write_text(json.dumps(data, indent=1))
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    (config.get("text_config") or config)["mtp_num_hidden_layers"] = 1
    config_path.write_text(json.dumps(config, indent=1))
    return model_dir


def greedy_runs(export_dir, prompts: list[list[int]], new_tokens: int, op_domain: str, threads: int = 2
                ) -> list[tuple[list[int], np.ndarray]]:
    """(prompt + greedy tokens, post-norm hidden per fed position) of each prompt, through the ORT export
    (which must output ``hidden_states``: an MTP export)."""
    from onnx_hybrid.exporter import io_names as io
    from .greedy import GreedyDriver, make_session

    driver = GreedyDriver(make_session(export_dir, op_domain, threads))
    runs = []
    for prompt in prompts:
        result = driver.generate([prompt], new_tokens)
        hidden = np.concatenate([step[io.HIDDEN_STATES][0] for step in result.extra_outputs])
        runs.append((list(prompt) + result.tokens[0], hidden))
    return runs


def _rms_normalise(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def fit_drafting_head(model_dir, sequences: list[tuple[list[int], np.ndarray]], *, ridge: float = 1e-3,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """Head tensors fitted to ``sequences``: (tokens t_0..t_n, post-norm hiddens h_0..h_m) pairs from the main
    model's own greedy runs (h_i is the hidden at position i, m < n). Returns the tensors; see the module doc."""
    cfg = load_model_config(model_dir)
    checkpoint = Checkpoint(model_dir)
    eps = cfg.rms_norm_eps
    final_norm = checkpoint.read("model.norm.weight")
    final_scale = 1.0 + final_norm.astype(np.float64)
    features, targets = [], []
    for tokens, hidden in sequences:
        hidden = hidden.astype(np.float64)
        rows = len(hidden) - 1
        next_tokens = np.asarray(tokens[1:rows + 1])
        embedded = checkpoint.read("model.embed_tokens.weight", (next_tokens,))  # the rows, in one mapping
        features.append(np.concatenate([_rms_normalise(embedded.astype(np.float64), eps),
                                        _rms_normalise(hidden[:rows], eps)], axis=1))
        targets.append(hidden[1:rows + 1] / final_scale)
    x, y = np.concatenate(features), np.concatenate(targets)
    # Ridge-regularised normal equations: fc^T = (X^T X + r n I)^-1 X^T Y.
    gram = x.T @ x + ridge * len(x) * np.eye(x.shape[1])
    fc = np.linalg.solve(gram, x.T @ y).T  # [H, 2H]

    tensors = random_mtp_tensors(model_dir, seed)
    dtype = tensors["mtp.fc.weight"].dtype
    for name in tensors:
        if _ZEROED.search(name):
            tensors[name] = np.zeros_like(tensors[name])
    tensors["mtp.fc.weight"] = fc.astype(dtype)
    tensors["mtp.pre_fc_norm_embedding.weight"] = np.zeros(cfg.hidden_size, dtype)
    tensors["mtp.pre_fc_norm_hidden.weight"] = np.zeros(cfg.hidden_size, dtype)
    tensors["mtp.norm.weight"] = final_norm.astype(dtype)
    return tensors


def reference_head(model_dir, tokens: np.ndarray, hidden: np.ndarray, positions: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(logits [S, V], hidden_out [S, H]) of a dense head for one sequence with an empty cache, in float64."""
    cfg = load_model_config(model_dir)
    ck = Checkpoint(model_dir)

    def w(name):
        return ck.read(name).astype(np.float64)

    def norm(x, name):
        return _rms_normalise(x, cfg.rms_norm_eps) * (1.0 + w(name))

    embed = w("model.embed_tokens.weight")
    x = np.concatenate([norm(embed[tokens], "mtp.pre_fc_norm_embedding.weight"),
                        norm(hidden.astype(np.float64), "mtp.pre_fc_norm_hidden.weight")], axis=1) @ w("mtp.fc.weight").T
    p = "mtp.layers.0."
    hq, hkv, d, r = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim
    s = len(tokens)
    a = norm(x, p + "input_layernorm.weight")
    qg = (a @ w(p + "self_attn.q_proj.weight").T).reshape(s, hq, 2 * d)
    q, gate = qg[..., :d], qg[..., d:]
    k = (a @ w(p + "self_attn.k_proj.weight").T).reshape(s, hkv, d)
    v = (a @ w(p + "self_attn.v_proj.weight").T).reshape(s, hkv, d)
    q, k = norm(q, p + "self_attn.q_norm.weight"), norm(k, p + "self_attn.k_norm.weight")
    inv_freq = cfg.rope_theta ** (-np.arange(0, r, 2) / r)
    angles = positions[:, None].astype(np.float64) * inv_freq
    cos, sin = np.cos(np.concatenate([angles, angles], 1))[:, None], np.sin(np.concatenate([angles, angles], 1))[:, None]

    def rope(t):
        rot, rest = t[..., :r], t[..., r:]
        rotated = np.concatenate([-rot[..., r // 2:], rot[..., :r // 2]], -1)
        return np.concatenate([rot * cos + rotated * sin, rest], -1)

    q, k = rope(q), rope(k)
    out = np.zeros((s, hq, d))
    for head in range(hq):
        kv = head // (hq // hkv)
        scores = q[:, head] @ k[:, kv].T / np.sqrt(d) + np.triu(np.full((s, s), -np.inf), 1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, kv]
    out = out * (1 / (1 + np.exp(-gate)))
    x = x + out.reshape(s, hq * d) @ w(p + "self_attn.o_proj.weight").T
    m = norm(x, p + "post_attention_layernorm.weight")
    g, u = m @ w(p + "mlp.gate_proj.weight").T, m @ w(p + "mlp.up_proj.weight").T
    x = x + (g / (1 + np.exp(-g)) * u) @ w(p + "mlp.down_proj.weight").T
    h_out = norm(x, "mtp.norm.weight")
    lm_head = embed if cfg.tie_word_embeddings else w("lm_head.weight")
    return h_out @ lm_head.T, h_out
