"""JSON Lines: the one way the kit stores rows.

Rows are appended and made durable (fsync) the moment they exist, so an interrupted run loses at
most the row in flight; reading skips a last line cut off by such an interruption; a rerun resumes
by looking up which keys of its configuration (`run_id`) the file already holds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path


def config_hash(config: Mapping) -> str:
    """A short, stable id of a configuration: rows written with other settings never mix."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def append(path: str | Path, row: Mapping) -> None:
    """Append one row and make it durable before going on (a crash loses at most the next one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(row, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read(path: str | Path) -> list[dict]:
    """Every complete row of a file ([] when it does not exist); a cut-off line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with path.open() as handle:
        for line in handle:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def rows_of_run(path: str | Path, run_id: str) -> list[dict]:
    """The rows one configuration wrote."""
    return [row for row in read(path) if row.get("run_id") == run_id]


def done(path: str | Path, run_id: str, key: Callable[[dict], Hashable]) -> dict:
    """key(row) -> row for the rows this configuration already wrote: what a resumed run skips."""
    return {key(row): row for row in rows_of_run(path, run_id)}


def rewrite(path: str | Path, rows: list[Mapping]) -> None:
    """Replace a file's rows (e.g. a loss log cut back to the checkpoint a run resumes from)."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    partial.replace(path)
