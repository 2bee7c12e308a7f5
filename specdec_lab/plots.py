"""One function per figure kind; every function takes benchmark rows or a metrics table and
returns the matplotlib Figure (notebooks only call these)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

sns.set_theme(style="whitegrid", context="notebook")


def _finish(fig, title: str):
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def speed_and_memory(rows: pd.DataFrame, title: str = "Latency, throughput and memory"):
    """Three panels per decoder: latency (s), tokens/s and peak memory (MB), with spread over
    prompts and repeats (bars = mean, lines = 95% bootstrap interval)."""
    data = rows.assign(peak_memory_mb=rows.peak_memory_bytes / 2**20)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (column, label) in zip(axes, [("wall_time_s", "latency per prompt (s)"),
                                          ("tokens_per_second", "generated tokens / s"),
                                          ("peak_memory_mb", "peak memory while decoding (MB)")]):
        sns.barplot(data=data, y="decoder", x=column, ax=ax, errorbar=("ci", 95), hue="decoder", legend=False)
        ax.set(xlabel=label, ylabel="")
    return _finish(fig, title)


def speedup_bars(speedups: pd.DataFrame, title: str = "Speedup over autoregressive decoding", hue: str | None = None):
    """Bars of per-(prompt, repeat) speedups with their spread; the dashed line is 1x (no gain)."""
    fig, ax = plt.subplots(figsize=(8, 0.55 * speedups.decoder.nunique() + 1.5))
    sns.barplot(data=speedups, y="decoder", x="speedup", hue=hue or "decoder", legend=bool(hue),
                errorbar=("pi", 100), ax=ax)
    sns.stripplot(data=speedups, y="decoder", x="speedup", color="black", size=3, alpha=0.5, ax=ax)
    ax.axvline(1.0, color="gray", linestyle="--")
    ax.set(xlabel="speedup (baseline time / method time, side by side)", ylabel="")
    return _finish(fig, title)


def k_sweep(sweep: pd.DataFrame, title: str = "Draft length k: measured and predicted speedup"):
    """Measured speedup (with spread) and the Leviathan prediction against k."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=sweep, x="k", y="speedup", hue="category", marker="o", errorbar=("pi", 100), ax=ax)
    if "predicted_speedup" in sweep:
        predicted = sweep.groupby("k").predicted_speedup.mean()
        ax.plot(predicted.index, predicted.values, "k--", label="predicted (all prompts)")
        ax.legend()
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set(xlabel="draft length k", ylabel="speedup over AR")
    return _finish(fig, title)


def predicted_vs_measured(table: pd.DataFrame, title: str = "Predicted vs measured speedup"):
    """Scatter of Leviathan's predicted speedup against the measured one (the diagonal is a perfect model)."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(data=table, x="predicted_speedup", y="speedup", hue=table.get("label"), s=70, ax=ax)
    top = max(table.predicted_speedup.max(), table.speedup.max()) * 1.1
    ax.plot([0, top], [0, top], "k--", linewidth=1)
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="predicted (1 - a^(k+1)) / ((1 - a)(kc + 1))", ylabel="measured")
    return _finish(fig, title)


def acceptance_by_position(table: pd.DataFrame, title: str = "Acceptance by draft position"):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=table, x="position", y="acceptance", hue="decoder", marker="o", ax=ax)
    ax.set(xlabel="position in the draft block", ylabel="P(accepted | proposed)", ylim=(0, 1.05))
    return _finish(fig, title)


def agreement_bars(rows: pd.DataFrame, title: str = "Token agreement with the target's greedy output"):
    """Mean fraction of the reference text reproduced before the first differing token."""
    fig, ax = plt.subplots(figsize=(8, 0.55 * rows.decoder.nunique() + 1.5))
    sns.barplot(data=rows, y="decoder", x="agreement", hue="decoder", legend=False, errorbar=None, ax=ax)
    ax.set(xlim=(0, 1.05), xlabel="agreement (matching prefix / reference length)", ylabel="")
    return _finish(fig, title)


def tokens_per_forward(rows: pd.DataFrame, title: str = "Generated tokens per target forward pass"):
    fig, ax = plt.subplots(figsize=(8, 0.55 * rows.decoder.nunique() + 1.5))
    sns.barplot(data=rows, y="decoder", x="tokens_per_target_forward", hue="category", errorbar=("ci", 95), ax=ax)
    ax.set(xlabel="tokens per target forward (prefill counted)", ylabel="")
    return _finish(fig, title)


def summary_speedups(table: pd.DataFrame, title: str = "Every method: speedup over its AR baseline"):
    """Horizontal bars, one per (experiment, method); methods that are not lossless are hatched."""
    data = table.assign(label=table.experiment + " · " + table.method).sort_values(["experiment", "speedup"])
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(data) + 1.5))
    palette = dict(zip(sorted(data.experiment.unique()), sns.color_palette("tab10")))
    bars = ax.barh(data.label, data.speedup, color=[palette[e] for e in data.experiment])
    for bar, lossless in zip(bars, data.lossless):
        if not lossless:
            bar.set_hatch("//")
            bar.set_edgecolor("black")
    ax.axvline(1.0, color="gray", linestyle="--")
    ax.set(xlabel="speedup over AR (geometric mean over prompts; hatched = not lossless)", ylabel="")
    return _finish(fig, title)


def speedup_vs_agreement(table: pd.DataFrame, title: str = "Speed is only worth it if the text is the target's"):
    fig, ax = plt.subplots(figsize=(7, 5))
    sns.scatterplot(data=table, x="agreement", y="speedup", hue="experiment", style="lossless", s=90, ax=ax)
    ax.axhline(1.0, color="gray", linestyle="--")
    ax.set(xlabel="agreement with the target's greedy output", ylabel="speedup over AR")
    return _finish(fig, title)
