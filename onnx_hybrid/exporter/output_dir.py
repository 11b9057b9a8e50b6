"""Atomic output folders: build in a temporary sibling, move into place only when complete.

The staging folder ``.{name}.XXXXXXXX.partial`` and, while an existing output is being replaced, its backup
``.{name}.XXXXXXXX.old`` sit beside the output. Each carries a marker file with the writer's host and pid,
so that a later export to the same output can tell its own leftovers (a killed writer) from a running
export's folders and from a user's folder that merely looks alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from .errors import ExportError

log = logging.getLogger("onnx_hybrid.exporter")

MARKER = ".onnx-hybrid-staging"
STAGING, BACKUP = ".partial", ".old"


def check_target(out_dir: Path, overwrite: bool, protect=()) -> None:
    """Refuse an output that would destroy ``protect`` (the input checkpoint), or replace one without ``overwrite``.

    The output may not be, contain or lie inside a protected folder, nor contain a file that the folder's
    entries resolve to (a checkpoint of symlinks into a cache); paths are compared with symlinks resolved.
    """
    refuse_overlap(out_dir, protect)
    if Path(out_dir).exists() and not overwrite:
        raise ExportError(f"{out_dir} already exists; pass --overwrite (overwrite=True) to replace it")


def refuse_overlap(out_dir: Path, protect) -> None:
    target = Path(out_dir).resolve()
    for source in map(Path, protect):
        folder = source.resolve()
        if target == folder or folder.is_relative_to(target) or target.is_relative_to(folder):
            relation = ("is" if target == folder else "contains" if folder.is_relative_to(target)
                        else "lies inside")
            raise ExportError(f"output {out_dir} {relation} the input checkpoint {source} ({folder}); "
                              f"choose an output folder outside it")
        entries = folder.iterdir() if folder.is_dir() else ()
        for entry in entries:
            if entry.resolve().is_relative_to(target):
                raise ExportError(f"output {out_dir} contains {entry.resolve()}, which the input checkpoint's "
                                  f"{entry} points to; choose an output folder outside it")


@contextlib.contextmanager
def staged_output(out_dir: Path, overwrite: bool, protect=()):
    """Yield a temporary folder next to ``out_dir``; on success it replaces ``out_dir``.

    On any failure (a signal turned into an exception included) the temporary folder is removed and
    ``out_dir`` is left as it was. ``protect``: folders the output must not touch (see :func:`check_target`).
    OSErrors about files in the temporary folder are re-raised naming the same files under ``out_dir``.
    """
    out_dir = Path(out_dir).absolute()
    refuse_overlap(out_dir, protect)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out_dir)  # may restore the output of an interrupted swap, hence before the check
    check_target(out_dir, overwrite, protect)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=STAGING, dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary folder
        _mark(staging)
        try:
            yield staging
        except OSError as error:
            renamed = _renamed(error, staging, out_dir)
            if renamed is error:
                raise
            raise renamed from None
        if out_dir.exists() or out_dir.is_symlink():
            backup = staging.with_suffix(BACKUP)
            folder = out_dir.is_dir() and not out_dir.is_symlink()  # a link or file is replaced, not emptied
            out_dir.rename(backup)
            try:
                if folder:
                    _mark(backup)
                (staging / MARKER).unlink()
                staging.rename(out_dir)
            except BaseException:
                if folder:
                    _unmark(backup)
                backup.rename(out_dir)  # put the old output back rather than leave neither
                raise
            if folder:
                _remove(backup)
            else:
                backup.unlink()
        else:
            (staging / MARKER).unlink()
            staging.rename(out_dir)
    finally:
        if staging.exists():
            _remove(staging)


def remove_leftovers(out_dir: Path) -> None:
    """Remove what killed exports to ``out_dir`` left beside it; restore an output whose swap they interrupted.

    A folder counts as a leftover only if it has this module's exact name pattern and a marker (its own
    or its pair's: ``.partial`` and ``.old`` of one export share the random part) written on this host by
    a process that no longer runs. Anything else that matches the pattern is only mentioned.
    """
    pattern = re.compile(rf"\.{re.escape(out_dir.name)}\.([a-z0-9_]{{8}})({re.escape(STAGING)}|{re.escape(BACKUP)})")
    found: dict[str, dict[str, Path]] = {}
    for entry in out_dir.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found.setdefault(match.group(1), {})[match.group(2)] = entry
    for pair in found.values():
        owners = [_owner(path) for path in pair.values()]
        owner = next((o for o in owners if o is not None), None)
        if owner is None or owner["host"] != socket.gethostname():
            for path in pair.values():
                log.warning("leaving %s: it looks like an export's temporary folder, but no marker of an "
                            "export on this host says so; remove it if it is not needed", path)
            continue
        if _alive(owner["pid"]):
            log.warning("leaving %s: export process %d is still writing it", ", ".join(map(str, pair.values())),
                     owner["pid"])
            continue
        backup = pair.get(BACKUP)
        if backup is not None and not out_dir.exists():
            _unmark(backup)
            backup.rename(out_dir)
            log.warning("restored %s from %s: the export (pid %d) that was replacing it was killed mid-swap",
                        out_dir, backup, owner["pid"])
        for path in pair.values():
            if path.exists():
                _remove(path)
                log.warning("removed %s, left by a killed export (pid %d) to %s", path, owner["pid"], out_dir)


def _mark(folder: Path) -> None:
    (folder / MARKER).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")


def _unmark(folder: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (folder / MARKER).unlink()


def _owner(folder: Path) -> dict | None:
    try:
        owner = json.loads((folder / MARKER).read_text())
        return owner if isinstance(owner.get("pid"), int) and isinstance(owner.get("host"), str) else None
    except (OSError, ValueError, AttributeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(folder: Path) -> None:
    """Delete ``folder`` with its marker last, so that a kill mid-way leaves it still recognisable."""
    for entry in folder.iterdir():
        if entry.name == MARKER:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    _unmark(folder)
    folder.rmdir()


def _renamed(error: OSError, staging: Path, out_dir: Path) -> OSError:
    """``error`` naming files under ``out_dir`` (what the user asked for) instead of the staging folder."""
    def rename(name):
        if name is None:
            return None
        path = Path(os.fsdecode(name))
        return str(out_dir / path.relative_to(staging)) if path.is_relative_to(staging) else name

    first, second = rename(error.filename), rename(error.filename2)
    if (first, second) == (error.filename, error.filename2):
        return error
    renamed = type(error)(error.errno, error.strerror, first, None, second)
    return renamed.with_traceback(error.__traceback__)
