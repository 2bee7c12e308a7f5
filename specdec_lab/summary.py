"""Collect what the notebooks wrote into one table of every method: the summary notebook reads
these files and never re-runs an experiment.

Each experiment notebook calls `write(results_dir, notebook, table)` with its `metrics.summary`
table (one line per method, speedups measured against that notebook's own AR baseline, side by side).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specdec_lab import params

COLUMNS = ["speedup", "tokens_per_second", "tokens_per_target_forward", "agreement", "full_match_rate",
           "acceptance_rate", "peak_memory_mb"]
NOT_LOSSLESS_MARKERS = ("not lossless", "draft-then-score")


def is_lossless(method: str) -> bool:
    return not any(marker in method for marker in NOT_LOSSLESS_MARKERS)


def write(results_dir: str, notebook: str, table: pd.DataFrame, **labels) -> Path:
    """Store one notebook's per-method table (index = method name) for the summary."""
    out = table.reset_index().rename(columns={table.index.name or "index": "method"})
    out = out[["method", *[c for c in COLUMNS if c in out.columns]]]
    out.insert(0, "experiment", notebook)
    for name, value in labels.items():
        out[name] = value
    out["lossless"] = out.method.map(is_lossless)
    path = params.results_path(results_dir, notebook, "summary.csv")
    out.to_csv(path, index=False)
    return path


def collect(results_dir: str) -> pd.DataFrame:
    """Every notebook's summary table, concatenated; raises if nothing was run yet."""
    root = params.results_path(results_dir, "x").parent
    files = sorted(root.glob("*/summary.csv"))
    if not files:
        raise FileNotFoundError(
            f"no results under {root}: run the experiment notebooks first (make reproduce PROFILE=...)"
        )
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def environments(results_dir: str) -> pd.DataFrame:
    """The distinct environments and dtypes the results were produced with (from the JSONL rows)."""
    root = params.results_path(results_dir, "x").parent
    seen = {}
    for path in sorted(root.glob("*/*.jsonl")):
        with path.open() as handle:
            line = handle.readline()
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "env" not in row:
            continue
        entry = {**row["env"], "dtype": row.get("config", {}).get("dtype")}
        seen.setdefault(json.dumps(entry, sort_keys=True), {"experiments": set(), **entry})["experiments"].add(path.parent.name)
    frame = pd.DataFrame(list(seen.values()))
    if not frame.empty:
        frame["experiments"] = frame.experiments.map(lambda s: ", ".join(sorted(s)))
    return frame


def markdown_table(results_dir: str) -> str:
    """The summary as a Markdown table (the README's results table is pasted from this)."""
    table = collect(results_dir)
    shown = table[["experiment", "method", "speedup", "tokens_per_second", "tokens_per_target_forward", "agreement"]]
    header = "| experiment | method | speedup over AR | tokens/s | tokens per target forward | agreement with greedy |"
    lines = [header, "|---|---|---|---|---|---|"]
    for row in shown.itertuples(index=False):
        cells = [row.experiment, row.method] + [f"{v:.2f}" if pd.notna(v) else "" for v in row[2:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(markdown_table(sys.argv[1] if len(sys.argv) > 1 else "results/cpu"))
