"""One function per figure kind; every function takes benchmark rows or a metrics table and
returns the matplotlib Figure (notebooks only call these)."""

from __future__ import annotations

from collections.abc import Mapping

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


def interval_bars(ax, labels, table: pd.DataFrame, colors=None, hatched=None, invert: bool = True,
                  column: str = "speedup") -> None:
    """Horizontal bars at `column` (a speedup), error lines spanning [`column`_low, `column`_high]
    (95% bootstrap interval over prompts), each labelled with its value and prompt count n."""
    values = table[column].to_numpy()
    low = (table[column] - table[f"{column}_low"]).fillna(0).clip(lower=0).to_numpy()
    high = (table[f"{column}_high"] - table[column]).fillna(0).clip(lower=0).to_numpy()
    bars = ax.barh(list(labels), values, xerr=[low, high], color=colors, capsize=3, ecolor="black")
    for bar, value, prompts, hatch in zip(bars, values, table.prompts, hatched if hatched is not None else [False] * len(values)):
        ax.annotate(f"{value:.2f}x  (n={int(prompts)})", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
        if hatch:
            bar.set_hatch("//")
            bar.set_edgecolor("black")
    if invert:  # first label on top (once per shared axis: a second call would flip it back)
        ax.invert_yaxis()
    ax.axvline(1.0, color="gray", linestyle="--")


def speedup_bars(table: pd.DataFrame, title: str = "Speedup over autoregressive decoding", baseline: str = "AR",
                 column: str = "speedup", names: Mapping[str, str] | None = None):
    """One bar per method (index) from `metrics.summary` / `metrics.speedup_table`: per-token speedup
    over `baseline` (`column`, with `column`_low and _high), geometric mean over prompts, with its
    95% interval; the dashed line is 1x."""
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(table) + 1.5))
    interval_bars(ax, _named(table.index.to_series(), names), table, colors=sns.color_palette("tab10", len(table)), column=column)
    ax.set(xlabel=f"speedup: {baseline} ms/token ÷ method ms/token, side by side (geometric mean over prompts, 95% CI)",
           ylabel="")
    return _finish(fig, title)


def category_speedups(table: pd.DataFrame, title: str = "Speedup over AR by kind of text", baseline: str = "AR",
                      names: Mapping[str, str] | None = None):
    """One wide panel: per method (a row), each kind of text's per-token speedup as a dot of its colour
    with its 95% interval (the legend gives each kind's prompt count); the dashed line is 1x."""
    table = table.assign(method=_named(table.method, names))
    categories, methods = list(table.category.unique()), list(table.method.unique())
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(methods) + 1.6))
    colors = dict(zip(categories, sns.color_palette("colorblind", len(categories))))
    offsets = dict(zip(categories, [0.6 * (i / max(len(categories) - 1, 1) - 0.5) for i in range(len(categories))]))
    for category in categories:
        part = table[table.category == category].set_index("method").reindex(methods)
        y = [methods.index(m) + offsets[category] for m in methods]
        low = (part.speedup - part.speedup_low).clip(lower=0).fillna(0)
        high = (part.speedup_high - part.speedup).clip(lower=0).fillna(0)
        prompts = int(part.prompts.max()) if part.prompts.notna().any() else 0
        ax.errorbar(part.speedup, y, xerr=[low, high], fmt="o", color=colors[category], capsize=2, markersize=5,
                    label=f"{category} (n={prompts})")
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(methods)), methods)
    ax.invert_yaxis()
    ax.set(xlabel=f"per-token speedup over {baseline}, side by side (geometric mean over prompts, 95% CI)", ylabel="")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), title="kind of text")
    return _finish(fig, title)


def _named(labels, names: Mapping[str, str] | None):
    """Method names as `names` maps them (the short ones, `words.short_names`); unmapped ones stay."""
    return labels if names is None else labels.map(lambda name: names.get(name, name))


def tree_vs_chain(table: pd.DataFrame, title: str = "Token trees against chains of the same source"):
    """One panel per source kind: per kind of text, the tree's speedup over the chain (per-token time,
    paired per prompt, geometric mean) as a dot with its 95% interval, the picker's prediction as a
    hollow diamond; each line's value and prompt count written beside the panel. Ratios sit near 1, so
    the axis spans the intervals, not 0 to them."""
    kinds = list(dict.fromkeys(table.source_kind))
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 0.6 * table.category.nunique() + 1.8),
                             squeeze=False, sharex=True)
    for ax, kind in zip(axes[0], kinds):
        part = table[table.source_kind == kind].reset_index(drop=True)
        y = list(range(len(part)))
        errors = [(part.speedup - part.speedup_low).fillna(0).clip(lower=0),
                  (part.speedup_high - part.speedup).fillna(0).clip(lower=0)]
        ax.errorbar(part.speedup, y, xerr=errors, fmt="o", color="tab:blue", capsize=3, label="measured (95% CI)")
        if part.predicted.notna().any():
            ax.scatter(part.predicted, y, marker="D", facecolors="none", edgecolors="black", zorder=3,
                       label="predicted by the picker")
        for row, line in part.iterrows():
            ax.annotate(f"{line.speedup:.2f}x (n={int(line.prompts)})", (1.02, row), xycoords=("axes fraction", "data"),
                        va="center", fontsize=8)
        ax.axvline(1.0, color="gray", linestyle="--")
        ax.set_yticks(y, part.category)
        ax.invert_yaxis()
        ax.set(title=kind, xlabel="chain ms/token ÷ tree ms/token", ylabel="")
    # one legend for the panels, under the figure's axes labels (tight_layout leaves it room)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def k_sweep(table: pd.DataFrame, title: str = "Draft length k: measured and predicted speedup"):
    """Per category: measured speedup (geometric mean over prompts, 95% interval) and Leviathan's
    prediction (dashed) against k. `table` is `metrics.predicted_vs_measured`."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (category, group), color in zip(table.groupby("category"), sns.color_palette("tab10")):
        group = group.sort_values("k")
        errors = [(group.speedup - group.speedup_low).fillna(0), (group.speedup_high - group.speedup).fillna(0)]
        ax.errorbar(group.k, group.speedup, yerr=errors, marker="o", color=color, capsize=3,
                    label=f"{category} measured (n={int(group.prompts.max())})")
        ax.plot(group.k, group.predicted_speedup, "--", color=color, label=f"{category} predicted")
    ax.legend(fontsize=8)
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set(xlabel="draft length k", ylabel="speedup over AR")
    return _finish(fig, title)


def predicted_vs_measured(table: pd.DataFrame, title: str = "Predicted vs measured speedup",
                          xlabel: str = "predicted (1 - a^(k+1)) / ((1 - a)(kc + 1))", band: float = 0.15):
    """A predicted speedup against the measured one: the diagonal is a perfect model, the grey band
    ±`band` of it. With `category` and `source` columns, the kind of text is the colour and the source the
    marker; the legend sits beside the plot, never over a point."""
    fig, ax = plt.subplots(figsize=(13, 6))
    top = max(table.predicted_speedup.max(), table.speedup.max()) * 1.1
    line = pd.Series([0, top])
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="0.9", label=f"within ±{band:.0%}")
    ax.plot(line, line, "k--", linewidth=1, label="predicted = measured")
    coded = {"hue": "category", "style": "source"} if {"category", "source"} <= set(table) else {"hue": table.get("label")}
    sns.scatterplot(data=table, x="predicted_speedup", y="speedup", s=80, ax=ax, **coded)
    ax.set(xlim=(0, top), ylim=(0, top), xlabel=xlabel, ylabel="measured")
    ax.set_aspect("equal")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=9)
    return _finish(fig, title)


def acceptance_by_position(table: pd.DataFrame, title: str = "Acceptance by draft position",
                           names: Mapping[str, str] | None = None):
    """Per method: the chance that token i is accepted once every token before it was, by position i."""
    fig, ax = plt.subplots(figsize=(11, 4.4))
    sns.lineplot(data=table.assign(decoder=_named(table.decoder, names)), x="position", y="acceptance",
                 hue="decoder", marker="o", ax=ax)
    ax.set(xlabel="position i in the draft block", ylabel="P(token i accepted | tokens before it accepted)",
           ylim=(0, 1.05))
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), title="method")  # beside the lines, never over them
    return _finish(fig, title)


def roofline(table: pd.DataFrame, title: str = "Tokens/s against the memory-bandwidth bound"):
    """Per AR loop: tokens/s with the prefill, while decoding, and bandwidth / weight bytes read per token."""
    labels = {"tokens_per_second": "measured, prefill included", "decode_tokens_per_second": "measured, decoding",
              "bound_tokens_per_second": "bandwidth bound"}
    data = table.melt(id_vars="method", value_vars=list(labels), var_name="kind", value_name="tokens/s")
    data["kind"] = data.kind.map(labels)
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(table) + 1.5))
    sns.barplot(data=data, y="method", x="tokens/s", hue="kind", ax=ax)
    for bars in ax.containers:
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    ax.set(xlabel="generated tokens / s (measured: geometric mean over prompts)", ylabel="")
    return _finish(fig, title)


def cost_curves(curves: pd.DataFrame, title: str = "Cost of one forward over n tokens, T(n) / T(1)",
                hue: str = "model", relative: bool = True):
    """T(n)/T(1) (or T(n) in ms) per model or variant: where the curve is flat, more tokens per
    forward are nearly free."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=curves, x="n", y="relative_to_one" if relative else "ms", hue=hue, marker="o", ax=ax)
    if relative:
        ax.axhline(1.0, color="gray", linestyle=":")
    ax.set(xlabel="tokens in one forward (n), after a 200-token prefix",
           ylabel="T(n) / T(1)" if relative else "T(n), ms (median)")
    return _finish(fig, title)


def agreement_bars(rows: pd.DataFrame, title: str = "Token agreement with the target's greedy output",
                   names: Mapping[str, str] | None = None):
    """Mean fraction of the reference text reproduced before the first differing token."""
    rows = rows.assign(decoder=_named(rows.decoder, names))
    fig, ax = plt.subplots(figsize=(8, 0.55 * rows.decoder.nunique() + 1.5))
    sns.barplot(data=rows, y="decoder", x="agreement", hue="decoder", legend=False, errorbar=None, ax=ax)
    ax.set(xlim=(0, 1.05), xlabel="agreement (matching prefix / reference length)", ylabel="")
    return _finish(fig, title)


def tokens_per_forward(rows: pd.DataFrame, title: str = "Generated tokens per target forward pass", hue: str = "category",
                       names: Mapping[str, str] | None = None):
    """Mean tokens per target forward per method, one bar per `hue` (kind of text), 95% intervals."""
    rows = rows.assign(decoder=_named(rows.decoder, names))
    fig, ax = plt.subplots(figsize=(11, 0.3 * rows.decoder.nunique() * max(rows[hue].nunique(), 2) + 1.5))
    sns.barplot(data=rows, y="decoder", x="tokens_per_target_forward", hue=hue, errorbar=("ci", 95), ax=ax)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, never over them
    ax.set(xlabel="tokens per target forward (prefill counted)", ylabel="")
    return _finish(fig, title)


def summary_speedups(table: pd.DataFrame, title: str = "Every method: speedup over its own experiment's AR baseline"):
    """One bar per (experiment, method) with its 95% interval and prompt count; methods not declared
    lossless are hatched. Bars of different experiments measure different prompts and baselines."""
    data = table[table.speedup.notna()].assign(label=table.experiment + " · " + table.method)
    data = data.sort_values(["experiment", "speedup"])
    for column in ("speedup_low", "speedup_high", "prompts"):
        if column not in data:
            data[column] = float("nan")
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(data) + 1.5))
    palette = dict(zip(sorted(data.experiment.unique()), sns.color_palette("tab10")))
    interval_bars(ax, data.label, data.fillna({"prompts": 0}), colors=[palette[e] for e in data.experiment],
                  hatched=[not bool(lossless) for lossless in data.lossless])
    ax.set(xlabel="per-token speedup over AR (geometric mean over prompts, 95% CI; hatched = not lossless)", ylabel="")
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
              ("peak_working_mb", "peak working memory while generating,\nabove each sample's start (MB)"),
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


def speculative_bars(table: pd.DataFrame, title: str = "Speculative decoding with quantized targets and drafts"):
    """Per target/draft pair: acceptance rate, speedup over AR of the same target variant (95%
    interval over prompts, dashed line = no gain) and agreement with that target's greedy AR."""
    order = list(table.pair)
    fig, axes = plt.subplots(1, 3, figsize=(16, _height(len(order))), sharey=True)
    sns.barplot(data=table, y="pair", x="acceptance_rate", hue="target", dodge=False, order=order,
                errorbar=None, ax=axes[0])
    axes[0].set(xlim=(0, 1.05), xlabel="acceptance rate (accepted / proposed draft tokens)", ylabel="")
    interval_bars(axes[1], table.pair, table, invert=False)  # seaborn already put the shared axis in table order
    axes[1].set(xlabel="per-token speedup over AR of the same target (95% CI)", ylabel="")
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
    """Total, AR and consistency loss per optimizer step (thin) and their moving average (thick), one
    colour per training recipe (a `recipe` column, where there is one)."""
    columns = [("loss", "total (weighted)"), ("ar_loss", "AR (cross-entropy)"), ("consistency_loss", "consistency (KL)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    runs = losses.groupby("recipe", sort=False) if "recipe" in losses else [("", losses)]
    for (recipe, run), color in zip(runs, sns.color_palette("tab10")):
        for ax, (column, label) in zip(axes, columns):
            ax.plot(run.step, run[column], alpha=0.3, linewidth=0.8, color=color)
            ax.plot(run.step, run[column].rolling(window, min_periods=1).mean(), linewidth=2, color=color,
                    label=recipe or None)
            ax.set(xlabel="optimizer step", ylabel=label)
    if "recipe" in losses and losses.recipe.nunique() > 1:
        axes[0].legend(fontsize=8)
    return _finish(fig, title)


def learning_curve(curve: pd.DataFrame, title: str = "CLLM learning curves on held-out validation prompts"):
    """Against training steps, one line per recipe (step 0 is the base model): tokens per forward of
    Jacobi decoding, the NLL of the base model's greedy answers (how far the text drifted), and the share
    answered right where the prompt set has an answer key."""
    panels = [("tokens_per_target_forward", "tokens per forward (mean over prompts)"),
              ("nll_per_token", "NLL of the base's answers (nats/token)")]
    if curve.exact_match.notna().any():
        panels.append(("exact_match", "answered right"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for (recipe, run), color in zip(curve.groupby("recipe", sort=False), sns.color_palette("tab10")):
        for ax, (column, label) in zip(axes[0], panels):
            ax.plot(run.step, run[column], marker="o", color=color, label=recipe)
            ax.set(xlabel="training steps", ylabel=label)
    if "exact_match" in dict(panels):
        axes[0, -1].set_ylim(0, 1)
    axes[0, 0].legend(fontsize=8)
    return _finish(fig, f"{title} ({int(curve.prompts.max())} prompts)")


def nll_bars(nll: pd.DataFrame, title: str = "NLL of the base model's held-out greedy text"):
    """Per-token negative log-likelihood of the same texts under each model (lower = more likely)."""
    fig, ax = plt.subplots(figsize=(7, 0.6 * nll.model.nunique() + 1.5))
    sns.barplot(data=nll, y="model", x="nll_per_token", hue="model", legend=False, errorbar=("pi", 100), ax=ax)
    sns.stripplot(data=nll, y="model", x="nll_per_token", color="black", size=3, alpha=0.5, ax=ax)
    ax.set(xlabel="mean NLL per token (nats)", ylabel="")
    return _finish(fig, title)


def batch_scaling(table: pd.DataFrame, predicted: pd.DataFrame | None = None, names: Mapping[str, str] | None = None,
                  title: str = "Batches: throughput and latency against batch size"):
    """Three panels against batch size (log scale), one line per method with 95% intervals: throughput
    (tokens/s over the batch), throughput over batched AR's on the same batches (the cost model's
    prediction dashed, `predicted` from `batch_tables.predicted_vs_measured`), and per-request latency
    speedup over batched AR's."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    colors = dict(zip(table.decoder.unique(), sns.color_palette("tab10")))
    panels = [("throughput", "tokens/s over the batch"), ("speedup", "throughput ÷ batched AR's"),
              ("latency_speedup", "latency speedup over batched AR (per request)")]
    for ax, (column, label) in zip(axes, panels):
        for decoder, group in table.groupby("decoder", sort=False):
            group = group.sort_values("batch_size")
            errors = [(group[column] - group[f"{column}_low"]).fillna(0), (group[f"{column}_high"] - group[column]).fillna(0)]
            ax.errorbar(group.batch_size, group[column], yerr=errors, marker="o", capsize=3, color=colors[decoder],
                        label=(names or {}).get(decoder, decoder))
        if column == "speedup" and predicted is not None and not predicted.empty:
            for decoder, group in predicted.groupby("decoder", sort=False):
                group = group.sort_values("batch_size")
                ax.plot(group.batch_size, group.predicted, "--", color=colors[decoder], alpha=0.8)
        if column != "throughput":
            ax.axhline(1.0, color="gray", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(table.batch_size.unique()), labels=[str(b) for b in sorted(table.batch_size.unique())])
        ax.set(xlabel="batch size", ylabel=label)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=9, title="method (dashed: predicted)")
    return _finish(fig, title)


def batch_costs(grid: pd.DataFrame, title: str = "Cost of one forward over b rows of n tokens, T_b(n) / T_1(1)"):
    """The target's forward cost against the tokens it holds (b · n), one line per batch size: where the
    lines leave the flat part, verifying k + 1 tokens a row stops being nearly free."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    data = grid.assign(tokens=grid.batch * grid.n)
    sns.lineplot(data=data, x="tokens", y="relative_to_one", hue="batch", marker="o", ax=ax, palette="viridis")
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set(xlabel="tokens in the forward (b rows x n tokens)", ylabel="T_b(n) / T_1(1)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), title="batch size")
    return _finish(fig, title)
