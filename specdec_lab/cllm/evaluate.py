"""What notebook 04 measures about a CLLM: the decoder line-up, per-block Jacobi statistics, and
quality drift (agreement with the base model's greedy text, likelihood of held-out text)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import pandas as pd

from specdec_lab.cllm.losses import sequence_nll
from specdec_lab.data import Prompt, encode
from specdec_lab.decoders import autoregressive, jacobi
from specdec_lab.models import LoadedModel

BASE_AR = "AR (base)"
BASE_JACOBI = "Jacobi (base)"
CLLM_JACOBI = "Jacobi (CLLM)"


def spread_over_groups(prompts: Sequence[Prompt], n: int) -> list[Prompt]:
    """The first `n` prompts taken round-robin over groups (Spider: databases), so a few prompts
    still span many databases instead of the first database's questions."""
    by_group: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_group.setdefault(prompt.group, []).append(prompt)
    rounds = max((len(queue) for queue in by_group.values()), default=0)
    ordered = [queue[i] for i in range(rounds) for queue in by_group.values() if i < len(queue)]
    return ordered[:n]


def line_up(base: LoadedModel, cllm: LoadedModel | None, max_new_tokens: int, block_size: int,
            init: str = "prompt_tokens") -> dict:
    """AR on the base model (the baseline and the reference text), Jacobi on the base and on the CLLM."""
    jacobi_of = partial(jacobi.generate, max_new_tokens=max_new_tokens, block_size=block_size, init=init)
    decoders = {
        BASE_AR: partial(autoregressive.generate, base.model, max_new_tokens=max_new_tokens),
        BASE_JACOBI: partial(jacobi_of, base.model),
    }
    if cllm is not None:
        decoders[CLLM_JACOBI] = partial(jacobi_of, cllm.model)
    return decoders


def jacobi_only(decoders: dict) -> dict:
    """The Jacobi decoders of a line-up (for token counts, where no AR baseline is timed)."""
    return {name: decode for name, decode in decoders.items() if name != BASE_AR}


def seen_and_held_out(seen: pd.DataFrame, held_out: pd.DataFrame) -> pd.DataFrame:
    """The Jacobi rows on training prompts and on held-out ones, labelled in a `prompts` column. A
    CLLM that gains on the prompts it trained on but not on new ones has learned them, not the task."""
    both = pd.concat([seen.assign(prompts="training databases"), held_out.assign(prompts="held-out databases")])
    return both[both.decoder != BASE_AR].reset_index(drop=True)


def block_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per Jacobi block: iterations to converge, fast-forwarded and stationary tokens."""
    records = []
    for row in rows.itertuples():
        extras = row.extras or {}
        for block, iterations in enumerate(extras.get("iterations_per_block", [])):
            records.append({"decoder": row.decoder, "prompt_id": row.prompt_id, "repeat": row.repeat, "block": block,
                            "iterations": iterations, "fast_forward": extras["fast_forward_tokens"][block],
                            "stationary": extras["stationary_tokens"][block]})
    return pd.DataFrame(records)


def block_summary(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per decoder: mean iterations per block, fast-forwarded and stationary tokens per block."""
    return blocks.groupby("decoder").agg(blocks=("block", "size"), iterations_per_block=("iterations", "mean"),
                                         fast_forward_per_block=("fast_forward", "mean"),
                                         stationary_per_block=("stationary", "mean"))


def held_out_nll(models: dict[str, LoadedModel], rows: pd.DataFrame, prompts: Sequence[Prompt],
                 reference_decoder: str = BASE_AR) -> pd.DataFrame:
    """Mean NLL per token of the reference decoder's texts (the base model's greedy answers to
    held-out prompts) under each model: how much the CLLM drifted from the base as a language model."""
    reference = rows[(rows.decoder == reference_decoder) & (rows.repeat == 0)].set_index("prompt_id").tokens
    records = []
    for prompt in prompts:
        for name, loaded in models.items():
            prompt_ids = encode(loaded.tokenizer, prompt)
            records.append({"model": name, "prompt_id": prompt.id,
                            "nll_per_token": sequence_nll(loaded.model, prompt_ids, reference[prompt.id])})
    return pd.DataFrame(records)
