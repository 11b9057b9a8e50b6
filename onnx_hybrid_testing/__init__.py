"""Helpers of the test suite and the scripts, kept beside the package and not installed with it: random op
cases (``cases``) and single-op models (``single_op``), tiny HF checkpoints (``checkpoints``), full-size synthetic
ones (``synthetic``), greedy drivers over ORT and onnxruntime-genai (``greedy``, ``genai_driver``), the Engine over
a paged export (``engine``), packed-step feeds (``packed``), MTP heads (``mtp``), lossless-replay checks
(``lossless``), decode-graph node counts (``graph_count``) and the end-to-end benchmarks' pieces (``e2e``). Tests
find it through pytest's ``pythonpath``; scripts put the checkout on the path (``scripts/_checkout.py``)."""
