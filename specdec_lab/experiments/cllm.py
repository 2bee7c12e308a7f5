"""Notebook 04: parallel decoding. The cost of a forward over n tokens, T(n), per model, and the
tokens per forward at which Jacobi or lookahead decoding breaks even; the base model's Jacobi
trajectories, a consistency LLM (CLLM) fine-tuned on them, then AR vs Jacobi and lookahead decoding
of the base model and of the CLLM on held-out databases: tokens per forward, speed, per-block
statistics, quality drift; and AR vs lookahead (vs Jacobi) on a reference model where T(n) is flat."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pandas as pd
import torch


from specdec_lab import data, hardware, metrics, models, quality
from specdec_lab.cllm import train, trajectories
from specdec_lab.decoders.common import stop_token_ids
from specdec_lab.decoders.lookahead import tokens_per_pass
from specdec_lab.experiments import common, lineups
from specdec_lab.models import LoadedModel
from specdec_lab.result import JacobiStats
from specdec_lab.runs import bench

NOTEBOOK = "04_cllm"


@dataclass
class Tables:
    train_set: list[data.Prompt]
    held_out_set: list[data.Prompt]
    collected: dict  # trajectory counts (trajectories.summary)
    losses: pd.DataFrame  # one row per optimizer step
    cllm_folder: Path
    rows: pd.DataFrame  # held-out rows: AR, Jacobi and lookahead of the base model and the CLLM
    table: pd.DataFrame  # one line per method, with ms_per_forward
    blocks: pd.DataFrame  # one row per Jacobi block
    block_stats: pd.DataFrame  # per method: iterations, fast-forwarded, stationary tokens per block
    seen_and_held_out: pd.DataFrame  # Jacobi rows on training prompts and on held-out ones
    tokens_per_forward_by_prompts: pd.DataFrame  # method x (training / held-out databases)
    nll: pd.DataFrame  # NLL of the base model's held-out answers under base and CLLM
    looping: int  # CLLM held-out answers that loop
    cost_curves: pd.DataFrame  # T(n) per model: model, dtype, n, ms, relative_to_one
    break_even: pd.DataFrame  # per model and parallel method: tokens per forward needed to beat AR
    reference_table: pd.DataFrame | None = None  # AR vs lookahead (vs Jacobi) on an untrained larger model
    reference_blocks: pd.DataFrame | None = None
    sql_accuracy: pd.DataFrame | None = None  # per method: exact match of its held-out SQL with Spider's gold
    accuracy_pairs: dict | None = None  # base vs CLLM prompt by prompt (`paired_answers`)
    cllm_lookahead: str | None = None  # the method name of lookahead decoding on the CLLM, when run
    base_lookahead: str | None = None  # and of lookahead on the base model with the same W, N, G


def groups(prompts: Sequence[data.Prompt]) -> list[str]:
    return sorted({p.group for p in prompts})


def split(params: dict) -> tuple[list[data.Prompt], list[data.Prompt]]:
    """All prompts of the training databases and the first `eval_prompts` of the held-out ones (disjoint
    databases), each side spread round-robin over its databases. The CLLM's trajectories come from
    the first `train_prompts` of the training side; fine-tuning on reference answers draws from all of it."""
    train_side, held_out_set = data.split_by_group(data.load_prompts(params["prompt_set"]),
                                                   params["held_out_fraction"], seed=params["seed"])
    by_database = lambda prompt: prompt.group  # noqa: E731
    return (data.round_robin(train_side, by_database),
            data.round_robin(held_out_set, by_database)[:params["eval_prompts"]])


def train_config(params: dict) -> train.TrainConfig:
    """The notebook's training parameters, named as TrainConfig names them (`train_steps` -> steps)."""
    names = {field.name for field in fields(train.TrainConfig)}
    return train.TrainConfig(steps=params["train_steps"], **{k: v for k, v in params.items() if k in names - {"steps"}})


def answer_config(params: dict) -> train.TrainConfig:
    """Supervised fine-tuning on reference answers: the AR loss alone (cross-entropy, no smoothing),
    `sft_answers_per_step` answers (one prompt each) accumulated into every optimizer step."""
    return replace(train_config(params), steps=params["sft_steps"], learning_rate=params["sft_learning_rate"],
                   grad_accumulation=params["sft_answers_per_step"], consistency_weight=0.0, ar_weight=1.0,
                   label_smoothing=0.0, states_per_step=1)


def fine_tune_on_answers(params: dict, prompts: Sequence[data.Prompt], answers: dict[str, str],
                         pretrained: LoadedModel) -> Path:
    """The paper's starting point: the model fine-tuned on the task's reference answers (Spider's gold
    SQL of the training databases, never the held-out ones). Returns the fine-tuned model's folder."""
    end_id = pretrained.tokenizer.eos_token_id
    if end_id not in stop_token_ids(pretrained.model, pretrained.tokenizer):  # the decoders must stop where answers end
        raise ValueError(f"{params['model']}'s eos_token ({pretrained.tokenizer.eos_token!r}) is not among the ids its "
                         f"generation stops at: the answers to fine-tune on cannot be ended; use sft_steps: 0")
    records = trajectories.answer_records(pretrained.tokenizer, prompts, answers, end_id)
    config = answer_config(params)
    run_dir = train.run_folder(common.results_file(params, NOTEBOOK, "runs"), params["model"], records, config,
                               params["train_dtype"])
    folder = train.train(params["model"], records, run_dir, config, dtype=params["train_dtype"],
                         cpu=params["device"] == "cpu", desc="fine-tuning on reference answers")
    print(f"fine-tuned for {config.steps * config.grad_accumulation} answers drawn from {len(records)} prompts: {folder}")
    return folder


def cost_curve(loaded: LoadedModel, spec: str, dtype: str, params: dict) -> pd.DataFrame:
    """T(n) of one model (`hardware.forward_cost_curve`, the curve notebooks 01 and 03 use)."""
    curve = hardware.forward_cost_curve(loaded.model, params["cost_curve_n"], repeats=params["cost_curve_repeats"])
    return curve.assign(model=spec, dtype=dtype)


def run(params: dict) -> Tables:
    model, dtype, device = params["model"], params["dtype"], params["device"]
    base = models.load(model, dtype=dtype, device=device)
    curves = {(model, dtype): cost_curve(base, model, dtype, params)}
    train_side, held_out_set = split(params)
    train_set = train_side[:params["train_prompts"]]
    print(f"training: {len(train_set)} prompts over {len(groups(train_set))} databases")
    print(f"held out: {len(held_out_set)} prompts over databases never trained on: {', '.join(groups(held_out_set))}")

    pretrained_rows, base_spec = None, model
    if params["sft_steps"]:  # the CLLM's base is then the fine-tuned model; the pretrained one is kept for accuracy
        answers = data.reference_answers(params["prompt_set"])  # fails before any work for a set without
        pretrained_rows = bench.run([lineups.ar(base, params["max_new_tokens"], name=lineups.PRETRAINED_AR)],
                                    held_out_set, base.tokenizer, repeats=1, warmup=0, config=params, desc="pretrained",
                                    out=common.results_file(params, NOTEBOOK, "pretrained.jsonl"))
        base_spec = str(fine_tune_on_answers(params, train_side, answers, base))
        base = models.load(base_spec, dtype=dtype, device=device)
    records = trajectories.collect(base.model, base.tokenizer, train_set,
                                   common.results_file(params, NOTEBOOK, "trajectories.jsonl"),
                                   params["max_new_tokens"], params["block_size"], params["init"], params["seed"],
                                   config={"model": base_spec, "dtype": dtype})
    kept, _ = trajectories.usable(records)
    config = train_config(params)
    run_dir = train.run_folder(common.results_file(params, NOTEBOOK, "runs"), base_spec, kept, config,
                               params["train_dtype"])
    # trained in `train_dtype` (fp32 weights under bf16 autocast: AdamW's small steps are lost on bf16 weights)
    cllm_folder = train.train(base_spec, kept, run_dir, config, dtype=params["train_dtype"], cpu=device == "cpu")
    cllm = models.load(str(cllm_folder), dtype=dtype, device=device)
    losses = pd.DataFrame(train.read_losses(run_dir))
    print(f"CLLM in {cllm_folder}; {len(losses)} steps, {losses.step_s.sum() / 60:.1f} min of training")

    measured = {**params, "cllm": cllm_folder.parent.name}
    methods = lineups.cllm(base, cllm, params["max_new_tokens"], params["block_size"], params["init"],
                           lookahead_configs=params["lookahead_configs"])
    rows = bench.run(methods, held_out_set, base.tokenizer, out=common.results_file(params, NOTEBOOK, "held_out.jsonl"),
                     repeats=params["repeats"], warmup=params["warmup"], config=measured, desc="held-out")
    table = metrics.summary(rows, baseline=lineups.BASE_AR)
    summary = common.summary_lines(table, methods)
    table["ms_per_forward"] = ms_per_forward(rows)
    blocks = block_table(rows)

    trained_on = {record["prompt_id"] for record in kept}  # looping generations were left out of training
    seen_rows = bench.run(lineups.cllm(base, cllm, params["max_new_tokens"], params["block_size"], params["init"],
                                       with_ar=False),
                          [p for p in train_set if p.id in trained_on][:params["eval_prompts"]], base.tokenizer,
                          out=common.results_file(params, NOTEBOOK, "training_prompts.jsonl"), repeats=1, warmup=0,
                          config=measured, desc="training prompts")
    both = seen_and_held_out(seen_rows, rows)
    nll = held_out_nll({"base": base, "CLLM": cllm}, rows, held_out_set)
    del cllm, methods, base

    reference_rows = None
    if params["reference_model"]:
        reference, spec, ref_dtype = load_reference(params)
        curves[(spec, ref_dtype)] = cost_curve(reference, spec, ref_dtype, params)
        reference_rows = run_reference(reference, params, held_out_set)
        del reference
    for entry in params["cost_curve_models"]:  # the other models the cost curves compare
        key = (entry["model"], entry["dtype"])
        if key not in curves:
            other = models.load(key[0], dtype=key[1], device=device)
            curves[key] = cost_curve(other, *key, params)
            del other
    cost_curves = pd.concat(curves.values(), ignore_index=True)
    cost_curves.to_csv(common.results_file(params, NOTEBOOK, "cost_curves.csv"), index=False)

    tables = Tables(
        train_set, held_out_set, trajectories.summary(records), losses, cllm_folder, rows, table, blocks,
        block_summary(blocks), both,
        both.pivot_table(index="decoder", columns="prompts", values="tokens_per_target_forward"),
        nll, looping_answers(rows, lineups.CLLM_JACOBI), cost_curves,
        break_even_table(cost_curves, params["block_size"], params["lookahead_configs"]))
    tables.cllm_lookahead, tables.base_lookahead = lineups.cllm_lookahead_names(params["lookahead_configs"])
    if params["prompt_set"] == "spider":
        gold = data.spider_gold()
        answered = rows if pretrained_rows is None else pd.concat([pretrained_rows, rows])
        tables.sql_accuracy = sql_accuracy(answered, gold)
        tables.accuracy_pairs = paired_answers(rows, gold, lineups.BASE_AR, lineups.CLLM_JACOBI)
    if reference_rows is not None:
        tables.reference_table = metrics.summary(reference_rows, baseline=lineups.BASE_AR)
        tables.reference_table["ms_per_forward"] = ms_per_forward(reference_rows)
        tables.reference_blocks = block_summary(block_table(reference_rows))
    common.write_outputs(params, NOTEBOOK, summary, headline(tables), dtype=dtype,
                         model=f"{model} fine-tuned on gold SQL" if params["sft_steps"] else model)
    return tables


def load_reference(params: dict) -> tuple[LoadedModel, str, str]:
    spec, dtype = params["reference_model"], params["reference_dtype"]
    return models.load(spec, dtype=dtype, device=params["device"]), spec, dtype


def run_reference(reference: LoadedModel, params: dict, held_out_set: list[data.Prompt]) -> pd.DataFrame:
    """AR vs lookahead decoding (and Jacobi, if asked) on an untrained larger model, on the first
    held-out prompts: what the training-free parallel decoders give where T(n) is flat."""
    methods = lineups.cllm(reference, None, params["max_new_tokens"], params["block_size"], params["init"],
                           with_jacobi=params["reference_jacobi"], lookahead_configs=params["lookahead_configs"])
    return bench.run(methods, held_out_set[:params["reference_prompts"]], reference.tokenizer,
                     out=common.results_file(params, NOTEBOOK, "reference_model.jsonl"), repeats=params["repeats"],
                     warmup=params["warmup"], config=params, desc=params["reference_model"])


# --- analysis on rows -------------------------------------------------------------------------------

def ms_per_forward(rows: pd.DataFrame) -> pd.Series:
    """Per method: wall time per target forward pass (ms), all samples pooled."""
    totals = rows.groupby("decoder")[["wall_time_s", "target_forwards"]].sum()
    return 1000 * totals.wall_time_s / totals.target_forwards


def looping_answers(rows: pd.DataFrame, decoder: str) -> int:
    """How many of `decoder`'s answers (one per prompt) loop; a loop converges in few iterations,
    so looping answers inflate tokens per forward."""
    answers = rows[rows.decoder == decoder].drop_duplicates("prompt_id").tokens
    return int(answers.map(trajectories.is_degenerate).sum())


def seen_and_held_out(seen: pd.DataFrame, held_out: pd.DataFrame) -> pd.DataFrame:
    """The Jacobi rows on training prompts and on held-out ones, labelled in a `prompts` column. A
    CLLM that gains on the prompts it trained on but not on new ones has learned them, not the task."""
    held_out = held_out[held_out.decoder.isin(set(seen.decoder))]
    both = pd.concat([seen.assign(prompts="training databases"), held_out.assign(prompts="held-out databases")])
    return both[both.role == "parallel"].reset_index(drop=True)


def answer_matches(rows: pd.DataFrame, gold: dict[str, str]) -> pd.Series:
    """(method, prompt id) -> whether its held-out answer (first repeat) matches Spider's gold query
    (`quality.sql_exact_match`), in the rows' order of methods."""
    answers = rows[rows.repeat == 0].drop_duplicates(["decoder", "prompt_id"])
    return pd.Series([quality.sql_exact_match(text, gold[prompt_id])
                      for text, prompt_id in zip(answers.text, answers.prompt_id)],
                     index=pd.MultiIndex.from_arrays([answers.decoder, answers.prompt_id]))


def sql_accuracy(rows: pd.DataFrame, gold: dict[str, str]) -> pd.DataFrame:
    """Per method: the share of its held-out answers whose SQL matches the gold query, and the prompt
    count. The lossless methods answer as the base model does; the CLLM answers as itself."""
    matches = answer_matches(rows, gold).astype(float).groupby(level="decoder", sort=False)
    return pd.DataFrame({"exact_match": matches.mean(), "prompts": matches.size()})


def paired_answers(rows: pd.DataFrame, gold: dict[str, str], first: str, second: str) -> dict[str, int]:
    """How two methods' held-out answers (first repeat) compare prompt by prompt: right in both, only
    in `first`, only in `second`, in neither. Two accuracies from the same few prompts differ by the
    prompts one gets right and the other wrong; these counts say how many that is."""
    matches = answer_matches(rows[rows.decoder.isin([first, second])], gold)
    shared = set(matches[first].index) & set(matches[second].index)
    right = {method: {p for p in shared if matches[method][p]} for method in (first, second)}
    return {"both": len(right[first] & right[second]), "only_first": len(right[first] - right[second]),
            "only_second": len(right[second] - right[first]), "neither": len(set(shared) - right[first] - right[second])}


def block_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per Jacobi block (of the rows that are Jacobi decoding): iterations to converge,
    fast-forwarded and stationary tokens."""
    records = []
    for row in rows[rows.jacobi.notna()].itertuples() if "jacobi" in rows else ():
        for index, block in enumerate(JacobiStats.from_dict(row.jacobi).blocks):
            records.append({"decoder": row.decoder, "prompt_id": row.prompt_id, "repeat": row.repeat, "block": index,
                            "iterations": block.iterations, "fast_forward": block.fast_forward,
                            "stationary": block.stationary})
    return pd.DataFrame(records, columns=["decoder", "prompt_id", "repeat", "block", "iterations", "fast_forward",
                                          "stationary"])


def block_summary(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean iterations per block, fast-forwarded and stationary tokens per block."""
    return blocks.groupby("decoder").agg(blocks=("block", "size"), iterations_per_block=("iterations", "mean"),
                                         fast_forward_per_block=("fast_forward", "mean"),
                                         stationary_per_block=("stationary", "mean"))


@torch.no_grad()
def held_out_nll(loaded: dict[str, LoadedModel], rows: pd.DataFrame, prompts: Sequence[data.Prompt],
                 reference_decoder: str = lineups.BASE_AR) -> pd.DataFrame:
    """Mean NLL per token of the reference decoder's texts (the base model's greedy answers to
    held-out prompts) under each model: how much the CLLM drifted from the base as a language model."""
    reference = metrics.reference_tokens(rows, reference_decoder)
    records = []
    for prompt in prompts:
        for name, model in loaded.items():
            nll = quality.continuation_nll(model.model, data.encode(model.tokenizer, prompt), reference[prompt.id])
            records.append({"model": name, "prompt_id": prompt.id, "nll_per_token": float(nll.mean())})
    return pd.DataFrame(records)


# --- the cost curve: where parallel decoding can pay ------------------------------------------------

def relative_cost(curve: pd.DataFrame, n: int) -> float:
    """T(n) / T(1) from one model's curve, linear between measured n; NaN beyond the largest."""
    if n > curve.n.max():
        return float("nan")
    return metrics.cost_at(curve.set_index("n").relative_to_one, n)


def break_even_table(curves: pd.DataFrame, block_size: int, lookahead_configs) -> pd.DataFrame:
    """Per model: the tokens per forward at which each parallel method beats AR, T(n) / T(1) with n
    the tokens one pass carries: a Jacobi block of 8, 16 (and the profile's block size) or 32, and
    each lookahead config's 1 + (W + G)(N - 1)."""
    methods = {f"Jacobi, block of {b}": b for b in sorted({8, 16, 32, block_size})}
    for config in lookahead_configs:
        n = tokens_per_pass(config["window"], config["ngram_size"], config.get("candidates", config["window"]))
        methods[f"Lookahead {lineups.lookahead_label(config)}"] = n
    records = []
    for (model, dtype), curve in curves.groupby(["model", "dtype"], sort=False):
        for method, n in methods.items():
            records.append({"model": f"{model} ({dtype})", "method": method, "tokens_per_pass": n,
                            "break_even_tokens_per_forward": relative_cost(curve, n)})
    return pd.DataFrame(records)


def cllm_pick(break_even: pd.DataFrame, reachable: float = 1.5) -> pd.Series | None:
    """The (model, Jacobi block) the cost curve favours for a CLLM: among blocks that break even at
    or below `reachable` tokens per forward (what a CLLM should reach, the issue's target), the
    largest block, then the cheapest. None when no model's block is that cheap."""
    jacobi = break_even[break_even.method.str.startswith("Jacobi")]
    cheap = jacobi[jacobi.break_even_tokens_per_forward <= reachable]
    if cheap.empty:
        return None
    return cheap.sort_values(["tokens_per_pass", "break_even_tokens_per_forward"], ascending=[False, True]).iloc[0]


def cost_findings(tables: Tables, params: dict) -> str:
    be = tables.break_even
    own = be[be.model == f"{params['model']} ({params['dtype']})"].set_index("method").break_even_tokens_per_forward
    jacobi = f"Jacobi, block of {params['block_size']}"
    pick = cllm_pick(be)
    text = (f"A Jacobi iteration over a block of {params['block_size']} costs **{own[jacobi]:.2f}x** an AR step of "
            f"{params['model']} ({params['dtype']}) here, so Jacobi decoding or a CLLM on it needs more than "
            f"{own[jacobi]:.2f} tokens per forward to beat AR. ")
    if pick is None:
        return text + "No measured model has a Jacobi block that breaks even at 1.5 tokens per forward or less."
    text += (f"The cost curves favour **{pick.model}** with blocks of **{pick.tokens_per_pass}** for a CLLM: there a "
             f"block breaks even at {pick.break_even_tokens_per_forward:.2f} tokens per forward, the largest block "
             f"within the 1.5 tokens per forward a CLLM should reach. ")
    if pick.model == f"{params['model']} ({params['dtype']})":
        return text + "This profile trains that model."
    return text + (f"This profile trains {params['model']} all the same: the favoured model's training does not fit "
                   f"its budget (the `cpu-full` profile trains a larger one).")


# --- words and headline -----------------------------------------------------------------------------

def speedup_with_interval(line: pd.Series) -> str:
    """'0.85x (95% CI 0.80-0.91, 30 prompts)' from a summary table's line."""
    return f"{line.speedup:.2f}x (95% CI {line.speedup_low:.2f}-{line.speedup_high:.2f}, {int(line.prompts)} prompts)"


def headline(tables: Tables) -> dict:
    tpf, seen = tables.table.tokens_per_target_forward, tables.tokens_per_forward_by_prompts["training databases"]
    cllm = tables.table.loc[lineups.CLLM_JACOBI]
    line = {
        "Jacobi tokens/forward, base": round(float(tpf[lineups.BASE_JACOBI]), 3),
        "Jacobi tokens/forward, CLLM": round(float(tpf[lineups.CLLM_JACOBI]), 3),
        "Jacobi tokens/forward, CLLM on training prompts": round(float(seen[lineups.CLLM_JACOBI]), 3),
        "Jacobi (CLLM) speedup over AR (per token)": speedup_with_interval(cllm),
        "CLLM agreement with base greedy": round(float(tables.table.agreement[lineups.CLLM_JACOBI]), 3),
    }
    if tables.cllm_lookahead is not None:
        lookahead = tables.table.loc[tables.cllm_lookahead]
        line[f"{tables.cllm_lookahead}: tokens/forward"] = round(float(lookahead.tokens_per_target_forward), 3)
        line[f"{tables.cllm_lookahead}: speedup over AR (per token)"] = speedup_with_interval(lookahead)
    if tables.sql_accuracy is not None:
        accuracy, names = tables.sql_accuracy, accuracy_names(tables.sql_accuracy)
        shares = " / ".join(f"{accuracy.exact_match[method]:.2f}" for method in names)
        line["SQL exact match, " + " / ".join(names.values())] = f"{shares} ({int(accuracy.prompts.max())} prompts)"
    return line


def accuracy_names(accuracy: pd.DataFrame) -> dict[str, str]:
    """The models whose SQL accuracy is reported, by their method's row: the pretrained model (when
    04 fine-tunes it first), the base and the CLLM."""
    names = {lineups.PRETRAINED_AR: "pretrained", lineups.BASE_AR: "base", lineups.CLLM_JACOBI: "CLLM"}
    return {method: name for method, name in names.items() if method in accuracy.index}


def findings(tables: Tables, params: dict) -> str:
    table, stats, collected = tables.table, tables.block_stats, tables.collected
    tpf, seen = table.tokens_per_target_forward, tables.tokens_per_forward_by_prompts["training databases"]
    nll = tables.nll.groupby("model").nll_per_token.mean()
    cost = table.ms_per_forward[lineups.BASE_JACOBI] / table.ms_per_forward[lineups.BASE_AR]
    answers = tables.rows[tables.rows.decoder == lineups.CLLM_JACOBI].prompt_id.nunique()
    base, cllm = lineups.BASE_JACOBI, lineups.CLLM_JACOBI
    return (
        f"On {len(tables.held_out_set)} held-out prompts, Jacobi decoding of the base model makes **{tpf[base]:.2f}** "
        f"tokens per forward pass; after {len(tables.losses)} training steps on {collected['training_prompts']} prompts "
        f"({collected['degenerate_removed']} looping generations removed) the CLLM makes **{tpf[cllm]:.2f}** "
        f"(blocks of {params['block_size']}: {stats.iterations_per_block[base]:.1f} vs "
        f"{stats.iterations_per_block[cllm]:.1f} iterations per block). On "
        f"{tables.seen_and_held_out[tables.seen_and_held_out.prompts == 'training databases'].prompt_id.nunique()} of "
        f"its training prompts it makes {seen[cllm]:.2f} (base {seen[base]:.2f}). "
        f"A Jacobi iteration over the block costs {cost:.2f}x an AR step here ({params['dtype']}, {params['device']}), "
        f"so Jacobi pays only above about {cost:.2f} tokens per forward: measured speedup over AR is "
        f"{table.speedup[base]:.2f}x for the base model and {table.speedup[cllm]:.2f}x for the CLLM. "
        + cllm_lookahead_findings(tables)
        + f"Quality: the CLLM's greedy text matches the base model's on {table.agreement[cllm]:.0%} of its tokens "
        f"on average before the first difference; the NLL of the base model's held-out answers goes from "
        f"{nll['base']:.3f} to {nll['CLLM']:.3f} nats per token; {tables.looping} of the CLLM's {answers} held-out "
        f"answers loop (an 8-token sequence three times or more), which converges in few iterations."
        + accuracy_findings(tables, params))


def cllm_lookahead_findings(tables: Tables) -> str:
    """Lookahead decoding of the CLLM against AR, and its tokens per forward against the base model's
    lookahead at the same W, N, G ("" when it did not run)."""
    if tables.cllm_lookahead is None:
        return ""
    line, table = tables.table.loc[tables.cllm_lookahead], tables.table
    return (f"Lookahead decoding of the CLLM ({tables.cllm_lookahead}) makes **{line.tokens_per_target_forward:.2f}** "
            f"tokens per forward (the base model {table.tokens_per_target_forward[tables.base_lookahead]:.2f} at the "
            f"same W, N, G) at {line.ms_per_forward / table.ms_per_forward[lineups.BASE_AR]:.2f}x the time of an AR "
            f"step: **{line.speedup:.2f}x** AR (95% CI {line.speedup_low:.2f}-{line.speedup_high:.2f}). ")


def accuracy_findings(tables: Tables, params: dict) -> str:
    """SQL exact match of the base model and the CLLM, prompt by prompt, and of the pretrained model
    when the base was fine-tuned first ("" for a prompt set without reference answers)."""
    if tables.sql_accuracy is None:
        return ""
    accuracy, pairs = tables.sql_accuracy, tables.accuracy_pairs
    text = (f" Task quality: the generated SQL matches Spider's gold query (normalized string match) on "
            f"{accuracy.exact_match[lineups.BASE_AR]:.0%} of the held-out prompts for the base model and "
            f"{accuracy.exact_match[lineups.CLLM_JACOBI]:.0%} for the CLLM ({int(accuracy.prompts.max())} prompts, "
            f"{params['max_new_tokens']} tokens: a longer query is cut off and cannot match).")
    if pairs and sum(pairs.values()):
        text += (f" Prompt by prompt, the base model answers {pairs['only_first']} right that the CLLM gets wrong and "
                 f"the CLLM {pairs['only_second']} the other way ({pairs['both']} right in both, {pairs['neither']} in "
                 f"neither): one prompt is {100 / sum(pairs.values()):.0f} points of accuracy here.")
    if lineups.PRETRAINED_AR in accuracy_names(accuracy):
        per_step = params["sft_answers_per_step"]
        text += (f" The base model is {params['model']} after {params['sft_steps']} steps of fine-tuning ({per_step} "
                 f"answer{'s' * (per_step != 1)} each) on the gold SQL of the training databases; before them it "
                 f"matched {accuracy.exact_match[lineups.PRETRAINED_AR]:.0%}.")
    return text


def reference_findings(tables: Tables, params: dict) -> str:
    table = tables.reference_table
    parallel = table[table.index != lineups.BASE_AR]
    best = parallel.speedup.idxmax()
    lines = [f"Untrained {params['reference_model']} ({params['reference_dtype']}), {int(table.prompts.max())} "
             f"held-out prompts, {params['max_new_tokens']} tokens:"]
    for name, line in parallel.iterrows():
        cost = line.ms_per_forward / table.ms_per_forward[lineups.BASE_AR]
        lines.append(f"- {name}: **{line.tokens_per_target_forward:.2f}** tokens per forward at {cost:.2f}x the "
                     f"time of an AR step: **{line.speedup:.2f}x** AR (95% CI {line.speedup_low:.2f}-"
                     f"{line.speedup_high:.2f}), agreement with AR greedy {line.agreement:.2f}.")
    verdict = "pays" if parallel.speedup_low[best] > 1 else "does not pay beyond the noise"
    lines.append(f"\nThe best, {best}, {verdict} here: a pass must carry more tokens than it costs AR steps.")
    return "\n".join(lines)
