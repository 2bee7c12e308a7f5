"""Notebook 04's tables, computed from benchmark rows and cost curves: numbers only, tested on
synthetic rows. `cllm` runs the experiment; `cllm_words` says what these tables show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specdec_lab import cost_model, data, quality
from specdec_lab.cllm import trajectories
from specdec_lab.experiments import lineups
from specdec_lab.method import LookaheadConfig
from specdec_lab.result import JacobiStats


@dataclass
class Tables:
    train_set: list[data.Prompt]
    held_out_set: list[data.Prompt]
    collected: dict  # trajectory counts (trajectories.summary)
    losses: pd.DataFrame  # one row per optimizer step
    cllm_folder: Path
    rows: pd.DataFrame  # held-out rows: AR, Jacobi and lookahead of the base model and the CLLM
    table: pd.DataFrame  # one line per method, with ms_per_decode_forward
    blocks: pd.DataFrame  # one row per Jacobi block
    block_stats: pd.DataFrame  # per method: iterations, fast-forwarded, stationary tokens per block
    seen_and_held_out: pd.DataFrame  # Jacobi rows on training prompts and on held-out ones
    tokens_per_forward_by_prompts: pd.DataFrame  # method x (TRAINED_ON / HELD_OUT prompts)
    nll: pd.DataFrame  # NLL of the base model's held-out answers under base and CLLM
    looping: int  # CLLM held-out answers that loop
    cost_curves: pd.DataFrame  # T(n) per model: model, dtype, n, ms, relative_to_one
    break_even: pd.DataFrame  # per model and parallel method: tokens per forward needed to beat AR
    reference_precision: str | None = None  # what the reference model computed in: 'bf16', 'bf16 int4-wo'
    reference_table: pd.DataFrame | None = None  # AR vs lookahead (vs Jacobi) on an untrained larger model
    reference_blocks: pd.DataFrame | None = None
    forward_check: pd.DataFrame | None = None  # per method: decode ms per forward beside T(n) at its n (held out)
    reference_forward_check: pd.DataFrame | None = None  # the same on the reference model
    answer_key: quality.AnswerKey | None = None  # the prompt set's gold answers and how they are matched
    accuracy: pd.DataFrame | None = None  # per method: the share of its held-out answers that are right
    accuracy_pairs: dict | None = None  # base vs CLLM prompt by prompt (`paired_answers`)
    learning_curve: pd.DataFrame | None = None  # per recipe and checkpoint (`learning_curve_table`)
    choice: Choice | None = None  # the checkpoint the learning curves chose as the CLLM (`chosen_checkpoint`)
    validation_set: list[data.Prompt] | None = None  # the held-out prompts the learning curves were read on
    cllm_recipe: str = ""  # the CLLM's training recipe (`TrainConfig.recipe`) and the step it was taken at
    cllm_step: int = 0
    cllm_lookahead: str | None = None  # the method name of lookahead decoding on the CLLM, when run
    base_lookahead: str | None = None  # and of lookahead on the base model with the same W, N, G
    token_views: object = None  # the first held-out prompt, every method's text coloured by token origin (HTML)
    trajectories: object = None  # one block of that prompt converging, base model and CLLM (HTML)


# the two sides of the split: prompts the CLLM trained on, and held-out ones whose databases (Spider) or
# templates (math) it never saw
TRAINED_ON, HELD_OUT = "trained on", "held out"


def groups(prompts: Sequence[data.Prompt]) -> list[str]:
    return sorted({p.group for p in prompts})


def ms_per_decode_forward(rows: pd.DataFrame) -> pd.Series:
    """Per method: decode time per target forward (ms), all samples pooled:
    sum(wall - time to first token) / sum(forwards - 1). The first forward is the prefill, over the
    whole prompt: counted in, it makes a method's forwards look dearer the longer its prompts and the
    fewer its forwards, and a forward could no longer be set beside T(n) at the method's n."""
    decoding = rows.assign(decode_s=rows.wall_time_s - rows.time_to_first_token_s,
                           decode_forwards=rows.target_forwards - 1)
    totals = decoding[decoding.decode_forwards > 0].groupby("decoder")[["decode_s", "decode_forwards"]].sum()
    return 1000 * totals.decode_s / totals.decode_forwards


FORWARD_COST_TOLERANCE = 0.10  # a parallel decoder's forward should cost at most this much above T(n) at its n


def forward_sizes(rows: pd.DataFrame) -> list[int]:
    """Every n a decode forward of these rows fed (`forward_tokens`), with n = 1 (AR's): the n at which
    `forward_cost_check` needs T(n) measured."""
    sizes = {int(n) for tokens in rows.get("forward_tokens", pd.Series(dtype=object)).dropna() for n in tokens}
    return sorted(sizes | {1})


def forward_cost_check(rows: pd.DataFrame, curve: pd.DataFrame) -> pd.DataFrame:
    """Per method that recorded its forwards' sizes: its decode time per forward (`ms_per_decode_forward`)
    beside the cost curve's T(n) at the n each of its forwards fed (`curve` measured at those n, in the
    same process: mean of T(n_i) over the forwards), and their ratio. A ratio above 1 is what the
    decode loop adds to the forward the hardware allows (argmax, cache bookkeeping, a wider pass than
    planned); AR's own ratio is the loop's share at n = 1.

    `over_curve_at_ar_step` reads the curve for its shape only: T(n)/T(1) times AR's own decode forward,
    measured interleaved with the method's. The curve is timed after the rows, and a machine whose speed
    drifts between the two moves every `forward_over_curve` alike; this ratio cancels that drift, and
    the loop's share at n = 1 with it: above 1 is what a parallel decoder adds beyond AR's loop."""
    measured = ms_per_decode_forward(rows)
    t_of = curve.set_index("n").ms_fit
    records = []
    for decoder, group in rows.groupby("decoder", sort=False):
        sizes = [n for tokens in group.forward_tokens if isinstance(tokens, list) for n in tokens]
        if not sizes or decoder not in measured or any(n not in t_of.index for n in sizes):
            continue
        curve_ms = sum(t_of[n] for n in sizes) / len(sizes)
        records.append({"decoder": decoder, "mean_tokens_per_forward_fed": sum(sizes) / len(sizes),
                        "largest_forward": max(sizes), "ms_per_decode_forward": measured[decoder],
                        "curve_ms": curve_ms, "forward_over_curve": measured[decoder] / curve_ms})
    check = pd.DataFrame(records, columns=["decoder", "mean_tokens_per_forward_fed", "largest_forward",
                                           "ms_per_decode_forward", "curve_ms", "forward_over_curve"]).set_index("decoder")
    ar_ratio = check.forward_over_curve.get(lineups.BASE_AR, float("nan"))
    return check.assign(over_curve_at_ar_step=check.forward_over_curve / ar_ratio)


def extra_memory(table: pd.DataFrame, baseline: str, extra_weights_bytes: dict[str, int]) -> pd.Series:
    """Per method: the memory it needs at inference beyond the baseline's (MB): the weights of any
    model it runs beside the target (a draft's; a CLLM replaces the base, so none), plus its peak while
    decoding above the baseline's (a draft's cache, lookahead's wider passes; RSS on a CPU, never below 0)."""
    above = (table.peak_memory_mb - table.peak_memory_mb[baseline]).clip(lower=0)
    weights = pd.Series({name: extra_weights_bytes.get(name, 0) / 2**20 for name in table.index})
    return (weights + above.fillna(0)).rename("extra_memory_mb")


def looping_answers(rows: pd.DataFrame, decoder: str) -> int:
    """How many of `decoder`'s answers (one per prompt) loop; a loop converges in few iterations,
    so looping answers inflate tokens per forward."""
    answers = rows[rows.decoder == decoder].drop_duplicates("prompt_id").tokens
    return int(answers.map(trajectories.is_degenerate).sum())


def seen_and_held_out(seen: pd.DataFrame, held_out: pd.DataFrame) -> pd.DataFrame:
    """The Jacobi rows on training prompts and on held-out ones, labelled in a `prompts` column. A
    CLLM that gains on the prompts it trained on but not on new ones has learned them, not the task."""
    held_out = held_out[held_out.decoder.isin(set(seen.decoder))]
    both = pd.concat([seen.assign(prompts=TRAINED_ON), held_out.assign(prompts=HELD_OUT)])
    return both[both.role == "parallel"].reset_index(drop=True)


def answer_matches(rows: pd.DataFrame, key: quality.AnswerKey) -> pd.Series:
    """(method, prompt id) -> whether its held-out answer (first repeat) is right by the prompt set's
    answer key (Spider's gold query, a math problem's final number), in the rows' order of methods."""
    answers = rows[rows.repeat == 0].drop_duplicates(["decoder", "prompt_id"])
    return pd.Series([key.matches(text, key.gold[prompt_id])
                      for text, prompt_id in zip(answers.text, answers.prompt_id)],
                     index=pd.MultiIndex.from_arrays([answers.decoder, answers.prompt_id]))


def accuracy(rows: pd.DataFrame, key: quality.AnswerKey) -> pd.DataFrame:
    """Per method: the share of its held-out answers that are right, and the prompt count. The
    lossless methods answer as the base model does; the CLLM answers as itself."""
    matches = answer_matches(rows, key).astype(float).groupby(level="decoder", sort=False)
    return pd.DataFrame({"exact_match": matches.mean(), "prompts": matches.size()})


def learning_curve_table(rows: pd.DataFrame, key: quality.AnswerKey | None, answers: pd.Series) -> pd.DataFrame:
    """Per recipe and training step (`recipe`, `step`, `folder` and `nll_per_token` columns on Jacobi rows of
    the validation prompts; step 0 is the base model): tokens per forward (mean over prompts, first repeat),
    the share of answers that are right (NaN for a prompt set without an answer key), the agreement of
    the text with the base model's greedy `answers` (prompt id -> tokens; the share before the first
    difference, as the held-out tables count it), the mean NLL of those answers, the answers that loop,
    the prompt count and the checkpoint's folder."""
    records = []
    for (recipe, step), group in rows[rows.repeat == 0].groupby(["recipe", "step"], sort=False):
        right = float(answer_matches(group, key).mean()) if key is not None else float("nan")
        agreement = [quality.greedy_agreement(answers[p], tokens).fraction
                     for p, tokens in zip(group.prompt_id, group.tokens)]
        records.append({"recipe": recipe, "step": int(step), "tokens_per_target_forward": group.tokens_per_target_forward.mean(),
                        "exact_match": right, "agreement": sum(agreement) / len(agreement),
                        "nll_per_token": group.nll_per_token.mean(),
                        "looping": int(group.tokens.map(trajectories.is_degenerate).sum()),
                        "prompts": group.prompt_id.nunique(), "folder": group.folder.iloc[0]})
    return pd.DataFrame(records, columns=["recipe", "step", "tokens_per_target_forward", "exact_match", "agreement",
                                          "nll_per_token", "looping", "prompts", "folder"])


@dataclass(frozen=True)
class Choice:
    """The checkpoint taken as the CLLM: its recipe, step and folder; the NLL it had to stay within (the
    base model's plus the allowed rise), and whether any trained checkpoint did."""

    recipe: str
    step: int
    folder: str
    nll_limit: float
    kept_the_text: bool


def chosen_checkpoint(curve: pd.DataFrame, max_nll_rise: float) -> Choice:
    """The recipe and step a CLLM is taken at, read from the learning curves: of the trained checkpoints
    that kept the base model's text (the NLL of its greedy answers at most `max_nll_rise` nats a token
    above the base model's own, and no more looping answers than it), the one with the most tokens per
    forward, the earlier on a tie. Where none kept the text, the one that drifted least
    (`kept_the_text` False): a CLLM is a trained model, and the tables say how far it drifted."""
    base = curve[curve.step == 0].iloc[0]
    trained = curve[curve.step > 0]
    if trained.empty:
        raise ValueError("no trained checkpoint in the learning curve: train_steps must be >= 1")
    limit = float(base.nll_per_token) + max_nll_rise
    kept = trained[(trained.nll_per_token <= limit) & (trained.looping <= base.looping)]
    if kept.empty:
        best = trained.sort_values(["nll_per_token", "step"], kind="stable").iloc[0]
    else:
        best = kept.assign(fewer_tokens=-kept.tokens_per_target_forward).sort_values(
            ["fewer_tokens", "step"], kind="stable").iloc[0]
    return Choice(best.recipe, int(best.step), best.folder, limit, not kept.empty)


CLLM_GOAL_TOKENS_PER_FORWARD = 2.0  # what a CLLM should reach on held-out math (the parallel-decoding issue's target)


@dataclass
class LearningTrend:
    """What the learning curve says about more training: tokens per forward at the first and last
    checkpoints, the slope over the later half of training (per 100 steps), and the steps a straight
    continuation of that slope would need to reach `goal` (None where the slope is not positive)."""

    first: float
    last: float
    last_step: int
    slope_per_100_steps: float
    goal: float
    steps_to_goal: float | None


def learning_trend(curve: pd.DataFrame, goal: float = CLLM_GOAL_TOKENS_PER_FORWARD) -> LearningTrend | None:
    """The trend of `learning_curve_table`'s tokens per forward: a least-squares line through the
    checkpoints of the later half of training (at least the last two). None with fewer than two."""
    curve = curve.sort_values("step")
    if len(curve) < 2:
        return None
    later = curve[curve.step >= curve.step.max() / 2]
    later = later if len(later) >= 2 else curve.tail(2)
    steps, tpf = later.step.astype(float), later.tokens_per_target_forward.astype(float)
    slope = float(((steps - steps.mean()) * (tpf - tpf.mean())).sum() / ((steps - steps.mean()) ** 2).sum())
    last = float(curve.tokens_per_target_forward.iloc[-1])
    to_goal = 0.0 if last >= goal else ((goal - last) / slope if slope > 0 else None)
    return LearningTrend(float(curve.tokens_per_target_forward.iloc[0]), last, int(curve.step.iloc[-1]), 100 * slope,
                         goal, to_goal)


def paired_answers(rows: pd.DataFrame, key: quality.AnswerKey, first: str, second: str) -> dict[str, int]:
    """How two methods' held-out answers (first repeat) compare prompt by prompt: right in both, only
    in `first`, only in `second`, in neither. Two accuracies from the same few prompts differ by the
    prompts one gets right and the other wrong; these counts say how many that is."""
    matches = answer_matches(rows[rows.decoder.isin([first, second])], key)
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


def relative_cost(curve: pd.DataFrame, n: int) -> float:
    """T(n) / T(1) from one model's curve, linear between measured n; NaN beyond the largest."""
    if n > curve.n.max():
        return float("nan")
    return cost_model.cost_at(curve.set_index("n").relative_to_one, n)


def break_even_table(curves: pd.DataFrame, block_size: int, lookahead_configs) -> pd.DataFrame:
    """Per model: the tokens per forward at which each parallel method beats AR, T(n) / T(1) with n
    the tokens one pass carries: a Jacobi block of 8, 16 (and the profile's block size) or 32, and
    each lookahead config's 1 + (W + G)(N - 1)."""
    methods = {f"Jacobi, block of {b}": b for b in sorted({8, 16, 32, block_size})}
    for config in map(LookaheadConfig.from_mapping, lookahead_configs):
        methods[f"Lookahead {config.label()}"] = config.tokens_per_pass
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


def accuracy_names(accuracy: pd.DataFrame) -> dict[str, str]:
    """The models whose task accuracy is reported, by their method's row: the pretrained model (when
    04 fine-tunes it first), the base and the CLLM."""
    names = {lineups.PRETRAINED_AR: "pretrained", lineups.BASE_AR: "base", lineups.CLLM_JACOBI: "CLLM"}
    return {method: name for method, name in names.items() if method in accuracy.index}


def jacobi_numbers(tables: Tables) -> dict:
    """What the findings say of Jacobi decoding, the base model against the CLLM: tokens per forward
    (held out and on training prompts), iterations per block, the cost of a Jacobi forward against
    an AR one, speedups, agreement, NLL and looping answers."""
    table, base, cllm = tables.table, lineups.BASE_JACOBI, lineups.CLLM_JACOBI
    seen = tables.tokens_per_forward_by_prompts[TRAINED_ON]
    nll = tables.nll.groupby("model").nll_per_token.mean()
    trained_on = tables.seen_and_held_out[tables.seen_and_held_out.prompts == TRAINED_ON]
    return {
        "held_out_prompts": len(tables.held_out_set), "training_steps": tables.cllm_step,
        "training_prompts": tables.collected["training_prompts"], "looping_removed": tables.collected["degenerate_removed"],
        "base_tpf": table.tokens_per_target_forward[base], "cllm_tpf": table.tokens_per_target_forward[cllm],
        "base_iterations": tables.block_stats.iterations_per_block[base],
        "cllm_iterations": tables.block_stats.iterations_per_block[cllm],
        "seen_prompts": trained_on.prompt_id.nunique(), "base_seen_tpf": seen[base], "cllm_seen_tpf": seen[cllm],
        "jacobi_cost": table.ms_per_decode_forward[base] / table.ms_per_decode_forward[lineups.BASE_AR],
        "base_speedup": table.speedup[base], "cllm_speedup": table.speedup[cllm],
        "cllm_agreement": table.agreement[cllm], "base_nll": nll["base"], "cllm_nll": nll["CLLM"],
        "looping": tables.looping, "cllm_answers": tables.rows[tables.rows.decoder == cllm].prompt_id.nunique(),
    }
