"""Notebook 01: the autoregressive baseline. Our AR loop and transformers' `generate` on the target
and the draft, side by side; their agreement, weights, the draft/target cost ratio c, and where the
physical limit is: this machine's memory bandwidth, each configuration's tokens/s against the bound
it sets, and the cost T(n) of one forward over n tokens."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specdec_lab import data, hardware, metrics, models, token_view
from specdec_lab.experiments import common, lineups
from specdec_lab.method import Weights
from specdec_lab.runs import bench

NOTEBOOK = "01_baseline"
TRANSFORMERS_AR = "target generate (transformers)"
LLAMA_CPP_AR = "target AR (ours · on llama.cpp, GGUF as is)"


@dataclass
class Tables:
    rows: pd.DataFrame  # one row per (method, prompt, repeat)
    table: pd.DataFrame  # target methods, speed ratio against transformers' generate
    weights: pd.DataFrame  # weight bytes of each loaded model
    cost_ratio: float | None  # draft ms/token / target ms/token (None without a draft)
    precision: str  # what the target computes in (the path dtype 'auto' chose, say): 'bf16', 'bf16 int4-wo'
    bandwidth: float  # bytes/s of a large tensor copy on this machine
    roofline: pd.DataFrame  # per AR method: measured tokens/s, the bandwidth bound, the fraction reached
    cost_curves: pd.DataFrame  # T(n) per model: n, ms, relative_to_one
    token_views: object = None  # the first prompt's text, token by token, of each AR loop of the kit


def run(params: dict) -> Tables:
    target = models.load(params["target"], dtype=params["dtype"], device=params["device"])
    draft = models.load(params["draft"], dtype=params["dtype"], device=params["device"]) if params["draft"] else None
    prompts = data.load_prompts(params["prompt_set"], params["num_prompts"], seed=params["seed"])
    print(f"{len(prompts)} prompts from {params['prompt_set']!r}; target {params['target']} and draft "
          f"{params['draft']} in {target.precision}{'' if draft is None else ' / ' + draft.precision} on {params['device']}")
    methods = lineups.baseline(target, draft, params["max_new_tokens"])
    model_of = {m.name: target if m.role == "target AR" else draft for m in methods}
    if params["llama_cpp"]:  # the kit's AR loop on llama.cpp's engine, on the GGUF file the target comes from
        on_llama = models.load_on_llama_cpp(params["target"])
        methods.append(lineups.ar(on_llama, params["max_new_tokens"], name=LLAMA_CPP_AR, lossless=False,
                                  weights=Weights(quantization=on_llama.quantization)))
        model_of[LLAMA_CPP_AR] = on_llama
    rows = bench.run(methods, prompts, target.tokenizer, out=common.results_file(params, NOTEBOOK, "runs.jsonl"),
                     repeats=params["repeats"], warmup=params["warmup"], desc="baseline",
                     config={**params, **common.precisions(target=target, draft=draft)})
    target_rows = rows[rows.role == "target AR"]
    weights = pd.DataFrame([{"model": m.name, "precision": m.precision, "weights_mb": m.weight_bytes / 2**20}
                            for m in (target, draft) if m is not None])
    cost_ratio = None
    if draft is not None:
        cost_ratio = metrics.cost_ratio(rows[rows.decoder == lineups.DRAFT_AR], rows[rows.decoder == lineups.TARGET_AR])
    bandwidth = hardware.memory_bandwidth()
    roofline = roofline_table(rows, model_of, bandwidth)
    loaded = {"target": target, "draft": draft}
    if params["llama_cpp"]:
        loaded[f"target on llama.cpp ({model_of[LLAMA_CPP_AR].quantization})"] = model_of[LLAMA_CPP_AR]
    cost_curves = pd.concat([hardware.forward_cost_curve(m.model, range(1, params["cost_curve_max_n"] + 1),
                                                         repeats=params["cost_curve_repeats"]).assign(model=name)
                             for name, m in loaded.items() if m is not None], ignore_index=True)
    cost_curves.to_csv(common.results_file(params, NOTEBOOK, "cost_curves.csv"), index=False)
    tables = Tables(rows, metrics.summary(target_rows, baseline=TRANSFORMERS_AR), weights, cost_ratio, target.precision,
                    bandwidth, roofline, cost_curves, token_view.views_of_rows(rows, target.tokenizer))
    summary = common.summary_lines(metrics.summary(target_rows, baseline=lineups.TARGET_AR), methods)
    common.write_outputs(params, NOTEBOOK, summary, headline(tables), model=params["target"], dtype=target.precision)
    return tables


def roofline_table(rows: pd.DataFrame, model_of: dict, bandwidth: float) -> pd.DataFrame:
    """Per AR method: decode tokens/s (after the first token; geometric mean over prompts) against
    the memory-bandwidth bound of the model it runs (`model_of`: method name -> LoadedModel;
    bandwidth / weight bytes read per token), and the fraction of it reached; tokens/s with the
    prefill included beside it."""
    overall = metrics.aggregate(rows, "tokens_per_second").tokens_per_second
    decoding = metrics.aggregate(rows.assign(decode=metrics.decode_tokens_per_second(rows)), "decode").decode
    records = []
    for method, group in rows.groupby("decoder", sort=False):
        model = model_of[method]
        bound = hardware.roofline_tokens_per_second(model.model, bandwidth)
        records.append({"method": method, "tokens_per_second": overall[method],
                        "decode_tokens_per_second": decoding[method], "bound_tokens_per_second": bound,
                        "fraction_of_bound": decoding[method] / bound,
                        "bytes_read_per_token_mb": hardware.bytes_read_per_token(model.model) / 2**20})
    return pd.DataFrame(records)


def headline(tables: Tables) -> dict:
    ours, theirs = tables.table.loc[lineups.TARGET_AR], tables.table.loc[TRANSFORMERS_AR]
    return {
        "target AR tokens/s (ours)": round(ours.tokens_per_second, 2),
        "target tokens/s (transformers generate)": round(theirs.tokens_per_second, 2),
        "our loop / generate speed ratio": round(ours.speedup, 3),
        "memory bandwidth (GB/s)": round(tables.bandwidth / 1e9, 1),
        "target AR (ours): fraction of the bandwidth bound": round(
            float(tables.roofline.set_index("method").fraction_of_bound[lineups.TARGET_AR]), 3),
    }


def findings(tables: Tables) -> str:
    ours, theirs = tables.table.loc[lineups.TARGET_AR], tables.table.loc[TRANSFORMERS_AR]
    text = (f"On the target, the kit's loop makes **{ours.tokens_per_second:.1f} tokens/s** against "
            f"**{theirs.tokens_per_second:.1f}** for `generate` (speed ratio {ours.speedup:.2f}, measured side by "
            f"side; 1.00 means equal). Greedy outputs agree on {ours.full_match_rate:.0%} of the samples "
            f"(mean agreement {ours.agreement:.3f}; {tables.precision}).")
    ours_bound = tables.roofline.set_index("method").loc[lineups.TARGET_AR]
    text += (f"\n\nThis machine copies memory at **{tables.bandwidth / 1e9:.1f} GB/s**. Decoding one token reads "
             f"{ours_bound.bytes_read_per_token_mb:,.0f} MB of target weights ({tables.precision}), so AR decoding cannot "
             f"exceed **{ours_bound.bound_tokens_per_second:.1f} tokens/s**; the kit's loop reaches "
             f"{ours_bound.decode_tokens_per_second:.1f} while decoding ({ours_bound.fraction_of_bound:.0%} of the "
             f"bound; {ours_bound.tokens_per_second:.1f} tokens/s with the prefill).")
    for model, curve in tables.cost_curves.groupby("model"):
        at = curve.set_index("n").relative_to_one
        shown = [n for n in (4, 8, 16, 32) if n in at.index]
        text += (f"\n\nOne forward over n tokens on the {model} costs " +
                 ", ".join(f"T({n}) = {at[n]:.2f}·T(1)" for n in shown) + f" (T(1) = {curve.ms.iloc[0]:.1f} ms).")
    if tables.cost_ratio is not None:
        text += (f"\n\nCost ratio c = draft ms/token ÷ target ms/token = **{tables.cost_ratio:.2f}** "
                 "(lower is better for speculative decoding).")
    return text
