"""Where the kit's files live: the repository root, notebooks, parameter files, results, reports.

Pure path arithmetic: nothing here creates a folder (writers create what they write into), so
validating parameters never leaves folders behind.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
PARAMS_DIR = REPO_ROOT / "params"
REPORTS_DIR = REPO_ROOT / "reports"
INTERACTIVE_NOTEBOOKS = ("00_explore",)  # opened by `make lab`, never run by `make reproduce` (no parameter files)


def results_path(results_dir: str | Path, *parts: str) -> Path:
    """A path under the results folder; a relative folder is taken from the repository root, so
    notebooks write to the same place from JupyterLab (cwd notebooks/) and from papermill."""
    base = Path(results_dir)
    base = base if base.is_absolute() else REPO_ROOT / base
    return base.joinpath(*parts)


def experiment_dir(results_dir: str | Path, notebook: str) -> Path:
    """The folder of one notebook's results (its JSONL rows, summary.csv, headline.json)."""
    return results_path(results_dir, notebook)
