"""Helpers shared by the test suite and scripts: tiny HF checkpoints (``checkpoints``), full-size synthetic
ones (``synthetic``), greedy drivers over ORT and onnxruntime-genai (``greedy``), the Engine over a paged
export (``engine``), packed-step feeds (``packed``) and MTP heads (``mtp``)."""
