"""Machine-readable benchmark results: every script's ``--json PATH`` writes its table's rows with where they
came from (UTC date, git commit of the checkout, device, command line), so tables in docs/ can be regenerated
and compared."""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(device: str, argv: list[str] | None = None) -> dict:
    """Date (UTC), commit, device and the command that produced a result (``argv``: the script's arguments, by
    default this process's)."""
    arguments = sys.argv[1:] if argv is None else argv
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(), "device": device,
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *arguments])}


def write_json(path: Path | str | None, benchmark: str, device: str, rows: list[dict], **extra) -> None:
    """Write ``{"benchmark", "date", "commit", "device", "command", ..., "rows"}`` to ``path`` (nothing when
    ``path`` is None)."""
    if path is None:
        return
    Path(path).write_text(json.dumps({"benchmark": benchmark, **provenance(device), **extra, "rows": rows},
                                     indent=1) + "\n")
