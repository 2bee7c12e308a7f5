"""Notebook 05's sentences, every number read from its tables (`batch.Tables`)."""

from __future__ import annotations

import pandas as pd

from specdec_lab import words
from specdec_lab.experiments import lineups
from specdec_lab.metrics import Speedup

PLURAL = {"batch": "batches"}


def _speedup(line, column: str = "speedup", count: str = "batches") -> Speedup:
    return Speedup(float(line[column]), float(line[f"{column}_low"]), float(line[f"{column}_high"]), int(line[count]))


def _over(speedup: Speedup, unit: str) -> str:
    """'1.52x (95% CI 1.31-1.74, 4 batches)': a geometric mean with its interval and what it is over
    (one batch has no interval)."""
    count = f"{speedup.prompts} {unit if speedup.prompts == 1 else PLURAL[unit]}"
    if speedup.prompts < 2:
        return f"{speedup.value:.2f}x ({count}, no interval)"
    return f"{speedup.value:.2f}x (95% CI {speedup.low:.2f}-{speedup.high:.2f}, {count})"


def compact(tables) -> pd.DataFrame:
    """The reader's table: per batch size and method, throughput, its ratio to batched AR, the latency
    ratio, tokens per forward and agreement (the full table is in the code twin and the CSV)."""
    names = words.short_names(tables.rows)
    table = tables.table.assign(label=[f"b={b} · {names[d]}" for b, d in zip(tables.table.batch_size, tables.table.decoder)])
    return words.compact_table(table, {"throughput": "tokens/s", "speedup": "throughput ÷ AR",
                                       "decode_speedup": "decode only ÷ AR",
                                       "latency_speedup": "latency speedup", "tokens_per_forward": "tokens/forward",
                                       "agreement": "agreement"}, label="label")


def _line(tables, decoder: str, batch_size: int):
    found = tables.table[(tables.table.decoder == decoder) & (tables.table.batch_size == batch_size)]
    return None if found.empty else found.iloc[0]


def best_speculative(tables) -> pd.DataFrame:
    """Per batch size, the speculative line with the highest throughput ratio over batched AR."""
    speculative = tables.table[tables.table.role == "speculative"]
    return speculative.loc[speculative.groupby("batch_size").speedup.idxmax()].reset_index(drop=True)


def _verdict(speedup: Speedup) -> str:
    if speedup.low > 1:
        return "pays"
    if speedup.high < 1:
        return "costs"
    return "is not told apart from AR"


def findings(tables) -> str:
    names = words.short_names(tables.rows)
    sizes = sorted(tables.table.batch_size.unique())
    ar_first, ar_last = _line(tables, lineups.BATCHED_AR, sizes[0]), _line(tables, lineups.BATCHED_AR, sizes[-1])
    text = (f"On {tables.cpu} ({tables.precision} target), batched AR makes **{ar_first.throughput:.1f} tokens/s** at "
            f"batch {sizes[0]} and **{ar_last.throughput:.1f}** at batch {sizes[-1]} (throughput: a batch's tokens over "
            f"its wall time; geometric means over {int(ar_first.batches)} and {int(ar_last.batches)} batches).")
    lines = []
    for _, line in best_speculative(tables).iterrows():
        speedup = _speedup(line)
        latency = _speedup(line, "latency_speedup")
        lines.append(f"batch {line.batch_size}: {names[line.decoder]} {_verdict(speedup)}: throughput "
                     f"{_over(speedup, 'batch')} of batched AR's, per-request latency {_over(latency, 'batch')}, "
                     f"{line.tokens_per_forward:.2f} tokens per target forward")
    if lines:
        text += "\n\nThe fastest speculative method at each batch size, against batched AR on the same batches:\n" + words.bullets(lines)
    text += "\n\n" + cost_model_findings(tables) + "\n\n" + peer_findings(tables) + "\n\n" + agreement_findings(tables)
    return text


def cost_model_findings(tables) -> str:
    if tables.best_k.empty:
        return "No draft model in this run: the cost model has nothing to predict."
    best = tables.best_k
    predicted = ", ".join(f"b={row.batch_size}: k={row.predicted_k} ({row.predicted:.2f}x)" for row in best.itertuples())
    measured = ", ".join(f"b={row.batch_size}: k={row.measured_k} ({row.measured:.2f}x)" for row in best.itertuples())
    decode = ", ".join(f"b={row.batch_size}: k={row.decode_k} ({row.decode:.2f}x)" for row in best.itertuples())
    sizes = sorted(best.batch_size)
    predicted_at, measured_at = _crossing(tables.crossover["predicted"], sizes), _crossing(tables.crossover["measured"], sizes)
    if tables.crossover["measured"] is None:
        measured_at = "none shown: at no batch size does the best k's interval lie below 1"
    worst = tables.predicted.loc[tables.predicted.error.abs().idxmax()]
    decode_at = _crossing(tables.crossover["decode"], sizes) if tables.crossover["decode"] is not None else \
        "none shown at the batch sizes measured"
    prefill = tables.predicted.speedup / tables.predicted.decode_speedup
    return (f"**Cost model.** With the draft's acceptance alpha = {tables.alpha:.2f} (pooled over every batch size) "
            f"and T_b(n) measured over b rows of n tokens, the best draft length predicted per batch size: {predicted}. "
            f"The model prices decode steps; measured after each batch's first forward (decode only): {decode}; with the "
            f"prefill included (what a user gets): {measured}. Its largest error against the decode-only measurement, "
            f"over the {len(tables.predicted)} (k, batch size) pairs: {worst.error:+.0%} (k={int(worst.k)}, batch "
            f"{worst.batch_size}). With each batch's prefill, which the model leaves out (the draft adds its own), the measured "
            f"ratio is {prefill.min():.2f}-{prefill.max():.2f} of the decode-only one. Where the draft stops paying "
            f"(the crossover): **{predicted_at}** by the cost model; measured, the first batch size whose best k's interval "
            f"lies below 1: **{decode_at}** decode only, **{measured_at}** with the prefill (by point estimates "
            f"{_crossing(tables.crossover['measured_point'], sizes)}).")


def _crossing(batch: int | None, sizes: list[int]) -> str:
    if batch is None:
        return f"beyond batch {sizes[-1]} (it pays at every batch size measured)"
    if batch == sizes[0]:
        return f"none: it does not pay even at batch {batch}"
    return f"batch {batch}"


def peer_findings(tables) -> str:
    if tables.peer.empty:
        return ""
    parts = [f"batch {int(row.batch_size)}: {_over(Speedup(row.ratio, row.ratio_low, row.ratio_high, int(row.batches)), 'batch')}"
             for row in tables.peer.itertuples()]
    return ("**Against transformers.** Our batched AR's throughput over transformers' batched `generate` (left "
            "padding and an attention mask; it keeps finished rows in the batch until the last ends): "
            + "; ".join(parts) + ". transformers has no batched speculative decoding (its assisted generation "
            "and prompt lookup take one sequence), so speculation has no peer here.")


def agreement_findings(tables) -> str:
    lossless = tables.table[tables.table.lossless.astype(bool)]
    parted = lossless[lossless.full_match_rate < 1]
    if parted.empty:
        return (f"Every row of every method declared lossless equals its prompt's batch-1 AR text token for token "
                f"({tables.precision}).")
    names = words.short_names(tables.rows)
    listed = ", ".join(f"{names[row.decoder]} at b={row.batch_size} ({row.full_match_rate:.0%} identical, agreement "
                       f"{row.agreement:.2f})" for row in parted.itertuples())
    return (f"Not every lossless row equals its prompt's batch-1 AR text in {tables.precision}: {listed}. Batched "
            "kernels over more rows round differently from one-row steps; the fp32 smoke run asserts exact equality.")


def headline(tables) -> dict:
    numbers = {"CPU": tables.cpu}
    best = best_speculative(tables)
    for _, line in best.iterrows():
        numbers[f"batch {line.batch_size}: fastest speculative throughput ÷ batched AR"] = (
            f"{words.short_names(tables.rows)[line.decoder]}: {_over(_speedup(line), 'batch')}")
    if not tables.best_k.empty:
        largest = int(tables.best_k.batch_size.max())
        shown = {which: str(b) if b is not None else f"> {largest}" for which, b in tables.crossover.items()}
        numbers["batch size where the draft stops paying (predicted / measured decode only / with prefill)"] = (
            f"{shown['predicted']} / {shown['decode']} / {shown['measured']}")
    return numbers


def vllm_findings(vllm) -> str:
    """`vllm_engine.VllmBatchTables` in words: per batch size, vLLM's AR throughput against the kit's batched
    AR, and whether each vLLM speculation pays over vLLM's own AR."""
    lines = [f"vLLM ran the target's weights in {vllm.dtype}; each configuration in its own run beside the kit's "
             "batched AR on the same batches."]
    lines += [f"{line.configuration} could not run here: {line.error[:300]}" for line in vllm.errors.itertuples()]
    for line in vllm.table[vllm.table.role == "target AR"].itertuples():
        lines.append(f"b={line.batch_size}: {line.decoder} makes {line.throughput:.1f} tokens/s over the batch, "
                     f"{_over(_speedup(line._asdict()), 'batch')} the kit's batched AR's throughput.")
    for line in vllm.over_vllm_ar.itertuples():
        speedup = _speedup(line._asdict(), "speedup_over_vllm_ar")
        verdict = _verdict(speedup).replace("from AR", "from it")
        lines.append(f"b={line.batch_size}: {line.decoder} makes {_over(speedup, 'batch')} vLLM's AR's throughput: "
                     f"it {verdict}.")
    return words.bullets(lines)
