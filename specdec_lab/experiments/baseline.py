"""Notebook 01: the autoregressive baseline. Our AR loop and transformers' `generate` on the target
and the draft, side by side; their agreement, weights, and the draft/target cost ratio c."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specdec_lab import data, metrics, models
from specdec_lab.experiments import common, lineups
from specdec_lab.runs import bench

NOTEBOOK = "01_baseline"
TRANSFORMERS_AR = "target generate (transformers)"


@dataclass
class Tables:
    rows: pd.DataFrame  # one row per (method, prompt, repeat)
    table: pd.DataFrame  # target methods, speed ratio against transformers' generate
    weights: pd.DataFrame  # weight bytes of each loaded model
    cost_ratio: float | None  # draft ms/token / target ms/token (None without a draft)
    dtype: str


def run(params: dict) -> Tables:
    target = models.load(params["target"], dtype=params["dtype"], device=params["device"])
    draft = models.load(params["draft"], dtype=params["dtype"], device=params["device"]) if params["draft"] else None
    prompts = data.load_prompts(params["prompt_set"], params["num_prompts"], seed=params["seed"])
    print(f"{len(prompts)} prompts from {params['prompt_set']!r}; target {params['target']} and draft "
          f"{params['draft']} in {params['dtype']} on {params['device']}")
    methods = lineups.baseline(target, draft, params["max_new_tokens"])
    rows = bench.run(methods, prompts, target.tokenizer, out=common.results_file(params, NOTEBOOK, "runs.jsonl"),
                     repeats=params["repeats"], warmup=params["warmup"], config=params, desc="baseline")
    target_rows = rows[rows.role == "target AR"]
    weights = pd.DataFrame([{"model": m.name, "dtype": str(m.dtype), "weights_mb": m.weight_bytes / 2**20}
                            for m in (target, draft) if m is not None])
    cost_ratio = None
    if draft is not None:
        cost_ratio = metrics.cost_ratio(rows[rows.decoder == lineups.DRAFT_AR], rows[rows.decoder == lineups.TARGET_AR])
    tables = Tables(rows, metrics.summary(target_rows, baseline=TRANSFORMERS_AR), weights, cost_ratio, params["dtype"])
    summary = common.summary_lines(metrics.summary(target_rows, baseline=lineups.TARGET_AR), methods)
    common.write_outputs(params, NOTEBOOK, summary, headline(tables), model=params["target"], dtype=params["dtype"])
    return tables


def headline(tables: Tables) -> dict:
    ours, theirs = tables.table.loc[lineups.TARGET_AR], tables.table.loc[TRANSFORMERS_AR]
    return {
        "target AR tokens/s (ours)": round(ours.tokens_per_second, 2),
        "target tokens/s (transformers generate)": round(theirs.tokens_per_second, 2),
        "our loop / generate speed ratio": round(ours.speedup, 3),
    }


def findings(tables: Tables) -> str:
    ours, theirs = tables.table.loc[lineups.TARGET_AR], tables.table.loc[TRANSFORMERS_AR]
    text = (f"On the target, the kit's loop makes **{ours.tokens_per_second:.1f} tokens/s** against "
            f"**{theirs.tokens_per_second:.1f}** for `generate` (speed ratio {ours.speedup:.2f}, measured side by "
            f"side; 1.00 means equal). Greedy outputs agree on {ours.full_match_rate:.0%} of the samples "
            f"(mean agreement {ours.agreement:.3f}; {tables.dtype}).")
    if tables.cost_ratio is not None:
        text += (f"\n\nCost ratio c = draft ms/token ÷ target ms/token = **{tables.cost_ratio:.2f}** "
                 "(lower is better for speculative decoding).")
    return text
