"""Puts this checkout's root first on the import path: the scripts use the test and benchmark helpers of
``onnx_hybrid_testing``, which live beside the package and are not installed with it."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
