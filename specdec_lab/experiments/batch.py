"""Notebook 05: speculative decoding at batch > 1. The kit's batched AR loop, its batched speculative
decoder (draft model at each k, prompt lookup) and transformers' batched `generate` on the same batches
of prompts at every batch size, interleaved; throughput and per-request latency against batch size; and
the cost model's answer, from T_b(n) measured over b rows of n tokens, to which k is best at each batch
size and where speculation stops paying (the crossover)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specdec_lab import data, hardware, models, token_view
from specdec_lab.experiments import batch_tables, batch_words, common, lineups
from specdec_lab.machine import cpu_model
from specdec_lab.runs import bench, outputs

NOTEBOOK = "05_batch"


@dataclass
class Tables:
    rows: pd.DataFrame  # one row per (method, batch, request)
    table: pd.DataFrame  # per (method, batch size): throughput, latency, tokens per forward, agreement
    target_costs: pd.DataFrame  # T_b(n) of the target: batch, n, ms, relative_to_one
    draft_costs: pd.DataFrame  # D_b(1) of the draft
    alpha: float  # the draft's per-token acceptance, pooled over every batch size
    predicted: pd.DataFrame  # per (k, batch size): predicted and measured throughput ratio over AR
    best_k: pd.DataFrame  # per batch size: predicted and measured best k
    crossover: dict  # {"predicted", "measured", "measured_point", "decode"}: b where the draft stops paying, or None
    peer: pd.DataFrame  # per batch size: our AR's throughput over transformers' generate's
    precision: str
    cpu: str
    config: dict
    token_views: object = None  # the largest batch's first prompt, each method's text token by token
    vllm: object = None  # vllm_engine.VllmBatchTables: vLLM's configurations beside the kit's batched AR (vllm: true)


def run(params: dict) -> Tables:
    # a batch's every forward covers many tokens (b rows, each verifying k + 1): with dtype 'auto' both
    # models take the path fastest at multi-token forwards
    target = models.load(params["target"], dtype=params["dtype"], device=params["device"], multi_token=True)
    draft = (models.load(params["draft"], dtype=params["dtype"], device=params["device"], multi_token=True)
             if params["draft"] else None)
    prompts = data.load_prompts(params["prompt_set"], params["num_prompts"], seed=params["seed"])
    print(f"{len(prompts)} prompts from {params['prompt_set']!r}, batch sizes {params['batch_sizes']}; target "
          f"{params['target']} in {target.precision}" + ("" if draft is None else f", draft {params['draft']} in {draft.precision}"))
    # T_b(n), measured first: prompt lookup's batch cut reads it at every step (n up to its longest proposal, 2k)
    n_values = list(range(1, max([*params["k_values"], 2 * params["prompt_lookup_k"]]) + 2))
    target_costs = hardware.batch_cost_grid(target.model, params["batch_sizes"], n_values,
                                            repeats=params["cost_curve_repeats"])
    target_costs.to_csv(common.results_file(params, NOTEBOOK, "target_costs.csv"), index=False)
    methods = lineups.batch_lineup(target, draft, params["k_values"] if draft is not None else [],
                                   params["prompt_lookup_k"], params["max_new_tokens"],
                                   step_ms=batch_tables.cost_curves(target_costs))
    rows = bench.run_batches(methods, prompts, target.tokenizer, out=common.results_file(params, NOTEBOOK, "runs.jsonl"),
                             batch_sizes=params["batch_sizes"], repeats=params["repeats"], warmup=params["warmup"],
                             config={**params, **common.precisions(target=target, draft=draft)}, seed=params["seed"])
    table = batch_tables.table(rows, lineups.BATCHED_AR)
    if draft is not None:
        draft_costs = hardware.batch_cost_grid(draft.model, params["batch_sizes"], [1], repeats=params["cost_curve_repeats"])
        draft_costs.to_csv(common.results_file(params, NOTEBOOK, "draft_costs.csv"), index=False)
        alpha = batch_tables.draft_alpha(rows)
        predicted = batch_tables.predicted_vs_measured(table, alpha, target_costs, draft_costs)
    else:
        draft_costs, alpha, predicted = pd.DataFrame(), float("nan"), pd.DataFrame()
    best = batch_tables.best_k(predicted) if not predicted.empty else pd.DataFrame()
    tables = Tables(rows, table, target_costs, draft_costs, alpha, predicted, best,
                    batch_tables.crossovers(best) if not best.empty else dict.fromkeys(["predicted", "measured", "measured_point", "decode"]),
                    batch_tables.peer_ratio(table, lineups.BATCHED_AR, lineups.BATCHED_GENERATE),
                    target.precision, cpu_model()["cpu_model"], params,
                    token_view.views_of_rows(rows[rows.batch_size == max(params["batch_sizes"])], target.tokenizer,
                                             title=f"What each method wrote at batch {max(params['batch_sizes'])}"))
    if params["vllm"]:  # last: a vLLM engine and the kit's models share the memory
        from specdec_lab.experiments import vllm_engine

        tables.vllm = vllm_engine.run_batches(params, methods[0], prompts, target.tokenizer)
    # headline only: the summary ranks per-token speedups over prompts, and a batch's are throughput over batches
    outputs.write_headline(params["results_dir"], NOTEBOOK, batch_words.headline(tables))
    return tables
