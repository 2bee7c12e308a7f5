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


def tokens_per_forward(rows: pd.DataFrame, title: str = "Generated tokens per target forward pass", hue: str = "category"):
    fig, ax = plt.subplots(figsize=(8, 0.55 * rows.decoder.nunique() + 1.5))
    sns.barplot(data=rows, y="decoder", x="tokens_per_target_forward", hue=hue, errorbar=("ci", 95), ax=ax)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, never over them
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


# --- quantized decoding (notebook 03) ---------------------------------------------------------

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
    return "model_role" if table.model_role.nunique() > 1 else "variant"


def speed_bars(ar_rows: pd.DataFrame, title: str = "Greedy AR decoding: latency and throughput"):
    """Latency per prompt, generated tokens/s and tokens generated per variant (a variant whose text
    stops early has a short latency, not a fast one); bars span every sample, dots are samples."""
    fig, axes = plt.subplots(1, 3, figsize=(16, _height(ar_rows.decoder.nunique())), sharey=True)
    for ax, (column, xlabel) in zip(axes, [("wall_time_s", "latency per prompt (s)"),
                                           ("tokens_per_second", "generated tokens / s"),
                                           ("num_tokens", "tokens generated (stops at EOS)")]):
        sns.barplot(data=ar_rows, y="decoder", x=column, hue="decoder", legend=False, errorbar=("pi", 100), ax=ax)
        sns.stripplot(data=ar_rows, y="decoder", x=column, color="black", size=3, alpha=0.5, ax=ax)
        ax.set(xlabel=xlabel, ylabel="")
    return _finish(fig, title)


def quality_bars(table: pd.DataFrame, title: str = "Quality against the unquantized model"):
    """Greedy agreement with the unquantized model (matched prefix / its length) and perplexity on
    the fixed text set (lower is better; the unquantized bar is the reference)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, _height(table.variant.nunique())), sharey=True)
    sns.barplot(data=table, y="variant", x="agreement", hue=_hue(table), legend=False, errorbar=None, ax=axes[0])
    axes[0].set(xlim=(0, 1.05), ylabel="",
                xlabel="greedy agreement with unquantized\n(matched prefix / reference length)")
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


# --- Jacobi decoding and CLLMs (notebook 04) ---------------------------------------------------

def iterations_histogram(blocks: pd.DataFrame, title: str = "Jacobi iterations needed per block"):
    """How many forward passes each block took to converge; a block of n tokens takes at most n.
    Fewer iterations = more tokens per forward."""
    fig, ax = plt.subplots(figsize=(8, 4))
    top = int(blocks.iterations.max())
    sns.histplot(data=blocks, x="iterations", hue="decoder", multiple="dodge", shrink=0.8,
                 bins=range(1, top + 2), discrete=False, stat="percent", common_norm=False, ax=ax)
    ax.set(xlabel="iterations to converge (one forward pass each)", ylabel="% of blocks")
    return _finish(fig, title)


def block_token_counts(blocks: pd.DataFrame, title: str = "Fast-forwarded and stationary tokens per block"):
    """Mean per block, with the spread over blocks: fast-forwarded = fixed beyond one per iteration;
    stationary = right (and kept) while an earlier token was still wrong."""
    long = blocks.melt(id_vars=["decoder"], value_vars=["fast_forward", "stationary"], var_name="kind",
                       value_name="tokens")
    fig, ax = plt.subplots(figsize=(8, 3.8))
    sns.barplot(data=long, x="kind", y="tokens", hue="decoder", errorbar=("ci", 95), ax=ax)
    ax.set(xlabel="", ylabel="tokens per block")
    return _finish(fig, title)


def training_curves(losses: pd.DataFrame, window: int = 10, title: str = "CLLM training"):
    """Total, AR and consistency loss per optimizer step (thin) and their moving average (thick)."""
    columns = [("loss", "total (weighted)"), ("ar_loss", "AR (label-smoothed CE)"),
               ("consistency_loss", "consistency (KL)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for ax, (column, label) in zip(axes, columns):
        ax.plot(losses.step, losses[column], alpha=0.3, linewidth=0.8)
        ax.plot(losses.step, losses[column].rolling(window, min_periods=1).mean(), linewidth=2)
        ax.set(xlabel="optimizer step", ylabel=label)
    return _finish(fig, title)


def nll_bars(nll: pd.DataFrame, title: str = "NLL of the base model's held-out greedy text"):
    """Per-token negative log-likelihood of the same texts under each model (lower = more likely)."""
    fig, ax = plt.subplots(figsize=(7, 0.6 * nll.model.nunique() + 1.5))
    sns.barplot(data=nll, y="model", x="nll_per_token", hue="model", legend=False, errorbar=("pi", 100), ax=ax)
    sns.stripplot(data=nll, y="model", x="nll_per_token", color="black", size=3, alpha=0.5, ax=ax)
    ax.set(xlabel="mean NLL per token (nats)", ylabel="")
    return _finish(fig, title)
