"""Notebook 04: Jacobi decoding and a consistency LLM (CLLM). Collect the base model's Jacobi
trajectories, fine-tune the CLLM on them, then measure AR vs Jacobi (base) vs Jacobi (CLLM) on
held-out databases: tokens per forward, speed, per-block statistics, and the quality drift."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd
import torch

from specdec_lab import data, metrics, models, quality
from specdec_lab.cllm import train, trajectories
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
    rows: pd.DataFrame  # held-out rows: AR, Jacobi (base), Jacobi (CLLM)
    table: pd.DataFrame  # one line per method, with ms_per_forward
    blocks: pd.DataFrame  # one row per Jacobi block
    block_stats: pd.DataFrame  # per method: iterations, fast-forwarded, stationary tokens per block
    seen_and_held_out: pd.DataFrame  # Jacobi rows on training prompts and on held-out ones
    tokens_per_forward_by_prompts: pd.DataFrame  # method x (training / held-out databases)
    nll: pd.DataFrame  # NLL of the base model's held-out answers under base and CLLM
    looping: int  # CLLM held-out answers that loop
    reference_table: pd.DataFrame | None = None  # Jacobi on an untrained larger model
    reference_blocks: pd.DataFrame | None = None


def groups(prompts: Sequence[data.Prompt]) -> list[str]:
    return sorted({p.group for p in prompts})


def split(params: dict) -> tuple[list[data.Prompt], list[data.Prompt]]:
    """Training and held-out prompts from disjoint databases, each spread round-robin over its databases."""
    train_set, held_out_set = data.split_by_group(data.load_prompts(params["prompt_set"]), params["held_out_fraction"],
                                                  seed=params["seed"])
    by_database = lambda prompt: prompt.group  # noqa: E731
    return (data.round_robin(train_set, by_database)[:params["train_prompts"]],
            data.round_robin(held_out_set, by_database)[:params["eval_prompts"]])


def train_config(params: dict) -> train.TrainConfig:
    """The notebook's training parameters, named as TrainConfig names them (`train_steps` -> steps)."""
    names = {field.name for field in fields(train.TrainConfig)}
    return train.TrainConfig(steps=params["train_steps"], **{k: v for k, v in params.items() if k in names - {"steps"}})


def run(params: dict) -> Tables:
    model, dtype, device = params["model"], params["dtype"], params["device"]
    base = models.load(model, dtype=dtype, device=device)
    train_set, held_out_set = split(params)
    print(f"training: {len(train_set)} prompts over {len(groups(train_set))} databases")
    print(f"held out: {len(held_out_set)} prompts over databases never trained on: {', '.join(groups(held_out_set))}")

    records = trajectories.collect(base.model, base.tokenizer, train_set,
                                   common.results_file(params, NOTEBOOK, "trajectories.jsonl"),
                                   params["max_new_tokens"], params["block_size"], params["init"], params["seed"],
                                   config={"model": model, "dtype": dtype})
    kept, _ = trajectories.usable(records)
    config = train_config(params)
    run_dir = train.run_folder(common.results_file(params, NOTEBOOK, "runs"), model, kept, config, dtype)
    cllm_folder = train.train(model, kept, run_dir, config, dtype=dtype, cpu=device == "cpu")
    cllm = models.load(str(cllm_folder), dtype=dtype, device=device)
    losses = pd.DataFrame(train.read_losses(run_dir))
    print(f"CLLM in {cllm_folder}; {len(losses)} steps, {losses.step_s.sum() / 60:.1f} min of training")

    measured = {**params, "cllm": cllm_folder.parent.name}
    methods = lineups.cllm(base, cllm, params["max_new_tokens"], params["block_size"], params["init"])
    rows = bench.run(methods, held_out_set, base.tokenizer, out=common.results_file(params, NOTEBOOK, "held_out.jsonl"),
                     repeats=params["repeats"], warmup=params["warmup"], config=measured, desc="held-out")
    table = metrics.summary(rows, baseline=lineups.BASE_AR)
    summary = common.summary_lines(table, methods)
    table["ms_per_forward"] = ms_per_forward(rows)
    blocks = block_table(rows[rows.role == "parallel"])

    trained_on = {record["prompt_id"] for record in kept}  # looping generations were left out of training
    seen_rows = bench.run(lineups.cllm(base, cllm, params["max_new_tokens"], params["block_size"], params["init"],
                                       with_ar=False),
                          [p for p in train_set if p.id in trained_on][:params["eval_prompts"]], base.tokenizer,
                          out=common.results_file(params, NOTEBOOK, "training_prompts.jsonl"), repeats=1, warmup=0,
                          config=measured, desc="training prompts")
    both = seen_and_held_out(seen_rows, rows)
    tables = Tables(
        train_set, held_out_set, trajectories.summary(records), losses, cllm_folder, rows, table, blocks,
        block_summary(blocks), both,
        both.pivot_table(index="decoder", columns="prompts", values="tokens_per_target_forward"),
        held_out_nll({"base": base, "CLLM": cllm}, rows, held_out_set), looping_answers(rows, lineups.CLLM_JACOBI))
    common.write_outputs(params, NOTEBOOK, summary, headline(tables), model=model, dtype=dtype)
    del cllm, methods
    if params["reference_model"]:
        reference_model(params, held_out_set, tables)
    return tables


def reference_model(params: dict, held_out_set: list[data.Prompt], tables: Tables) -> None:
    """Jacobi decoding on an untrained (larger) model: what it gives a plain model of that size."""
    reference = models.load(params["reference_model"], dtype=params["reference_dtype"], device=params["device"])
    rows = bench.run(lineups.cllm(reference, None, params["max_new_tokens"], params["block_size"], params["init"]),
                     held_out_set[:params["reference_prompts"]], reference.tokenizer,
                     out=common.results_file(params, NOTEBOOK, "reference_model.jsonl"),
                     repeats=1, warmup=params["warmup"], config=params, desc=params["reference_model"])
    tables.reference_table = metrics.summary(rows, baseline=lineups.BASE_AR)
    tables.reference_blocks = block_summary(block_table(rows[rows.role == "parallel"]))


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
    both = pd.concat([seen.assign(prompts="training databases"), held_out.assign(prompts="held-out databases")])
    return both[both.role == "parallel"].reset_index(drop=True)


def block_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per Jacobi block: iterations to converge, fast-forwarded and stationary tokens."""
    records = []
    for row in rows.itertuples():
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


# --- words and headline -----------------------------------------------------------------------------

def headline(tables: Tables) -> dict:
    tpf, seen = tables.table.tokens_per_target_forward, tables.tokens_per_forward_by_prompts["training databases"]
    cllm = tables.table.loc[lineups.CLLM_JACOBI]
    return {
        "Jacobi tokens/forward, base": round(float(tpf[lineups.BASE_JACOBI]), 3),
        "Jacobi tokens/forward, CLLM": round(float(tpf[lineups.CLLM_JACOBI]), 3),
        "Jacobi tokens/forward, CLLM on training prompts": round(float(seen[lineups.CLLM_JACOBI]), 3),
        "Jacobi (CLLM) speedup over AR (per token)": (f"{cllm.speedup:.2f}x (95% CI {cllm.speedup_low:.2f}-"
                                                      f"{cllm.speedup_high:.2f}, {int(cllm.prompts)} prompts)"),
        "CLLM agreement with base greedy": round(float(tables.table.agreement[lineups.CLLM_JACOBI]), 3),
    }


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
        f"Quality: the CLLM's greedy text matches the base model's on {table.agreement[cllm]:.0%} of its tokens "
        f"on average before the first difference; the NLL of the base model's held-out answers goes from "
        f"{nll['base']:.3f} to {nll['CLLM']:.3f} nats per token; {tables.looping} of the CLLM's {answers} held-out "
        f"answers loop (an 8-token sequence three times or more), which converges in few iterations.")


def reference_findings(tables: Tables, params: dict) -> str:
    table, blocks = tables.reference_table, tables.reference_blocks
    return (f"Untrained {params['reference_model']} ({params['reference_dtype']}): "
            f"**{table.tokens_per_target_forward[lineups.BASE_JACOBI]:.2f}** tokens per Jacobi iteration, "
            f"{blocks.iterations_per_block[lineups.BASE_JACOBI]:.1f} iterations per {params['block_size']}-token block, "
            f"{table.speedup[lineups.BASE_JACOBI]:.2f}x the speed of AR.")
