"""What every experiment module does the same way: where its files go, the summary line per
method (with the Method's declared properties), and the checks that a line-up's rows are complete."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from specdec_lab.method import Method
from specdec_lab.runs import jsonl, outputs, paths

NOT_PART_OF_A_RESULT = ("results_dir", "profile")  # where results go does not change them


def results_file(params: dict, notebook: str, name: str) -> Path:
    """A file of the notebook's results, its folder made (a cost grid may be written before any run)."""
    folder = paths.experiment_dir(params["results_dir"], notebook)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def summary_lines(table: pd.DataFrame, methods: Sequence[Method]) -> pd.DataFrame:
    """`metrics.summary`'s table (index = method name) with each method's declared `lossless` and
    `role`, as `outputs.write_summary` stores it."""
    by_name = {method.name: method for method in methods}
    out = table.reset_index().rename(columns={table.index.name or "index": "method"})
    unknown = sorted(set(out.method) - set(by_name))
    if unknown:
        raise ValueError(f"summary lines for methods not in the line-up: {unknown}")
    out["lossless"] = out.method.map(lambda name: by_name[name].lossless)
    out["role"] = out.method.map(lambda name: by_name[name].role)
    return out


def precisions(**loaded) -> dict[str, str]:
    """{'target_precision': 'bf16 int4-wo', ...} for the models given by role (None ones left out):
    part of a bench run's configuration, so rows measured on another path (`dtype: auto` may choose
    another one after a kernel or torch change) are not resumed as if they were these."""
    return {f"{role}_precision": model.precision for role, model in loaded.items() if model is not None}


def params_id(params: dict) -> str:
    """The id of the parameters a result was made with (the summary skips results whose id is not
    that of the profile's current parameter file: left over from an earlier run)."""
    return jsonl.config_hash({k: v for k, v in params.items() if k not in NOT_PART_OF_A_RESULT})


def write_outputs(params: dict, notebook: str, summary: pd.DataFrame, headline: dict, **labels) -> None:
    outputs.write_summary(params["results_dir"], notebook, summary, params_id=params_id(params), **labels)
    outputs.write_headline(params["results_dir"], notebook, headline)
