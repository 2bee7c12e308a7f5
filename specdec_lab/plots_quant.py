"""Figures of notebook 03 (quantized decoding). Each function takes a table from
`specdec_lab.quantization` and returns the matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

sns.set_theme(style="whitegrid", context="notebook")


def _finish(fig, title: str):
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _height(count: int) -> float:
    return 0.5 * count + 1.8


def memory_bars(table: pd.DataFrame, title: str = "Memory, measured three ways"):
    """Per variant: weight bytes, peak memory while generating (above what the process held before
    the model loaded: weights + activations + KV cache + runtime buffers), and the KV cache alone."""
    panels = [("weight_mb", "weights (MB)"),
              ("peak_above_baseline_mb", "peak while generating,\nabove the pre-load baseline (MB)"),
              ("kv_cache_mb", f"KV cache at {int(table.kv_cache_tokens.max())} tokens (MB)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, _height(table.variant.nunique())), sharey=True)
    for ax, (column, xlabel) in zip(axes, panels):
        sns.barplot(data=table, y="variant", x=column, hue=_hue(table), legend=False, ax=ax, errorbar=None)
        for bars in ax.containers:
            ax.bar_label(bars, fmt="%.0f" if column != "kv_cache_mb" else "%.1f", padding=2)
        ax.set(xlabel=xlabel, ylabel="")
    return _finish(fig, title)


def _hue(table: pd.DataFrame) -> str:
    """Colour by model when target and draft are both shown, else one colour per variant."""
    return "role" if table.role.nunique() > 1 else "variant"


def speed_bars(ar_rows: pd.DataFrame, title: str = "Greedy AR decoding: latency and throughput"):
    """Latency per prompt and generated tokens/s per variant; bars span every sample, dots are samples."""
    fig, axes = plt.subplots(1, 2, figsize=(13, _height(ar_rows.decoder.nunique())), sharey=True)
    for ax, (column, xlabel) in zip(axes, [("wall_time_s", "latency per prompt (s)"),
                                           ("tokens_per_second", "generated tokens / s")]):
        sns.barplot(data=ar_rows, y="decoder", x=column, hue="decoder", legend=False, errorbar=("pi", 100), ax=ax)
        sns.stripplot(data=ar_rows, y="decoder", x=column, color="black", size=3, alpha=0.5, ax=ax)
        ax.set(xlabel=xlabel, ylabel="")
    return _finish(fig, title)


def quality_bars(table: pd.DataFrame, title: str = "Quality against the unquantized model"):
    """Greedy agreement with the unquantized model (matched prefix / its length) and perplexity on
    the fixed text set (lower is better; the unquantized bar is the reference)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, _height(table.variant.nunique())), sharey=True)
    sns.barplot(data=table, y="variant", x="agreement", hue=_hue(table), legend=False, errorbar=None, ax=axes[0])
    axes[0].set(xlim=(0, 1.05), xlabel="greedy agreement with unquantized\n(matched prefix / reference length)", ylabel="")
    sns.barplot(data=table, y="variant", x="perplexity", hue=_hue(table), legend=False, errorbar=None, ax=axes[1])
    axes[1].set(xlabel="perplexity on the fixed text set (lower = better)", ylabel="")
    for bars in axes[1].containers:
        axes[1].bar_label(bars, fmt="%.2f", padding=2)
    return _finish(fig, title)


def speculative_bars(table: pd.DataFrame, speedups: pd.DataFrame,
                     title: str = "Speculative decoding with quantized targets and drafts"):
    """Per target/draft pair: acceptance rate, speedup over AR of the same target variant (bars span
    the samples, dots are samples, dashed line = no gain) and agreement with that target's greedy AR."""
    order = list(table.pair)
    fig, axes = plt.subplots(1, 3, figsize=(16, _height(len(order))), sharey=True)
    sns.barplot(data=table, y="pair", x="acceptance_rate", hue="target", dodge=False, order=order,
                errorbar=None, ax=axes[0])
    axes[0].set(xlim=(0, 1.05), xlabel="acceptance rate (accepted / proposed draft tokens)", ylabel="")
    sns.barplot(data=speedups, y="decoder", x="speedup", hue="target", dodge=False, order=order,
                errorbar=("pi", 100), ax=axes[1], legend=False)
    sns.stripplot(data=speedups, y="decoder", x="speedup", order=order, color="black", size=3, alpha=0.5, ax=axes[1])
    axes[1].axvline(1.0, color="gray", linestyle="--")
    axes[1].set(xlabel="speedup over AR of the same target (side by side)", ylabel="")
    sns.barplot(data=table, y="pair", x="agreement_with_target", hue="target", dodge=False, order=order,
                errorbar=None, ax=axes[2], legend=False)
    axes[2].set(xlim=(0, 1.05), xlabel="agreement with that target's greedy AR output", ylabel="")
    if axes[0].get_legend() is not None:
        axes[0].get_legend().set_title("target")
    return _finish(fig, title)


def speedup_heatmap(table: pd.DataFrame, title: str = "Speedup over AR of the same target: target x draft"):
    """Target variant (rows) x draft (columns; 'self ...' = the target's own quantized copy); empty
    cells were not run."""
    pivot = table.pivot_table(index="target", columns="draft", values="speedup", aggfunc="first", sort=False)
    fig, ax = plt.subplots(figsize=(1.4 * pivot.shape[1] + 3, 0.8 * pivot.shape[0] + 2))
    sns.heatmap(pivot, annot=True, fmt=".2f", cmap="RdYlGn", center=1.0, cbar_kws={"label": "speedup (x)"}, ax=ax)
    ax.grid(False)
    ax.set(xlabel="draft", ylabel="target")
    return _finish(fig, title)
