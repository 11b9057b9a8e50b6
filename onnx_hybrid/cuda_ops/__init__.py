"""CUDA kernels for GatedDeltaNet and VarlenCausalConvWithState, compiled from CUDA C with NVRTC (CuPy).

* ``compiler``: NVRTC compilation of ``ops/native/cuda/kernels/`` into one cubin per architecture, cached on disk; works
  without a GPU.
* ``plan``: launch configuration (grid, block, shared memory, parameter structs) of every kernel.
* ``api``: the operators on GPU arrays with the contract's semantics, plus the capsule replays.
"""

from .api import gated_delta_net, replay_conv, replay_gdn, varlen_causal_conv
from .compiler import compile_image

__all__ = ["compile_image", "gated_delta_net", "replay_conv", "replay_gdn", "varlen_causal_conv"]
