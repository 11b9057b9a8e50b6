"""Modules the tests load by file path: the repository's scripts (not a package) and build-time files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_file(relative: str, name: str):
    """The module at ``ROOT / relative``, registered in sys.modules as ``name`` (dataclasses look it up there).
    Its folder goes on the import path, as for a script run by path (scripts import their neighbours)."""
    folder = str((ROOT / relative).parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
