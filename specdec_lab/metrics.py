"""Numbers derived from benchmark rows (one row = one GenerationResult of one decoder, prompt, repeat).

A speedup compares time per generated token, measured side by side in one run: per prompt and
repeat, the baseline's ms/token over the method's (two runs that stop at different lengths are still
compared fairly; the end-to-end latency ratio is reported apart, with a count of the pairs whose
lengths differ). Every aggregate over prompts is a geometric mean (ratios multiply) of the
per-prompt medians over repeats, and carries a 95% bootstrap interval over prompts.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specdec_lab.quality import greedy_agreement


def reference_tokens(rows: pd.DataFrame, decoder: str) -> pd.Series:
    """prompt_id -> the tokens `decoder` generated in repeat 0 (the reference text of agreement)."""
    reference = rows[(rows.decoder == decoder) & (rows.repeat == 0)].set_index("prompt_id").tokens
    if reference.empty:
        raise ValueError(f"reference decoder {decoder!r} has no rows; decoders present: {sorted(rows.decoder.unique())}")
    return reference


def add_agreement(rows: pd.DataFrame, reference_decoder: str | None = None,
                  reference: pd.Series | None = None, prefix: str = "") -> pd.DataFrame:
    """Token agreement of every row with a reference text on the same prompt (the reference
    decoder's repeat-0 output, or a given prompt_id -> tokens Series): `full_match`,
    `first_divergence` (None = identical) and `agreement` (matching prefix / reference length),
    each name preceded by `prefix`. Rows of prompts without a reference get NaN."""
    if reference is None:
        reference = reference_tokens(rows, reference_decoder)
    out = rows.copy()
    scores = [greedy_agreement(reference[p], t) if p in reference.index else None
              for t, p in zip(out.tokens, out.prompt_id)]
    out[prefix + "first_divergence"] = [s.first_divergence if s else None for s in scores]
    out[prefix + "full_match"] = [s.full_match if s else float("nan") for s in scores]
    out[prefix + "agreement"] = [s.fraction if s else float("nan") for s in scores]
    return out


def _with_lengths(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    if "num_tokens" not in rows:
        rows["num_tokens"] = rows.tokens.map(len)
    if "ms_per_token" not in rows:
        rows["ms_per_token"] = 1000 * rows.wall_time_s / rows.num_tokens.clip(lower=1)
    return rows


def speedups(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One line per (decoder, prompt, repeat): `speedup` = the baseline's ms per generated token in
    the same prompt and repeat over the decoder's; `latency_ratio` = baseline wall time over the
    decoder's (end to end, whatever each generated); `same_length` = both generated as many tokens."""
    rows = _with_lengths(rows)
    base = rows[rows.decoder == baseline].set_index(["prompt_id", "repeat"])[["ms_per_token", "wall_time_s", "num_tokens"]]
    if base.empty:
        raise ValueError(f"baseline decoder {baseline!r} has no rows; decoders present: {sorted(rows.decoder.unique())}")
    joined = rows.join(base.add_prefix("baseline_"), on=["prompt_id", "repeat"])
    joined["speedup"] = joined.baseline_ms_per_token / joined.ms_per_token
    joined["latency_ratio"] = joined.baseline_wall_time_s / joined.wall_time_s
    joined["same_length"] = joined.num_tokens == joined.baseline_num_tokens
    return joined[["decoder", "prompt_id", "category", "repeat", "speedup", "latency_ratio", "same_length"]]


def geometric_mean(values) -> float:
    values = [v for v in values if v and v > 0 and not math.isnan(v)]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def bootstrap_interval(per_prompt, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric mean over prompts (prompts resampled with
    replacement; a fixed seed keeps reports reproducible). NaN with fewer than 2 prompts: one
    prompt says nothing about the spread."""
    logs = np.log([v for v in per_prompt if v and v > 0 and not math.isnan(v)])
    if len(logs) < 2:
        return float("nan"), float("nan")
    draws = np.random.default_rng(seed).choice(logs, size=(resamples, len(logs)), replace=True).mean(axis=1)
    tail = 100 * (1 - level) / 2
    return float(np.exp(np.percentile(draws, tail))), float(np.exp(np.percentile(draws, 100 - tail)))


def decode_tokens_per_second(rows: pd.DataFrame) -> pd.Series:
    """Per row: tokens after the first over the time after the first, i.e. decoding alone, the
    regime the memory-bandwidth bound describes (one read of the weights per step). The prefill
    is compute-bound and its cost differs a lot between backends (int4 kernels widen every weight for
    every prompt row), so it must not be charged to the decode loop's distance from that bound."""
    num_tokens = rows.tokens.map(len) if "num_tokens" not in rows else rows.num_tokens
    decoding_s = rows.wall_time_s - rows.time_to_first_token_s
    return ((num_tokens - 1) / decoding_s).where((num_tokens > 1) & (decoding_s > 0))


def per_prompt(values: pd.DataFrame, column: str) -> pd.DataFrame:
    """The median of `column` over repeats, per (decoder, prompt)."""
    return values.groupby(["decoder", "prompt_id"], sort=False)[column].median().reset_index()


def aggregate(values: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per decoder: geometric mean over prompts of the per-prompt median of `column`, its 95%
    bootstrap interval (`<column>_low`, `<column>_high`) and the number of prompts."""
    records = []
    for decoder, group in per_prompt(values, column).groupby("decoder", sort=False):
        low, high = bootstrap_interval(group[column])
        records.append({"decoder": decoder, column: geometric_mean(group[column]), f"{column}_low": low,
                        f"{column}_high": high, "prompts": group.prompt_id.nunique()})
    return pd.DataFrame(records).set_index("decoder")


def speedup_table(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per decoder: speedup (per-token time ratio; geometric mean over prompts) with its 95%
    interval and prompt count, the end-to-end latency ratio, and how many pairs differ in length."""
    speed = speedups(rows, baseline)
    table = aggregate(speed, "speedup")
    table["latency_ratio"] = aggregate(speed, "latency_ratio").latency_ratio
    table["pairs"] = speed.groupby("decoder").size()
    table["pairs_of_other_length"] = speed.groupby("decoder").same_length.apply(lambda same: int((~same).sum()))
    return table


def summary(rows: pd.DataFrame, baseline: str, reference: str | None = None) -> pd.DataFrame:
    """One line per decoder: speedup over `baseline` with its interval and prompt count, tokens/s
    (aggregated like the speedup: geometric mean over prompts), tokens per target forward,
    acceptance, agreement with `reference` (default: the baseline), memory."""
    rows = add_agreement(_with_lengths(rows), reference or baseline)
    table = rows.groupby("decoder", sort=False).agg(
        time_to_first_token_s=("time_to_first_token_s", "median"),
        tokens_per_target_forward=("tokens_per_target_forward", "mean"),
        acceptance_rate=("acceptance_rate", "mean"),
        agreement=("agreement", "mean"),
        full_match_rate=("full_match", "mean"),
        peak_memory_mb=("peak_memory_bytes", lambda b: b.max() / 2**20),
        samples=("tokens", "size"),
    )
    speed = speedup_table(rows, baseline)
    table = table.join(speed).join(aggregate(rows, "tokens_per_second")[["tokens_per_second"]])
    table["ms_per_token"] = 1000 / table.tokens_per_second
    first = ["speedup", "speedup_low", "speedup_high", "prompts", "tokens_per_second"]
    return table[first + [c for c in table.columns if c not in first]]


def acceptance_by_position(rows: pd.DataFrame) -> pd.DataFrame:
    """P(draft token i is accepted | tokens 1..i-1 were accepted and token i was proposed), i = 1..k,
    per decoder: the per-position rate, counted over the steps that reached position i."""
    records = []
    for decoder, group in rows.groupby("decoder"):
        steps = [(a, p) for accepted, proposed in zip(group.accepted_per_step, group.proposed_per_step)
                 for a, p in zip(accepted, proposed)]
        for position in range(1, max((p for _, p in steps), default=0) + 1):
            reached = [a for a, p in steps if p >= position and a >= position - 1]
            if reached:
                records.append({"decoder": decoder, "position": position, "steps": len(reached),
                                "acceptance": sum(a >= position for a in reached) / len(reached)})
    return pd.DataFrame(records, columns=["decoder", "position", "steps", "acceptance"])


def acceptance_alpha(accepted_per_step, proposed_per_step) -> float:
    """Per-token acceptance probability alpha (Leviathan's i.i.d. model) from the counts actually
    proposed: accepted tokens / (accepted tokens + rejections), a rejection being a step that kept
    fewer than it proposed. Steps near the end propose fewer tokens and count as they were."""
    accepted = rejected = 0
    for kept_steps, proposed_steps in zip(accepted_per_step, proposed_per_step):
        for kept, proposed in zip(kept_steps, proposed_steps):
            accepted += kept
            rejected += kept < proposed
    return accepted / (accepted + rejected) if accepted + rejected else float("nan")


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al. (2023), eq. 1: expected walltime improvement with acceptance rate alpha,
    draft length k and c = draft step time / target step time."""
    if alpha >= 1.0:
        return (k + 1) / (k * cost_ratio + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost_ratio + 1))


def cost_at(curve: pd.Series, n: float) -> float:
    """T(n) (or T(n) / T(1)) from a curve indexed by n: linear between measured n, flat beyond its ends."""
    curve = curve.sort_index()
    return float(np.interp(n, curve.index.to_numpy(dtype=float), curve.to_numpy(dtype=float)))


def predicted_speedup_from_costs(alpha: float, k: int, target_ms: pd.Series, draft_ms_per_token: float) -> float:
    """Leviathan's expected tokens per step, (1 - alpha^(k+1)) / (1 - alpha), with each step's
    measured cost: k draft tokens plus one target forward over k + 1 tokens, T(k+1), against T(1)
    per token for AR. `target_ms` is T(n) indexed by n (linearly interpolated between measured n).
    With T(k+1) = T(1) and draft = c * T(1) this is eq. 1 (`predicted_speedup`)."""
    if 1 not in target_ms.index or not k + 1 <= target_ms.index.max():  # never extrapolated
        raise ValueError(f"need T(1) and T(n) up to n = k + 1 = {k + 1}, measured n: {sorted(target_ms.index)}: "
                         "measure the cost curve over a range that covers the draft lengths")
    tokens = k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens * cost_at(target_ms, 1) / (k * draft_ms_per_token + cost_at(target_ms, k + 1))


def best_k_from_costs(alpha: float, target_ms: pd.Series, draft_ms_per_token: float) -> tuple[int, float]:
    """The draft length with the highest `predicted_speedup_from_costs` among those the cost curve
    covers (k + 1 <= the largest measured n), and that speedup."""
    k_values = range(1, int(target_ms.index.max()))
    predicted = {k: predicted_speedup_from_costs(alpha, k, target_ms, draft_ms_per_token) for k in k_values}
    best = max(predicted, key=predicted.get)
    return best, predicted[best]


def cost_ratio(draft_ar_rows: pd.DataFrame, target_ar_rows: pd.DataFrame) -> float:
    """c = draft step time / target step time, from plain AR runs of both models (median ms/token)."""
    return float(draft_ar_rows.ms_per_token.median() / target_ar_rows.ms_per_token.median())


def recommended_k(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per prompt category, the draft length k with the highest measured speedup (geometric mean
    over prompts), with its interval and prompt count. `sweep` has one row per (k, prompt, repeat)."""
    records = []
    for (category, k), group in sweep.groupby(["category", "k"]):
        speed = group.groupby("prompt_id").speedup.median()
        low, high = bootstrap_interval(speed)
        records.append({"category": category, "k": k, "speedup": geometric_mean(speed), "speedup_low": low,
                        "speedup_high": high, "prompts": len(speed)})
    by_k = pd.DataFrame(records)
    best = by_k.loc[by_k.groupby("category").speedup.idxmax()]
    return best.rename(columns={"k": "recommended_k"}).reset_index(drop=True)


def k_sweep(rows: pd.DataFrame, k_of: dict[str, int], baseline: str, c: float) -> pd.DataFrame:
    """Measured speedup per (k, prompt, repeat) beside Leviathan's prediction, which uses the
    per-token acceptance alpha counted per (k, category) from the tokens actually proposed, and the
    measured cost ratio c (draft step / target step)."""
    sweep = speedups(rows[rows.decoder.isin([*k_of, baseline])], baseline)
    sweep = sweep[sweep.decoder.isin(list(k_of))].copy()
    sweep["k"] = sweep.decoder.map(k_of)
    alpha = {key: acceptance_alpha(group.accepted_per_step, group.proposed_per_step)
             for key, group in rows[rows.decoder.isin(list(k_of))].groupby(["decoder", "category"])}
    sweep["alpha"] = [alpha[(d, c_)] for d, c_ in zip(sweep.decoder, sweep.category)]
    sweep["cost_ratio"] = c
    sweep["predicted_speedup"] = [predicted_speedup(a, k, c) for a, k in zip(sweep.alpha, sweep.k)]
    return sweep


def predicted_vs_measured(sweep: pd.DataFrame) -> pd.DataFrame:
    """One point per (category, k): measured speedup (geometric mean over prompts) and the predicted one."""
    records = []
    for (category, k), group in sweep.groupby(["category", "k"]):
        speed = group.groupby("prompt_id").speedup.median()
        low, high = bootstrap_interval(speed)
        records.append({"category": category, "k": k, "speedup": geometric_mean(speed), "speedup_low": low,
                        "speedup_high": high, "prompts": len(speed), "predicted_speedup": group.predicted_speedup.mean(),
                        "alpha": group.alpha.mean(), "cost_ratio": group.cost_ratio.mean()})
    table = pd.DataFrame(records)
    table["label"] = table.category + " k=" + table.k.astype(str)
    return table


def mean_speedup(rows: pd.DataFrame, decoder: str, baseline: str) -> tuple[float, float, float, int]:
    """`decoder`'s speedup over `baseline` (per-token time, side by side): geometric mean over
    prompts, its 95% interval and the prompt count."""
    table = speedup_table(rows[rows.decoder.isin([decoder, baseline])], baseline).loc[decoder]
    return table.speedup, table.speedup_low, table.speedup_high, int(table.prompts)
