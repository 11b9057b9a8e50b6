"""Atomic output folders: build in a temporary sibling, move into place only when complete."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from .errors import ExportError


@contextlib.contextmanager
def staged_output(out_dir: Path, overwrite: bool):
    """Yield a temporary folder next to ``out_dir``; on success it replaces ``out_dir``.

    On any failure the temporary folder is removed and ``out_dir`` is left as it was.
    """
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not overwrite:
        raise ExportError(f"{out_dir} already exists; pass --overwrite (overwrite=True) to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
    try:
        yield staging
        if out_dir.exists():
            backup = staging.with_suffix(".old")
            out_dir.rename(backup)
            try:
                staging.rename(out_dir)
            except BaseException:
                backup.rename(out_dir)  # put the old output back rather than leave neither
                raise
            if backup.is_dir():
                shutil.rmtree(backup)
            else:
                backup.unlink()
        else:
            staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
