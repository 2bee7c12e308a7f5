"""Numbers derived from benchmark rows (one row = one GenerationResult of one decoder, prompt, repeat).

A speedup compares time per generated token, measured side by side in one run: per prompt and
repeat, the baseline's ms/token over the method's (two runs that stop at different lengths are still
compared fairly; the end-to-end latency ratio is reported apart, with a count of the pairs whose
lengths differ). Every aggregate over prompts is a geometric mean (ratios multiply) of the
per-prompt medians over repeats, and carries a 95% bootstrap interval over prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specdec_lab.cost_model import acceptance_alpha, predicted_speedup
from specdec_lab.quality import greedy_agreement

GEOMETRIC_MEAN = "geometric mean over prompts"  # the aggregate of every Speedup `over_prompts` makes


@dataclass(frozen=True)
class Speedup:
    """A ratio aggregated over prompts, with its 95% bootstrap interval and the prompt count. What
    tables store as `<name>`, `<name>_low`, `<name>_high` and `prompts` columns; `words.interval`
    is its one way into a sentence."""

    value: float
    low: float
    high: float
    prompts: int
    aggregate: str = GEOMETRIC_MEAN

    @classmethod
    def from_line(cls, line, column: str = "speedup", prompts: str = "prompts") -> "Speedup":
        """From a table line (a Series or a namedtuple) with `column`, `column_low`, `column_high`."""
        get = line.get if hasattr(line, "get") else lambda name: getattr(line, name)
        count = get(prompts)
        return cls(float(get(column)), float(get(f"{column}_low")), float(get(f"{column}_high")),
                   int(count) if pd.notna(count) else 0)

    def columns(self, name: str = "speedup") -> dict:
        """The table columns this record fills."""
        return {name: self.value, f"{name}_low": self.low, f"{name}_high": self.high, "prompts": self.prompts}


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


def over_prompts(per_prompt) -> Speedup:
    """The one aggregate over prompts: the geometric mean of one value per prompt (ratios multiply),
    its 95% bootstrap interval and the number of prompts."""
    values = list(per_prompt)
    low, high = bootstrap_interval(values)
    return Speedup(geometric_mean(values), low, high, len(values))


def decode_tokens_per_second(rows: pd.DataFrame) -> pd.Series:
    """Per row: tokens after the first over the time after the first, i.e. decoding alone, the
    regime the memory-bandwidth bound describes (one read of the weights per step). The prefill
    is compute-bound and its cost differs a lot between backends (int4 kernels widen every weight for
    every prompt row), so it must not be charged to the decode loop's distance from that bound."""
    num_tokens = rows.tokens.map(len) if "num_tokens" not in rows else rows.num_tokens
    decoding_s = rows.wall_time_s - rows.time_to_first_token_s
    return ((num_tokens - 1) / decoding_s).where((num_tokens > 1) & (decoding_s > 0))


def tokens_per_second_after_first_step(rows: pd.DataFrame) -> pd.Series:
    """Per row: the tokens after the first step over the time after it. The first step runs with
    the prefill and yields the first token, and for a speculative method the tokens accepted with
    it too; those were made in the time to first token, so they are left out here (counting them
    against the time after it would flatter every method that accepts more in its first step). For
    AR this is `decode_tokens_per_second`."""
    num_tokens = rows.tokens.map(len) if "num_tokens" not in rows else rows.num_tokens
    first_step = rows.accepted_per_step.map(lambda steps: (steps[0] if len(steps) else 0) + 1)
    later = num_tokens - first_step.clip(upper=num_tokens)
    decoding_s = rows.wall_time_s - rows.time_to_first_token_s
    return (later / decoding_s).where((later > 0) & (decoding_s > 0))


def per_prompt(values: pd.DataFrame, column: str) -> pd.DataFrame:
    """The median of `column` over repeats, per (decoder, prompt)."""
    return values.groupby(["decoder", "prompt_id"], sort=False)[column].median().reset_index()


def aggregate(values: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per decoder: geometric mean over prompts of the per-prompt median of `column`, its 95%
    bootstrap interval (`<column>_low`, `<column>_high`) and the number of prompts."""
    records = [{"decoder": decoder, **over_prompts(group[column]).columns(column)}
               for decoder, group in per_prompt(values, column).groupby("decoder", sort=False)]
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


def cost_ratio(draft_ar_rows: pd.DataFrame, target_ar_rows: pd.DataFrame) -> float:
    """c = draft step time / target step time, from plain AR runs of both models (median ms/token)."""
    return float(draft_ar_rows.ms_per_token.median() / target_ar_rows.ms_per_token.median())


def recommended_k(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per prompt category, the draft length k with the highest measured speedup (geometric mean
    over prompts), with its interval and prompt count. `sweep` has one row per (k, prompt, repeat)."""
    records = [{"category": category, "k": k, **over_prompts(group.groupby("prompt_id").speedup.median()).columns()}
               for (category, k), group in sweep.groupby(["category", "k"])]
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
    records = [{"category": category, "k": k, **over_prompts(group.groupby("prompt_id").speedup.median()).columns(),
                "predicted_speedup": group.predicted_speedup.mean(), "alpha": group.alpha.mean(),
                "cost_ratio": group.cost_ratio.mean()}
               for (category, k), group in sweep.groupby(["category", "k"])]
    table = pd.DataFrame(records)
    table["label"] = table.category + " k=" + table.k.astype(str)
    return table


def mean_speedup(rows: pd.DataFrame, decoder: str, baseline: str) -> Speedup:
    """`decoder`'s speedup over `baseline` (per-token time, side by side): geometric mean over
    prompts, its 95% interval and the prompt count."""
    return Speedup.from_line(speedup_table(rows[rows.decoder.isin([decoder, baseline])], baseline).loc[decoder])
