"""Notebook 03 in words: verdicts and limits computed from the tables (`quantized_tables`), never typed."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from specdec_lab import models, words
from specdec_lab.decoders import llama_cpp_peer
from specdec_lab.experiments.quantized_tables import LLAMA_CPP, Tables, fastest_lossless
from specdec_lab.metrics import Speedup
from specdec_lab.models import quantize


def describe_all(names: Sequence[str], dtype: str, device: str) -> str:
    """A Markdown list: each variant's label and what it stores and computes in which precision."""
    return "\n".join(f"- **{quantize.label(name, dtype)}**: {quantize.describe(name, dtype, device)}" for name in names)


def tradeoff_sentences(table: pd.DataFrame) -> list[str]:
    """For each quantized variant: how much smaller its weights are and how its speed compares with
    the unquantized model, in words, e.g. 'saves memory but costs speed'."""
    sentences = []
    for row in table[~table.quantization.isin(["none", LLAMA_CPP])].itertuples():
        smaller = 1 - row.weights_vs_unquantized
        faster = row.speed_vs_unquantized
        size = f"{smaller:.0%} smaller" if smaller >= 0 else f"{-smaller:.0%} larger"
        verdict = ("saves weight memory and is faster" if smaller > 0 and faster >= 1 else
                   "saves weight memory but costs speed" if smaller > 0 else
                   "saves no weight memory here" + (" but is faster" if faster >= 1 else " and is slower"))
        sentences.append(
            f"{row.model_role} {row.label}: weights {row.weight_mb:,.0f} MB ({size} than unquantized), "
            f"{row.tokens_per_second:.1f} tokens/s ({faster:.2f}x the unquantized speed), KV cache "
            f"{row.kv_cache_mb:,.1f} MB at {row.kv_cache_tokens} tokens, perplexity {row.perplexity:.2f}, "
            f"greedy agreement with unquantized {row.agreement:.0%}: {verdict}.")
    return sentences


def baseline_note(spec: str, dtype: str) -> str:
    """What "unquantized" means for this model (the zoo mirrors are already 4-bit GGUFs)."""
    held = models.DTYPE_LABELS[models.parse_dtype(dtype)]
    if spec in models.zoo.ZOO:
        kind = llama_cpp_peer.gguf_kind(models.zoo.ZOO[spec].gguf_name, unknown="quantized")
        return (f"`{spec}` comes from an offline mirror of a **{kind}** GGUF file: its \"unquantized\" "
                f"baseline ({held}) holds those 4-bit weights dequantized to {held}. Quantizing it again "
                "re-rounds already-rounded weights: the memory saved is real, but quality is measured against a "
                "Q4-quality model, not against the original checkpoint.")
    return f"`{spec}`: the unquantized baseline holds the checkpoint's weights in {held}."


def speculative_sentences(table: pd.DataFrame) -> list[str]:
    """One computed line per pair, best speedup first."""
    lines = []
    for row in table.sort_values("speedup", ascending=False).itertuples():
        line = (f"{row.pair}: acceptance {row.acceptance_rate:.0%}, {words.interval(Speedup.from_line(row))} over AR "
                f"of the {row.target} target, "
                f"{row.tokens_per_target_forward:.2f} tokens per target forward, agreement with that target's "
                f"greedy output {row.agreement_with_target:.0%}")
        if not math.isnan(row.agreement_with_unquantized):
            line += f", with the unquantized target's {row.agreement_with_unquantized:.0%}"
        lines.append(line + ".")
    return lines


def limit_sentences(tables: Tables) -> list[str]:
    """How close each AR backend comes to the memory-bandwidth bound, what verifying 8 tokens costs
    on each, and the fastest lossless configuration against llama.cpp (computed, never typed)."""
    lines = []
    table = tables.footprints[tables.footprints.model_role == "target"]
    if "fraction_of_bound" in table:
        for row in table.itertuples():
            lines.append(f"{row.variant}: {row.decode_tokens_per_second:.1f} tokens/s while decoding, "
                         f"{row.fraction_of_bound:.0%} of the bandwidth bound ({row.bound_tokens_per_second:.1f} "
                         f"tokens/s for {row.bytes_read_per_token / 2**20:,.0f} MB read per token); "
                         f"{row.tokens_per_second:.1f} tokens/s with its prefill.")
    if not tables.kernels.empty:
        for row in tables.kernels[tables.kernels.rows == 1].itertuples():
            lines.append(f"{row.kernel}, one {row.weight_mb:.1f} MB MLP matrix alone, one row: {row.ms:.2f} ms, "
                         f"{row.gb_per_s:.1f} GB/s = {row.fraction_of_bandwidth:.0%} of the copy bandwidth.")
    curves = tables.cost_curves
    if not curves.empty and {1, 8} <= set(curves.n):
        for variant, curve in curves.groupby("variant", sort=False):
            ms = curve.set_index("n").ms
            lines.append(f"{variant}: T(1) = {ms[1]:.0f} ms, T(8) = {ms[8]:.0f} ms: verifying 8 tokens costs "
                         f"{ms[8] / ms[1]:.1f}x one.")
    for row in tables.best_k.itertuples():
        lines.append(f"{row.pair}: alpha {row.alpha:.2f}; at k={int(row.k_run)} predicted {row.predicted_at_k_run:.2f}x, "
                     f"measured {row.measured_speedup:.2f}x; the cost curve's best k is {row.best_k} "
                     f"(predicted {row.predicted_at_best_k:.2f}x).")
    best = fastest_lossless(tables.versus_llama_cpp)
    if best is not None:
        verdict = "at least as fast as" if best.vs_llama_cpp_low >= 1 else (
            "level with" if best.vs_llama_cpp_high >= 1 else "slower than")
        lines.append(f"Fastest configuration that equalled its own target's greedy output on every prompt: "
                     f"{best.configuration}, {best.tokens_per_second:.1f} tokens/s = "
                     f"{words.interval(Speedup.from_line(best, 'vs_llama_cpp'))} llama.cpp's AR in the same run "
                     f"(llama.cpp {best.llama_cpp_tokens_per_second:.1f} tokens/s): "
                     f"{verdict} llama.cpp. Its agreement with the unquantized target's greedy output: "
                     f"{best.agreement_with_unquantized:.0%}.")
    return lines


def headline(tables: Tables) -> dict:
    """The few numbers the report index shows, each speed ratio with its interval and prompt count."""
    numbers = {}
    table, spec_table = tables.footprints, tables.spec_table
    for row in table[(table.model_role == "target") & (table.quantization != "none")].itertuples():
        numbers[f"target {row.label}: weights vs unquantized"] = round(float(row.weights_vs_unquantized), 3)
        numbers[f"target {row.label}: speed per token vs unquantized"] = words.interval(
            Speedup.from_line(row, "speed_vs_unquantized"))
    if not spec_table.empty:
        best = spec_table.sort_values("speedup", ascending=False).iloc[0]
        numbers["fastest speculative pair"] = best.pair
        numbers["its speedup over AR of its target"] = words.interval(Speedup.from_line(best))
        numbers["its agreement with the unquantized target's greedy output"] = round(float(best.agreement_with_unquantized), 3)
    fastest = fastest_lossless(tables.versus_llama_cpp)
    if fastest is not None:
        numbers["fastest lossless configuration (own target backend)"] = fastest.configuration
        numbers["its speed vs llama.cpp AR"] = words.interval(Speedup.from_line(fastest, "vs_llama_cpp"))
        numbers["its agreement with the unquantized target"] = round(float(fastest.agreement_with_unquantized), 3)
    return numbers
