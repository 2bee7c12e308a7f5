"""Numbers derived from benchmark rows (one row = one GenerationResult of one decoder, prompt, repeat).

Speedups are ratios of wall times measured side by side in one run: per prompt and repeat,
baseline time / method time. Summaries use the geometric mean over prompts (ratios multiply).
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


def speedups(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One speedup per (decoder, prompt, repeat): the baseline's wall time in the same repeat over
    the decoder's. Side-by-side pairs cancel slow drifts of the machine."""
    base = rows[rows.decoder == baseline].set_index(["prompt_id", "repeat"]).wall_time_s.rename("baseline_s")
    if base.empty:
        raise ValueError(f"baseline decoder {baseline!r} has no rows; decoders present: {sorted(rows.decoder.unique())}")
    joined = rows.join(base, on=["prompt_id", "repeat"])
    joined["speedup"] = joined.baseline_s / joined.wall_time_s
    return joined[["decoder", "prompt_id", "category", "repeat", "speedup"]]


def geometric_mean(values) -> float:
    values = [v for v in values if v and v > 0 and not math.isnan(v)]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def summary(rows: pd.DataFrame, baseline: str, reference: str | None = None) -> pd.DataFrame:
    """One line per decoder: speed, speedup over `baseline`, tokens per target forward, acceptance,
    agreement with `reference` (default: the baseline), memory."""
    rows = add_agreement(rows, reference or baseline)
    speed = speedups(rows, baseline)
    per_prompt = speed.groupby(["decoder", "prompt_id"]).speedup.median().reset_index()
    table = rows.groupby("decoder", sort=False).agg(
        tokens_per_second=("tokens_per_second", "median"),
        ms_per_token=("ms_per_token", "median"),
        time_to_first_token_s=("time_to_first_token_s", "median"),
        tokens_per_target_forward=("tokens_per_target_forward", "mean"),
        acceptance_rate=("acceptance_rate", "mean"),
        agreement=("agreement", "mean"),
        full_match_rate=("full_match", "mean"),
        peak_memory_mb=("peak_memory_bytes", lambda b: b.max() / 2**20),
        samples=("tokens", "size"),
    )
    table["speedup"] = per_prompt.groupby("decoder").speedup.apply(geometric_mean)
    table["speedup_min"] = speed.groupby("decoder").speedup.min()
    table["speedup_max"] = speed.groupby("decoder").speedup.max()
    first = ["speedup", "speedup_min", "speedup_max", "tokens_per_second"]
    return table[first + [c for c in table.columns if c not in first]]


def acceptance_by_position(rows: pd.DataFrame) -> pd.DataFrame:
    """P(draft token i is accepted | it was proposed), i = 1..k, per decoder."""
    records = []
    for decoder, group in rows.groupby("decoder"):
        accepted = [a for steps in group.accepted_per_step for a in steps]
        proposed = [p for steps in group.proposed_per_step for p in steps]
        for position in range(1, max(proposed, default=0) + 1):
            offered = [a for a, p in zip(accepted, proposed) if p >= position]
            if offered:
                rate = sum(a >= position for a in offered) / len(offered)
                records.append({"decoder": decoder, "position": position, "acceptance": rate, "steps": len(offered)})
    return pd.DataFrame(records)


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al. (2023), eq. 1: expected walltime improvement with acceptance rate alpha,
    draft length k and c = draft step time / target step time."""
    if alpha >= 1.0:
        return (k + 1) / (k * cost_ratio + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost_ratio + 1))


def alpha_from_tokens_per_step(tokens_per_step: float, k: int) -> float:
    """Invert E[tokens per step] = (1 - a^(k+1)) / (1 - a) for the per-token acceptance a (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        expected = k + 1 if middle == 1 else (1 - middle ** (k + 1)) / (1 - middle)
        low, high = (middle, high) if expected < tokens_per_step else (low, middle)
    return (low + high) / 2


def mean_tokens_per_step(rows: pd.DataFrame) -> pd.Series:
    """Per decoder: tokens emitted per verification step (accepted + the target's own token)."""
    def per_group(group):
        steps = [a for s in group.accepted_per_step for a in s]
        return 1 + sum(steps) / len(steps) if steps else float("nan")
    return rows.groupby("decoder").apply(per_group, include_groups=False)


def cost_ratio(draft_ar_rows: pd.DataFrame, target_ar_rows: pd.DataFrame) -> float:
    """c = draft step time / target step time, from plain AR runs of both models (median ms/token)."""
    return float(draft_ar_rows.ms_per_token.median() / target_ar_rows.ms_per_token.median())


def recommended_k(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per prompt category, the draft length k with the highest geometric-mean measured speedup.
    `sweep` has columns category, k, speedup (one row per prompt/repeat)."""
    by_k = sweep.groupby(["category", "k"]).speedup.apply(geometric_mean).reset_index()
    best = by_k.loc[by_k.groupby("category").speedup.idxmax()]
    return best.rename(columns={"k": "recommended_k", "speedup": "speedup_at_k"}).reset_index(drop=True)


def k_sweep(rows: pd.DataFrame, k_of: dict[str, int], baseline: str, draft_ar: str) -> pd.DataFrame:
    """Measured speedup per (k, prompt, repeat) beside Leviathan's prediction, which uses the
    per-token acceptance a implied by the tokens per step at that k and the measured cost ratio c."""
    c = cost_ratio(rows[rows.decoder == draft_ar], rows[rows.decoder == baseline])
    tokens_per_step = mean_tokens_per_step(rows[rows.decoder.isin(list(k_of))])
    sweep = speedups(rows[rows.decoder.isin([*k_of, baseline])], baseline)
    sweep = sweep[sweep.decoder.isin(list(k_of))].copy()
    sweep["k"] = sweep.decoder.map(k_of)
    alpha = {d: alpha_from_tokens_per_step(tokens_per_step[d], k) for d, k in k_of.items()}
    sweep["alpha"] = sweep.decoder.map(alpha)
    sweep["cost_ratio"] = c
    sweep["predicted_speedup"] = [predicted_speedup(a, k, c) for a, k in zip(sweep.alpha, sweep.k)]
    return sweep


def predicted_vs_measured(sweep: pd.DataFrame) -> pd.DataFrame:
    """One point per k: geometric-mean measured speedup and the predicted one."""
    table = sweep.groupby("k").agg(speedup=("speedup", geometric_mean), predicted_speedup=("predicted_speedup", "mean"),
                                   alpha=("alpha", "mean"), cost_ratio=("cost_ratio", "mean")).reset_index()
    table["label"] = "k=" + table.k.astype(str)
    return table


def mean_speedup(rows: pd.DataFrame, decoder: str, baseline: str) -> float:
    """Geometric mean over prompts of `decoder`'s speedup over `baseline` (side by side)."""
    per_sample = speedups(rows, baseline)
    per_prompt = per_sample[per_sample.decoder == decoder].groupby("prompt_id").speedup.median()
    return geometric_mean(per_prompt)
