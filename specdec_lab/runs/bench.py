"""Benchmark runner: methods x prompts x repeats -> one JSONL row per finished sample -> DataFrame.

Rows are appended the moment a sample finishes, so an interrupted run loses at most the sample in
flight, and a rerun with the same configuration skips what the file already holds. Every row
carries a hash of the configuration it was produced with: a rerun with other parameters writes new
rows beside the old ones and never mixes with them.

The unit of work is one (prompt, repeat): every method on it, back to back, in one process. The
rows of a ratio must come from the same process (a resumed run may land on a machine in another
state), so a unit that an interruption left incomplete is run again whole on resume.
"""

from __future__ import annotations

import platform
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from specdec_lab import memory
from specdec_lab.data import Prompt, encode
from specdec_lab.machine import cpu_model  # noqa: F401  (bench.cpu_model: the CPU in every row)
from specdec_lab.method import Method
from specdec_lab.result import GenerationResult
from specdec_lab.runs import jsonl


# What a row holds besides its configuration's numbers: rows of an older format are not resumed, so a
# table never mixes rows with and without a field (2: every token's origin and step, the token views; 3: the
# tokens each target forward fed, `forward_tokens`).
ROW_FORMAT = 3


def environment() -> dict:
    """What a number depends on besides the code: hardware, library versions, threads."""
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        **cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import bitsandbytes

        env["bitsandbytes"] = bitsandbytes.__version__
    except Exception:  # bitsandbytes is optional for most experiments
        env["bitsandbytes"] = None
    return env


def result_row(result: GenerationResult, tokenizer, **labels) -> dict:
    """One JSONL row: the labels, the result record, its text and the derived per-sample numbers."""
    return {
        **labels,
        **result.to_dict(),
        "text": tokenizer.decode(result.tokens, skip_special_tokens=True) if tokenizer is not None else "",
        "num_tokens": result.num_tokens,
        "tokens_per_second": result.tokens_per_second,
        "ms_per_token": 1000 * result.wall_time_s / max(result.num_tokens, 1),
        "tokens_per_target_forward": result.tokens_per_target_forward,
        "acceptance_rate": result.acceptance_rate,
    }


def run(
    methods: Sequence[Method],
    prompts: Sequence[Prompt],
    tokenizer,
    out: str | Path,
    repeats: int = 3,
    warmup: int = 1,
    config: Mapping | None = None,
    chat: bool = True,
    desc: str = "benchmark",
    only_on: Mapping[str, Collection[str]] | None = None,
) -> pd.DataFrame:
    """Run every method on every prompt `repeats` times; return the rows (this configuration's, these
    prompts and repeats), running only those the file `out` does not already hold.

    Methods run interleaved (prompt -> repeat -> method) so slow drifts of the machine hit every
    method alike; `warmup` untimed runs per method on the first prompt come first. `only_on` maps a
    method name to the prompt ids it runs on (all prompts when absent): a sweep on a few prompts
    then shares the baseline rows of the same units instead of timing its own.
    """
    check_arguments(methods, prompts, repeats, only_on or {})
    names = [method.name for method in methods]
    only_on = {name: set(ids) for name, ids in (only_on or {}).items()}

    def names_on(prompt_id: str) -> list[str]:
        return [name for name in names if name not in only_on or prompt_id in only_on[name]]

    run_config = {"config": dict(config or {}), "decoders": sorted(names), "chat": chat, "row_format": ROW_FORMAT}
    if only_on:
        run_config["only_on"] = {name: sorted(ids) for name, ids in sorted(only_on.items())}
    run_id = jsonl.config_hash(run_config)
    complete = complete_units(jsonl.rows_of_run(out, run_id), names_on)
    units = [(p, rep) for p in prompts for rep in range(repeats) if (p.id, rep) not in complete]
    encoded = {p.id: encode(tokenizer, p, chat=chat) for p in prompts}

    if units and warmup:
        for method in tqdm(methods, desc=f"{desc}: warm-up", leave=False):
            for _ in range(warmup):
                method(encoded[prompts[0].id])
    env, process = environment(), uuid.uuid4().hex[:12]
    done = len(prompts) * repeats - len(units)
    bar = tqdm(units, desc=desc, initial=done, total=done + len(units), unit="prompt")
    with memory.gc_frozen():  # no collector pass over the models inside one method's timing
        for prompt, repeat in bar:
            for method in methods:
                if method.name not in names_on(prompt.id):
                    continue
                bar.set_postfix_str(method.name)
                result = method(encoded[prompt.id])
                jsonl.append(out, result_row(result, tokenizer, run_id=run_id, process=process, **method.labels(),
                                             prompt_id=prompt.id, category=prompt.category, repeat=repeat,
                                             config=run_config["config"], env=env))

    # the file may hold more of this configuration (an earlier run over more prompts or repeats): not asked for now
    complete = complete_units(jsonl.rows_of_run(out, run_id), names_on)
    # a row's labels are its method's record as the line-up describes it now (the run id ties the
    # row to these names and this configuration), so rows written before a label was added have it too
    labels = {method.name: method.labels() for method in methods}
    rows = [{**row, **labels[row["decoder"]]} for p in prompts for rep in range(repeats) for row in complete[(p.id, rep)]]
    return pd.DataFrame(rows)


def check_arguments(methods: Sequence[Method], prompts: Sequence[Prompt], repeats: int,
                    only_on: Mapping[str, Collection[str]]) -> None:
    """Fail before anything runs, naming the bad argument."""
    if not methods:
        raise ValueError("no methods given: pass a list of Method records")
    names = [method.name for method in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique within a run (rows are keyed by them): {names}")
    if not prompts:
        raise ValueError("empty prompt set: check prompt_set and num_prompts in the parameters")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    unknown = sorted(set(only_on) - set(names))
    if unknown:
        raise ValueError(f"only_on names methods that are not in the run: {unknown}; known are {names}")


def complete_units(rows: list[dict], names: Sequence[str] | Callable[[str], Sequence[str]]
                   ) -> dict[tuple[str, int], list[dict]]:
    """(prompt_id, repeat) -> the rows of its latest complete unit: every method's row (`names`, or
    `names(prompt_id)` where methods run on some prompts only), all written by one process. Units an
    interruption left incomplete are absent (they are run again whole)."""
    names_on = names if callable(names) else (lambda prompt_id: names)
    by_process: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        by_process.setdefault((row["prompt_id"], row["repeat"], row.get("process")), {})[row["decoder"]] = row
    complete = {}
    for (prompt_id, repeat, _), written in by_process.items():  # in file order: a later process wins
        expected = names_on(prompt_id)
        if set(expected) <= set(written):
            complete[(prompt_id, repeat)] = [written[name] for name in expected]
    return complete


# --- batches: several prompts decoded together ---------------------------------------------------------

def batch_units(prompts: Sequence[Prompt], batch_sizes: Sequence[int], repeats: int, seed: int = 0
                ) -> list[tuple[int, int, int, list[Prompt]]]:
    """(batch size, repeat, group, the group's prompts) for every batch to run: per repeat the prompts
    are shuffled (seeded by seed + repeat) and cut into consecutive groups of each batch size, so every
    repeat pairs them differently. A last group short of the size is left out: where every batch size
    divides the prompt count (notebook 05's parameters check it), each size decodes the same prompts."""
    import random

    units = []
    for repeat in range(repeats):
        order = list(prompts)
        random.Random(seed + repeat).shuffle(order)
        for batch in batch_sizes:
            for group in range(len(order) // batch):
                units.append((batch, repeat, group, order[group * batch:(group + 1) * batch]))
    return units


def run_batches(
    methods: Sequence[Method],
    prompts: Sequence[Prompt],
    tokenizer,
    out: str | Path,
    batch_sizes: Sequence[int],
    repeats: int = 1,
    warmup: int = 1,
    config: Mapping | None = None,
    seed: int = 0,
    chat: bool = True,
    desc: str = "batches",
) -> pd.DataFrame:
    """`run` for batched methods: each method's `decode` takes a batch of prompts' ids and returns one
    result per prompt. The unit of work is one batch (`batch_units`): every method on it, back to back,
    in one process, one row per request (`batch_size`, `repeat`, `group` beside the row's labels). A
    batch an interruption left incomplete, or whose rows hold other prompts than the batch now cut from
    the prompt set, is run again whole on resume. The `warmup` runs take the largest batch to run (the
    memory a batch takes grows with its size)."""
    check_arguments(methods, prompts, repeats, {})
    if not batch_sizes or any(int(b) < 1 for b in batch_sizes) or max(batch_sizes) > len(prompts):
        raise ValueError(f"batch sizes must be >= 1 and at most the {len(prompts)} prompts, got {list(batch_sizes)}: "
                         "lower the batch sizes or raise num_prompts")
    names = [method.name for method in methods]
    run_config = {"config": dict(config or {}), "decoders": sorted(names), "chat": chat, "row_format": ROW_FORMAT,
                  "batch_sizes": list(batch_sizes), "seed": seed}
    run_id = jsonl.config_hash(run_config)
    units = batch_units(prompts, batch_sizes, repeats, seed)
    members = {unit[:3]: {p.id for p in unit[3]} for unit in units}
    complete = complete_batches(jsonl.rows_of_run(out, run_id), names, members)
    todo = [unit for unit in units if unit[:3] not in complete]
    encoded = {p.id: encode(tokenizer, p, chat=chat) for p in prompts}

    if todo and warmup:
        largest = [encoded[p.id] for p in max(todo, key=lambda unit: unit[0])[3]]
        for method in tqdm(methods, desc=f"{desc}: warm-up", leave=False):
            for _ in range(warmup):
                method(largest)
    env, process = environment(), uuid.uuid4().hex[:12]
    bar = tqdm(todo, desc=desc, initial=len(units) - len(todo), total=len(units), unit="batch")
    with memory.gc_frozen():  # no collector pass over the models inside one method's timing
        for batch, repeat, group, group_prompts in bar:
            for method in methods:
                bar.set_postfix_str(f"b={batch} {method.name}")
                results = method([encoded[p.id] for p in group_prompts])
                if len(results) != len(group_prompts):
                    raise ValueError(f"{method.name} returned {len(results)} results for a batch of {len(group_prompts)}")
                for prompt, result in zip(group_prompts, results):
                    jsonl.append(out, result_row(result, tokenizer, run_id=run_id, process=process, **method.labels(),
                                                 prompt_id=prompt.id, category=prompt.category, batch_size=batch,
                                                 repeat=repeat, group=group, config=run_config["config"], env=env))
    complete = complete_batches(jsonl.rows_of_run(out, run_id), names, members)
    labels = {method.name: method.labels() for method in methods}
    return pd.DataFrame([{**row, **labels[row["decoder"]]} for unit in units for row in complete.get(unit[:3], [])])


def complete_batches(rows: list[dict], names: Sequence[str], members: Mapping[tuple[int, int, int], set[str]]
                     ) -> dict[tuple[int, int, int], list[dict]]:
    """(batch size, repeat, group) -> the rows of its latest complete run: every method's row of every
    request of the batch (the prompts `members` gives it), all written by one process."""
    by_process: dict[tuple, dict[str, list[dict]]] = {}
    for row in rows:
        key = (row["batch_size"], row["repeat"], row["group"], row.get("process"))
        by_process.setdefault(key, {}).setdefault(row["decoder"], []).append(row)
    complete = {}
    for (batch, repeat, group, _), written in by_process.items():  # in file order: a later process wins
        expected = members.get((batch, repeat, group))
        if expected is not None and set(names) <= set(written) and all(
                {row["prompt_id"] for row in written[name]} == expected and len(written[name]) == batch for name in names):
            complete[(batch, repeat, group)] = [row for name in names for row in written[name]]
    return complete
