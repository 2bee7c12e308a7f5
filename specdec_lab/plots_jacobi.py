"""Figures of notebook 04 (Jacobi decoding and CLLMs); each takes a table and returns the Figure.
(Kept apart from plots.py for now; same conventions.)"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

sns.set_theme(style="whitegrid", context="notebook")


def _finish(fig, title: str):
    fig.suptitle(title)
    fig.tight_layout()
    return fig


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
