"""CUDA kernels for GatedDeltaNet and VarlenCausalConvWithState, compiled from CUDA C with NVRTC (CuPy).

* ``compiler``: NVRTC compilation of ``ops/native/cuda/kernels/`` into one cubin per architecture, cached on disk; works
  without a GPU.
* ``api``: the operators on GPU arrays with the contract's semantics, plus the capsule replays, launched by the
  custom-op library's C entry points (the launch path ORT sessions take).
* ``plan``: the launch constants the library's planner is generated from, and a Python model of its plans.
"""

from .api import PlanError, gated_delta_net, gdn_workspace_bytes, replay_conv, replay_gdn, varlen_causal_conv
from .compiler import compile_image

__all__ = ["PlanError", "compile_image", "gated_delta_net", "gdn_workspace_bytes", "replay_conv", "replay_gdn",
           "varlen_causal_conv"]
