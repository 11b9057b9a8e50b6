"""The default size of a paged export's KV block pool (``engine.dynamic_batching.num_blocks``).

Without ``num_blocks``, onnxruntime-genai 0.18's Engine sizes the pool from the GPU's free memory
(``gpu_utilization_factor``); on CPU that budget is empty and og.Engine fails with ``The key-value cache
budget is too small to hold the reserved decoder state.`` With ``num_blocks`` it allocates exactly that
many blocks, any count from 1 up (measured), and a request may then hold ``num_blocks * block_size`` tokens,
capped by the context length. An Engine-hosted MTP head takes its share of the same blocks, in proportion
to its KV bytes (measured: one main and one head attention layer leave the main model half the blocks).

So a pool for our (CPU) PagedAttention gets a default: room for :data:`DEFAULT_POOL_REQUESTS`
full-context requests, at most :data:`DEFAULT_POOL_BYTES` of keys and values. A pool written by ORT's CUDA
kernel (com.microsoft) is sized by the runtime from :data:`GPU_KV_CACHE_FRACTION` of the GPU's free memory, which
0.18 has no usable default for (without it the budget is zero, measured on CPU and on an H100).
"""

from __future__ import annotations

from ..configs.genai_config import PagedCache
from ..ops import contract
from .model_config import ModelConfig

DEFAULT_POOL_REQUESTS = 4
DEFAULT_POOL_BYTES = 4 << 30  # 4 GiB
# The share of the GPU memory free once the model is loaded (after og's own 0.9 fragmentation allowance) that a
# runtime-sized pool may take; the rest is left to activations.
GPU_KV_CACHE_FRACTION = 0.5


def pool_num_blocks(num_blocks: int | None, cfg: ModelConfig, *, block_size: int, kernel: str, itemsize: int,
                    head_layers: int = 0) -> int | None:
    """``num_blocks`` when given; else the default for our kernel (``itemsize``: bytes of a pool element;
    ``head_layers``: attention layers of an MTP head sharing the pool), None for ORT's CUDA kernel."""
    if num_blocks is not None or kernel != contract.DOMAIN:
        return num_blocks
    main_layers = max(1, cfg.num_layers - len(cfg.linear_layers))
    layer_block = 2 * block_size * cfg.num_kv_heads * cfg.head_dim * itemsize  # keys and values of one layer
    per_request = -(-cfg.max_position_embeddings // block_size)
    # The main model's blocks for the requests, plus the head's proportional share of the pool.
    wanted = -(-DEFAULT_POOL_REQUESTS * per_request * (main_layers + head_layers) // main_layers)
    affordable = DEFAULT_POOL_BYTES // (layer_block * (main_layers + head_layers))
    return max(1 + (head_layers > 0), min(wanted, affordable))


def paged_cache(block_size: int, num_blocks: int | None) -> PagedCache:
    """``engine.dynamic_batching`` of a paged export: ``num_blocks`` (given, or :func:`pool_num_blocks`' default
    for our kernel), else a pool the runtime sizes from :data:`GPU_KV_CACHE_FRACTION` of the GPU's free memory."""
    if num_blocks is None:
        return PagedCache(block_size, gpu_utilization_factor=GPU_KV_CACHE_FRACTION)
    return PagedCache(block_size, num_blocks)
