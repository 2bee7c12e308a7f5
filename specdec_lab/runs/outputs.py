"""What each experiment notebook leaves behind for the summary and the report index:

- `summary.csv`: one line per method (speedup over that notebook's own AR baseline, tokens/s,
  agreement, the method's declared `lossless` and `role`, ...);
- `headline.json`: the few numbers the report index shows.

The summary notebook collects these files and never re-runs an experiment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specdec_lab.runs import jsonl
from specdec_lab.runs.paths import experiment_dir, results_path

SUMMARY_FILE = "summary.csv"
HEADLINE_FILE = "headline.json"
SUMMARY_COLUMNS = ["speedup", "speedup_low", "speedup_high", "prompts", "latency_ratio", "pairs_of_other_length",
                   "tokens_per_second", "tokens_per_target_forward", "agreement", "agreement_with_unquantized",
                   "full_match_rate", "acceptance_rate", "peak_memory_mb"]


def write_summary(results_dir: str | Path, notebook: str, table: pd.DataFrame, **labels) -> Path:
    """Store one notebook's per-method table: columns `method`, `lossless`, `role` and any of
    SUMMARY_COLUMNS; `labels` (model, dtype, ...) are added as constant columns."""
    missing = {"method", "lossless", "role"} - set(table.columns)
    if missing:
        raise ValueError(f"a summary table needs the columns method, lossless and role; missing {sorted(missing)}")
    out = table[["method", "lossless", "role", *[c for c in SUMMARY_COLUMNS if c in table.columns]]].copy()
    out.insert(0, "experiment", notebook)
    for name, value in labels.items():
        out[name] = value
    path = experiment_dir(results_dir, notebook) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(path, index=False)
    return path


def write_headline(results_dir: str | Path, notebook: str, numbers: dict) -> Path:
    path = experiment_dir(results_dir, notebook) / HEADLINE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(numbers, indent=1, default=str))
    return path


def read_headline(results_dir: str | Path, notebook: str) -> dict:
    path = experiment_dir(results_dir, notebook) / HEADLINE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def collect_summaries(results_dir: str | Path) -> pd.DataFrame:
    """Every notebook's summary table, concatenated; raises if nothing was run yet."""
    root = results_path(results_dir)
    files = sorted(root.glob(f"*/{SUMMARY_FILE}"))
    if not files:
        raise FileNotFoundError(
            f"no results under {root}: run the experiment notebooks first (make reproduce PROFILE=...)")
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def environments(results_dir: str | Path) -> pd.DataFrame:
    """The distinct environments and dtypes the results were produced with, from every JSONL row."""
    seen: dict[str, dict] = {}
    for path in sorted(results_path(results_dir).glob("*/*.jsonl")):
        for row in jsonl.read(path):
            if "env" not in row:
                continue
            config = row.get("config") or {}
            entry = {**row["env"], "dtype": config.get("target_precision") or config.get("dtype")}  # auto: what it chose
            key = json.dumps(entry, sort_keys=True, default=str)
            seen.setdefault(key, {"experiments": set(), **entry})["experiments"].add(path.parent.name)
    frame = pd.DataFrame(list(seen.values()))
    if not frame.empty:
        frame["experiments"] = frame.experiments.map(lambda names: ", ".join(sorted(names)))
    return frame
