"""CUDA kernels for GatedDeltaNet and VarlenCausalConvWithState, compiled from CUDA C with NVRTC (CuPy).

* ``compiler``: NVRTC compilation of ``ops/native/cuda/kernels/`` into one cubin per architecture, cached on disk; works
  without a GPU.
* ``api``: the operators on GPU arrays with the contract's semantics, plus the capsule replays, launched by the
  custom-op library's C entry points: the planner and launcher ORT sessions use (ops/native/cuda/), with the launch
  configuration the kernels compile against (ops/native/cuda/kernels/launch_config.h).
"""

from .api import (BoundCall, PlanError, bind_gated_delta_net, bind_varlen_causal_conv, gated_delta_net,
                  gdn_workspace_bytes, replay_conv, replay_gdn, varlen_causal_conv)
from .compiler import compile_image

__all__ = ["BoundCall", "PlanError", "bind_gated_delta_net", "bind_varlen_causal_conv", "compile_image",
           "gated_delta_net", "gdn_workspace_bytes", "replay_conv", "replay_gdn", "varlen_causal_conv"]
