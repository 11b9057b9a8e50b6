"""Hugging Face hybrid checkpoints (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) to ONNX, without torch.

The package imports neither torch nor transformers: config.json is read as JSON and weights are
streamed from safetensors (see ``checkpoint`` and ``weights``).
"""

from .errors import ExportError
from .export import export
from .model_config import SUPPORTED_ARCHITECTURES

__all__ = ["ExportError", "SUPPORTED_ARCHITECTURES", "export"]
