"""Collect Jacobi trajectories: the CLLM training data.

Jacobi-decode each prompt with the model and keep, for every n-token block, each state the block
passed through on its way to its fixed point (the greedy output). One JSONL line per prompt, appended
as soon as the prompt is done; a rerun with the same settings skips the prompts the file holds.
Generations that loop (an n-gram repeated many times) are kept in the file, flagged `degenerate`,
and left out of the training samples: training a model to jump to a loop teaches it to loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from specdec_lab.data import Prompt, encode
from specdec_lab.decoders import jacobi
from specdec_lab.quality import common_prefix_length
from specdec_lab.runs import jsonl


@dataclass(frozen=True)
class Sample:
    """One training example: a block state on the way to its fixed point, with its context."""

    prompt_ids: list[int]
    output_ids: list[int]  # the whole greedy output (the AR loss target)
    start: int  # where the block starts in output_ids
    state: list[int]  # the block as Jacobi iteration `iteration` saw it
    fixed_point: list[int]  # == output_ids[start:start + len(state)]
    next_state: list[int]  # the state one iteration later (for the local consistency loss)
    block_index: int
    iteration: int
    prompt_id: str = ""


def max_ngram_repeats(tokens: Sequence[int], n: int) -> int:
    """How often the most frequent n-gram occurs (0 for outputs shorter than n)."""
    counts = Counter(tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1))
    return max(counts.values(), default=0)


def is_degenerate(tokens: Sequence[int], ngram: int = 8, max_repeats: int = 3) -> bool:
    """True when some `ngram`-token sequence occurs `max_repeats` times or more: in a loop of any
    period p <= ngram every n-gram recurs, so this catches "x, x, x, ..." and "AVG(a), AVG(a), ..."
    alike, while a normal SQL query rarely repeats 8 tokens three times."""
    return max_ngram_repeats(tokens, ngram) >= max_repeats


def collect(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    out: str | Path,
    max_new_tokens: int,
    block_size: int = 16,
    init: str = "prompt_tokens",
    seed: int = 0,
    chat: bool = True,
    ngram: int = 8,
    max_repeats: int = 3,
    config: dict | None = None,
    on_record: Callable[[dict], None] | None = None,
    desc: str = "Jacobi trajectories",
) -> list[dict]:
    """Jacobi trajectories of `model` for `prompts`, one record per prompt (this configuration's
    records, in prompt order). `config` names what else the records depend on (e.g. the model);
    `on_record` is called after each record is written (progress hooks, tests)."""
    if not prompts:
        raise ValueError("no prompts to collect trajectories for: check the prompt counts in the parameters")
    run_id = jsonl.config_hash({"config": dict(config or {}), "max_new_tokens": max_new_tokens, "block_size": block_size,
                          "init": init, "seed": seed, "chat": chat})
    done = jsonl.done(out, run_id, key=lambda row: row["prompt_id"])
    todo = [p for p in prompts if p.id not in done]
    for prompt in tqdm(todo, desc=desc, initial=len(prompts) - len(todo), total=len(prompts)):
        prompt_ids = encode(tokenizer, prompt, chat=chat)
        result = jacobi.generate(model, prompt_ids, max_new_tokens, block_size=block_size, init=init, seed=seed,
                                 record_states=True)
        record = {
            "run_id": run_id, "prompt_id": prompt.id, "group": prompt.group, "prompt_ids": prompt_ids,
            "output_ids": result.tokens, "blocks": [asdict(trace) for trace in result.jacobi.traces],
            "degenerate": is_degenerate(result.tokens, ngram, max_repeats),
            "target_forwards": result.target_forwards, "wall_time_s": result.wall_time_s,
        }
        jsonl.append(out, record)
        if on_record is not None:
            on_record(record)
    by_id = jsonl.done(out, run_id, key=lambda row: row["prompt_id"])
    return [by_id[p.id] for p in prompts if p.id in by_id]


def answer_records(tokenizer, prompts: Sequence[Prompt], answers: dict[str, str], end_id: int,
                   chat: bool = True) -> list[dict]:
    """Training records of reference answers instead of trajectories (`answers` by prompt id, each
    ended by `end_id`, the token that stops a generation): supervised fine-tuning with the same loop,
    e.g. on Spider's gold SQL, to start a CLLM from a model that knows the task, as the paper does."""
    missing = [p.id for p in prompts if p.id not in answers]
    if missing:
        raise ValueError(f"no reference answer for {len(missing)} prompts, e.g. {missing[0]!r}")
    records = [{"prompt_id": p.id, "group": p.group, "prompt_ids": encode(tokenizer, p, chat=chat),
                "output_ids": tokenizer.encode(answers[p.id], add_special_tokens=False) + [end_id]} for p in prompts]
    run_id = jsonl.config_hash({"answers": [(r["prompt_ids"], r["output_ids"]) for r in records]})  # other answers: another run
    return [{"run_id": run_id, **r, "answer": True, "blocks": [], "degenerate": False, "target_forwards": 0,
             "wall_time_s": 0.0} for r in records]


def usable(records: Sequence[dict]) -> tuple[list[dict], int]:
    """(records to train on, how many degenerate ones were removed)."""
    kept = [r for r in records if not r["degenerate"]]
    return kept, len(records) - len(kept)


def samples(records: Sequence[dict]) -> list[Sample]:
    """Every state with at least one position after its first wrong token: those positions are
    predicted from a wrong context, which is what the consistency loss trains. The other states
    teach nothing (the converged prefix is masked, and the first wrong token is predicted from a
    correct context, where state and fixed point give the same distribution). A reference answer's
    record (`answer_records`) gives one sample without a state: AR loss only."""
    found = []
    for record in records:
        if record.get("answer"):  # a reference answer (`answer_records`): the AR loss alone
            found.append(Sample(record["prompt_ids"], record["output_ids"], start=0, state=[], fixed_point=[],
                                next_state=[], block_index=-1, iteration=-1, prompt_id=record["prompt_id"]))
        for block_index, block in enumerate(record["blocks"]):
            fixed_point, states = block["fixed_point"], block["states"]
            for iteration, state in enumerate(states):
                if common_prefix_length(state, fixed_point) >= len(fixed_point) - 1:
                    continue
                next_state = states[iteration + 1] if iteration + 1 < len(states) else fixed_point
                found.append(Sample(record["prompt_ids"], record["output_ids"], block["start"], state, fixed_point,
                                    next_state, block_index, iteration, record["prompt_id"]))
    return found


def summary(records: Sequence[dict]) -> dict:
    """Counts for the notebook: prompts, degenerate ones, blocks, states, base tokens per forward."""
    kept, removed = usable(records)
    tokens = sum(len(r["output_ids"]) for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    return {
        "prompts": len(records), "degenerate_removed": removed, "training_prompts": len(kept),
        "blocks": sum(len(r["blocks"]) for r in kept), "training_states": len(samples(kept)),
        "base_tokens_per_forward": tokens / forwards if forwards else float("nan"),
        "collection_minutes": sum(r["wall_time_s"] for r in records) / 60,
    }
