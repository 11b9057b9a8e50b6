"""onnx-hybrid: hybrid linear-attention LLMs (Gated DeltaNet + gated attention) in ONNX Runtime."""

__version__ = "0.1.0"
