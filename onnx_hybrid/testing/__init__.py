"""Helpers shared by the test suite and scripts: tiny HF checkpoints (``checkpoints``), full-size synthetic
ones (``synthetic``), greedy drivers over ORT and onnxruntime-genai (``greedy``), the Engine over a paged
export (``engine``), packed-step feeds (``packed``), MTP heads (``mtp``) and the end-to-end benchmarks'
pieces (``e2e``)."""
