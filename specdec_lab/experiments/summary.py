"""Notebook 05: every method on one page. Reads the summary.csv each experiment notebook wrote
(runs nothing) and ranks the methods declared lossless within each experiment: a ranking across
notebooks would compare speedups over different prompts, lengths and baselines.

    python -m specdec_lab.experiments.summary results/cpu    # the README's results table
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pandas as pd

from specdec_lab.runs import outputs

NOTEBOOK = "05_summary"


@dataclass
class Tables:
    table: pd.DataFrame  # one line per (experiment, method)
    fastest_lossless: pd.DataFrame  # per experiment, the fastest method declared lossless
    environments: pd.DataFrame  # the environments the rows were produced in


def fastest_lossless(table: pd.DataFrame) -> pd.DataFrame:
    """Per experiment, the declared-lossless method with the highest speedup over that experiment's
    own AR baseline (the baseline itself excluded)."""
    candidates = table[table.lossless.astype(bool) & table.speedup.notna() & (table.role != "target AR")]
    if candidates.empty:
        return candidates
    return candidates.loc[candidates.groupby("experiment").speedup.idxmax()].reset_index(drop=True)


def run(params: dict) -> Tables:
    table = outputs.collect_summaries(params["results_dir"])
    tables = Tables(table, fastest_lossless(table), outputs.environments(params["results_dir"]))
    outputs.write_headline(params["results_dir"], NOTEBOOK, headline(tables))
    return tables


def headline(tables: Tables) -> dict:
    return {f"fastest lossless method in {row.experiment}": f"{row.method}: {row.speedup:.2f}x"
            for row in tables.fastest_lossless.itertuples()}


def findings(tables: Tables) -> str:
    if tables.fastest_lossless.empty:
        return "No experiment measured a lossless method against its AR baseline."
    lines = [f"- {row.experiment}: **{row.method}**, **{row.speedup:.2f}x** over its AR baseline, "
             f"agreement {row.agreement:.3f}" for row in tables.fastest_lossless.itertuples()]
    return "Fastest method declared lossless, per experiment (same prompts and baseline within each):\n" + "\n".join(lines)


def markdown_table(results_dir: str) -> str:
    """The summary as a Markdown table (the README's results table is pasted from this)."""
    table = outputs.collect_summaries(results_dir)
    columns = ["speedup", "tokens_per_second", "tokens_per_target_forward", "agreement"]
    lines = ["| experiment | method | lossless (declared) | speedup over AR | tokens/s | tokens per target forward "
             "| agreement with greedy |", "|---|---|---|---|---|---|---|"]
    for row in table.itertuples(index=False):
        cells = [row.experiment, row.method, "yes" if row.lossless else "no"]
        values = [getattr(row, column, float("nan")) for column in columns]
        cells += [f"{value:.2f}" if pd.notna(value) else "" for value in values]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table(sys.argv[1] if len(sys.argv) > 1 else "results/cpu"))
