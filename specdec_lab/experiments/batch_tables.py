"""Notebook 05's numbers from its rows (one row per request of a batch: `batch_size`, `repeat`, `group`,
and the batch's wall time in `extras`), tested on synthetic rows.

Two speeds per (method, batch size):
- **throughput**: a batch's generated tokens over its wall time (the last request's finish);
- **latency**: each request's time per generated token (from the batch's start to its own finish).
Each is compared with the baseline's on the same batch (same prompts, same process, back to back):
throughput per batch; latency per request, then its geometric mean over the batch's requests (the
requests of one batch share its run, so the batch is the unit). Both are geometric means over batches
with 95% bootstrap intervals over batches.
"""

from __future__ import annotations

import pandas as pd

from specdec_lab import cost_model, metrics

BATCH_KEYS = ["batch_size", "repeat", "group"]


def batches(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (decoder, batch): generated tokens, wall time, throughput (tokens/s over the batch),
    and decode throughput: the tokens after each request's first over the time after the batch's first
    forward (the prefill, and for a speculative method its first verification; NaN where a peer cannot
    say when its first token came), the part of the run the cost model prices."""
    rows = rows.assign(batch_wall_time_s=rows.extras.map(lambda extras: extras["batch_wall_time_s"]))
    out = rows.groupby(["decoder", *BATCH_KEYS], sort=False).agg(
        tokens=("num_tokens", "sum"), requests=("num_tokens", "size"), wall_time_s=("batch_wall_time_s", "max"),
        first_token_s=("time_to_first_token_s", "max")).reset_index()
    out["throughput"] = out.tokens / out.wall_time_s
    out["decode_throughput"] = (out.tokens - out.requests) / (out.wall_time_s - out.first_token_s)
    return out


def throughput_speedups(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (decoder, batch size): throughput (geometric mean over batches, interval) and its ratio to the
    baseline's on the same batches (`speedup`, interval, `batches`)."""
    per_batch = batches(rows)
    base = per_batch[per_batch.decoder == baseline].set_index(BATCH_KEYS).throughput
    if base.empty:
        raise ValueError(f"baseline {baseline!r} has no rows; decoders present: {sorted(rows.decoder.unique())}")
    keys = pd.MultiIndex.from_frame(per_batch[BATCH_KEYS])
    per_batch["ratio"] = per_batch.throughput / base.reindex(keys).to_numpy()
    decode_base = per_batch[per_batch.decoder == baseline].set_index(BATCH_KEYS).decode_throughput
    per_batch["decode_ratio"] = per_batch.decode_throughput / decode_base.reindex(keys).to_numpy()
    lines = []
    for (decoder, batch_size), group in per_batch.groupby(["decoder", "batch_size"], sort=False):
        throughput, ratio = metrics.over_prompts(group.throughput), metrics.over_prompts(group.ratio)
        decode = metrics.over_prompts(group.decode_ratio)
        lines.append({"decoder": decoder, "batch_size": batch_size, **throughput.columns("throughput"),
                      **decode.columns("decode_speedup"), **ratio.columns("speedup")})
    return pd.DataFrame(lines).rename(columns={"prompts": "batches"})


def latency_speedups(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (decoder, batch size): the baseline's ms per generated token over the decoder's, request by
    request on the same batch, as a geometric mean per batch, then over batches (`latency_speedup`,
    interval over batches); the median request's ms per token beside it."""
    keys = [*BATCH_KEYS, "prompt_id"]
    rows = rows.assign(ms_per_token=1000 * rows.wall_time_s / rows.num_tokens.clip(lower=1))
    base = rows[rows.decoder == baseline].set_index(keys).ms_per_token
    rows["ratio"] = base.reindex(pd.MultiIndex.from_frame(rows[keys])).to_numpy() / rows.ms_per_token
    per_batch = rows.groupby(["decoder", *BATCH_KEYS], sort=False).ratio.agg(metrics.geometric_mean).reset_index()
    lines = []
    for (decoder, batch_size), group in per_batch.groupby(["decoder", "batch_size"], sort=False):
        requests = rows[(rows.decoder == decoder) & (rows.batch_size == batch_size)]
        lines.append({"decoder": decoder, "batch_size": batch_size, "ms_per_token": requests.ms_per_token.median(),
                      **metrics.over_prompts(group.ratio).columns("latency_speedup")})
    return pd.DataFrame(lines).drop(columns="prompts")


def agreement(rows: pd.DataFrame, baseline: str) -> pd.Series:
    """The batch-1 baseline's repeat-0 text of every prompt: the reference of every row's agreement (a
    row of a lossless method equals it in exact arithmetic, whatever the batch)."""
    single = rows[(rows.decoder == baseline) & (rows.batch_size == rows.batch_size.min()) & (rows.repeat == 0)]
    return single.drop_duplicates("prompt_id").set_index("prompt_id").tokens


def table(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One line per (decoder, batch size): throughput and latency against the baseline, tokens per target
    forward (mean over requests) and agreement with the batch-1 baseline's text; the method's record
    columns (role, source kind, k, implementation) beside them."""
    scored = metrics.add_agreement(rows, reference=agreement(rows, baseline))
    per_request = scored.groupby(["decoder", "batch_size"], sort=False).agg(
        tokens_per_forward=("tokens_per_target_forward", "mean"), agreement=("agreement", "mean"),
        full_match_rate=("full_match", "mean"))
    records = rows.drop_duplicates("decoder").set_index("decoder")[["role", "implementation", "source_kind", "k",
                                                                     "lossless"]]
    out = (throughput_speedups(rows, baseline)
           .merge(latency_speedups(rows, baseline), on=["decoder", "batch_size"])
           .join(per_request, on=["decoder", "batch_size"]).join(records, on="decoder"))
    return out.sort_values(["batch_size"], kind="stable").reset_index(drop=True)


def cost_curves(grid: pd.DataFrame) -> dict[int, dict[int, float]]:
    """batch size -> {n: ms} from `hardware.batch_cost_grid`'s frame (its nondecreasing fit)."""
    return {int(b): dict(zip(group.n.astype(int), group.ms_fit)) for b, group in grid.groupby("batch")}


def draft_alpha(rows: pd.DataFrame) -> float:
    """The draft's per-token acceptance (Leviathan's alpha) over every draft-model row: in exact
    arithmetic a row proposes and accepts the same tokens at any batch size, so all batch sizes pool."""
    drafted = rows[rows.source_kind == "draft model"]
    return cost_model.acceptance_alpha(drafted.accepted_per_step.tolist(), drafted.proposed_per_step.tolist())


def predicted_vs_measured(lines: pd.DataFrame, alpha: float, target_grid: pd.DataFrame,
                          draft_grid: pd.DataFrame) -> pd.DataFrame:
    """Per draft-model line (k, batch size): the cost model's ratio over AR (`cost_model.batch_speedup_from_costs`
    with the measured alpha and T_b(n), D_b(1)) beside the measured ones. The model prices decode steps, so
    its `error` is against the decode-only measurement (`decode_speedup`); `speedup` (with each batch's
    prefill) is what a user gets."""
    target_ms, draft_ms = cost_curves(target_grid), cost_curves(draft_grid)
    drafted = lines[lines.source_kind == "draft model"]
    out = drafted[["decoder", "batch_size", "k", "speedup", "speedup_low", "speedup_high", "decode_speedup",
                   "decode_speedup_low", "decode_speedup_high", "batches"]].copy()
    out["k"] = out.k.astype(int)
    out["predicted"] = [cost_model.batch_speedup_from_costs(alpha, k, target_ms, draft_ms, b)
                        for k, b in zip(out.k, out.batch_size)]
    out["error"] = out.predicted / out.decode_speedup - 1
    return out.reset_index(drop=True)


def best_k(predicted: pd.DataFrame) -> pd.DataFrame:
    """Per batch size: the draft length the cost model predicts fastest and the one measured fastest
    (point estimates), with both throughput ratios."""
    lines = []
    for batch_size, group in predicted.groupby("batch_size"):
        by_prediction, by_measurement = group.loc[group.predicted.idxmax()], group.loc[group.speedup.idxmax()]
        by_decode = group.loc[group.decode_speedup.idxmax()]
        lines.append({"batch_size": batch_size, "predicted_k": int(by_prediction.k), "predicted": by_prediction.predicted,
                      "measured_k": int(by_measurement.k), "measured": by_measurement.speedup,
                      "measured_low": by_measurement.speedup_low, "measured_high": by_measurement.speedup_high,
                      "decode_k": int(by_decode.k), "decode": by_decode.decode_speedup,
                      "decode_high": by_decode.decode_speedup_high})
    return pd.DataFrame(lines)


def crossovers(best: pd.DataFrame) -> dict[str, int | None]:
    """The batch size where the draft model stops paying for throughput (None: it pays at every batch
    size measured): by the cost model, from its best k; measured, the first batch size whose best k's
    interval lies below 1 (`measured`), and the first whose point estimate does (`measured_point`: a
    maximum over noisy k is biased up, and a ratio whose interval spans 1 has not stopped paying yet), and
    the first whose best k's decode-only interval does (`decode`: what the cost model prices)."""
    return {"predicted": cost_model.crossover_batch(dict(zip(best.batch_size, best.predicted))),
            "measured": cost_model.crossover_batch(dict(zip(best.batch_size, best.measured_high))),
            "measured_point": cost_model.crossover_batch(dict(zip(best.batch_size, best.measured))),
            "decode": cost_model.crossover_batch(dict(zip(best.batch_size, best.decode_high)))}


def peer_ratio(lines: pd.DataFrame, ours: str, peer: str) -> pd.DataFrame:
    """Per batch size: our AR's throughput over the peer's, from the two lines' ratios to the same
    baseline (ours is the baseline, so this is 1 / the peer's speedup, interval inverted)."""
    theirs = lines[lines.decoder == peer].set_index("batch_size")
    if lines[lines.decoder == ours].empty or theirs.empty:
        return pd.DataFrame(columns=["batch_size", "ratio", "ratio_low", "ratio_high", "batches"])
    return pd.DataFrame({"batch_size": theirs.index, "ratio": 1 / theirs.speedup.to_numpy(),
                         "ratio_low": 1 / theirs.speedup_high.to_numpy(), "ratio_high": 1 / theirs.speedup_low.to_numpy(),
                         "batches": theirs.batches.to_numpy()})
