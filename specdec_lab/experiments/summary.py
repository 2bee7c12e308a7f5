"""Notebook 06: every method on one page. Reads the summary.csv each experiment notebook wrote
(runs nothing) and ranks the methods declared lossless within each experiment: a ranking across
notebooks would compare speedups over different prompts, lengths and baselines.

    python -m specdec_lab.experiments.summary results/cpu    # the README's results table
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pandas as pd

from specdec_lab import params as parameters
from specdec_lab import words
from specdec_lab.experiments.common import params_id
from specdec_lab.metrics import Speedup
from specdec_lab.runs import outputs
from specdec_lab.runs.paths import NOTEBOOKS_DIR, results_path

NOTEBOOK = "06_summary"


@dataclass
class Tables:
    table: pd.DataFrame  # one line per (experiment, method), current results only
    stale: list[str]  # experiments whose summary.csv was made with other parameters than the profile's now
    fastest_lossless: pd.DataFrame  # per experiment, the fastest method declared lossless
    environments: pd.DataFrame  # the environments the rows were produced in


def fastest_lossless(table: pd.DataFrame) -> pd.DataFrame:
    """Per experiment, the declared-lossless method with the highest speedup over that experiment's
    own AR baseline (the baseline itself excluded)."""
    candidates = table[table.lossless.astype(bool) & table.speedup.notna() & (table.role != "target AR")]
    if candidates.empty:
        return candidates
    return candidates.loc[candidates.groupby("experiment").speedup.idxmax()].reset_index(drop=True)


def current_params_id(profile: str, notebook: str) -> str | None:
    """The params id the notebook's results have when made from the profile's parameter file now
    (the notebook's defaults overridden by the file, as papermill runs it); None without a file."""
    values = parameters.profile_values(notebook, profile)
    return params_id(values) if values else None


def split_stale(table: pd.DataFrame, profile: str) -> tuple[pd.DataFrame, list[str]]:
    """(the lines made with the profile's current parameters, the experiments whose lines are stale)."""
    expected = {name: current_params_id(profile, name) for name in table.experiment.unique()}
    ids = table.params_id if "params_id" in table else pd.Series([None] * len(table))
    current = [expected[name] is None or made_with == expected[name] for name, made_with in zip(table.experiment, ids)]
    stale = sorted(set(table.experiment[[not keep for keep in current]]))
    return table[current].reset_index(drop=True), stale


def run(params: dict) -> Tables:
    table, stale = split_stale(outputs.collect_summaries(params["results_dir"]), params["profile"])
    tables = Tables(table, stale, fastest_lossless(table), outputs.environments(params["results_dir"]))
    outputs.write_headline(params["results_dir"], NOTEBOOK, headline(tables))
    return tables


def headline(tables: Tables) -> dict:
    return {f"fastest lossless method in {row.experiment}": f"{row.method}: {words.interval(Speedup.from_line(row))}"
            for _, row in tables.fastest_lossless.iterrows()}


def findings(tables: Tables) -> str:
    text = ""
    if tables.stale:
        text += (f"Left out, made with other parameters than the profile's files now (rerun them): "
                 f"{', '.join(tables.stale)}.\n\n")
    if tables.fastest_lossless.empty:
        return text + "No experiment measured a lossless method against its AR baseline."
    lines = [f"{row.experiment}: **{row.method}**, **{words.interval(Speedup.from_line(row))}** over its AR "
             f"baseline, agreement {row.agreement:.3f}" for _, row in tables.fastest_lossless.iterrows()]
    return text + ("Fastest method declared lossless, per experiment (same prompts and baseline within each; "
                   "per-token speedup, geometric mean over prompts):\n" + words.bullets(lines))


def markdown_table(results_dir: str) -> str:
    """The summary as a Markdown table (the README's results table is pasted from this)."""
    table = outputs.collect_summaries(results_dir)
    has_interval = table.speedup_low.notna() if "speedup_low" in table else pd.Series(False, index=table.index)
    frame = pd.DataFrame({
        "experiment": table.experiment, "method": table.method,
        "lossless (declared)": table.lossless.map({True: "yes", False: "no"}),
        "speedup over AR (95% CI)": [words.interval(Speedup.from_line(line), compact=True, prompts=False) if interval
                                     else line.speedup for (_, line), interval in zip(table.iterrows(), has_interval)],
        "prompts": table.get("prompts"),
        **{name: table.get(column) for name, column in (("tokens/s", "tokens_per_second"),
                                                        ("tokens per target forward", "tokens_per_target_forward"),
                                                        ("agreement with greedy", "agreement"))}})
    return words.markdown_table(frame, {**{column: ".2f" for column in frame.columns[3:]}, "prompts": ".0f"})


def readme_results(results_dir: str) -> str:
    """The README's results: the table, then each notebook's headline numbers, all from `results_dir`."""
    lines = [markdown_table(results_dir), ""]
    notebooks = {p.stem for p in NOTEBOOKS_DIR.glob("*.ipynb")}  # a folder a renamed notebook left behind is not listed
    for path in sorted(p.parent.name for p in results_path(results_dir).glob(f"*/{outputs.HEADLINE_FILE}")
                       if p.parent.name in notebooks):
        numbers = outputs.read_headline(results_dir, path)
        lines.append(f"- **{path}**: " + "; ".join(f"{name}: {value}" for name, value in numbers.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    print(readme_results(sys.argv[1] if len(sys.argv) > 1 else "results/cpu"))
