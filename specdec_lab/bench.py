"""Benchmark runner: decoders x prompts x repeats -> one JSONL row per finished sample -> DataFrame.

Rows are appended the moment a sample finishes, so an interrupted run loses at most the sample in
flight, and a rerun with the same configuration skips what the file already holds. Every row
carries a hash of the configuration it was produced with: a rerun with other parameters writes new
rows beside the old ones and never mixes with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from specdec_lab.data import Prompt, encode
from specdec_lab.result import GenerationResult

Decoder = Callable[[list[int]], GenerationResult]


def environment() -> dict:
    """What a number depends on besides the code: hardware, library versions, threads."""
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import bitsandbytes

        env["bitsandbytes"] = bitsandbytes.__version__
    except Exception:  # bitsandbytes is optional for most experiments
        env["bitsandbytes"] = None
    return env


def config_hash(config: Mapping) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_rows(path: Path) -> list[dict]:
    """All complete rows of a JSONL file; a line cut off by an interruption is skipped."""
    if not path.exists():
        return []
    rows = []
    with path.open() as handle:
        for line in handle:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _append(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _row(result: GenerationResult, tokenizer, **labels) -> dict:
    result.text = tokenizer.decode(result.tokens, skip_special_tokens=True) if tokenizer is not None else ""
    return {
        **labels,
        **result.to_dict(),
        "num_tokens": result.num_tokens,
        "tokens_per_second": result.tokens_per_second,
        "ms_per_token": 1000 * result.wall_time_s / max(result.num_tokens, 1),
        "tokens_per_target_forward": result.tokens_per_target_forward,
        "acceptance_rate": result.acceptance_rate,
    }


def run(
    decoders: Mapping[str, Decoder],
    prompts: Sequence[Prompt],
    tokenizer,
    out: str | Path,
    repeats: int = 3,
    warmup: int = 1,
    config: Mapping | None = None,
    chat: bool = True,
    desc: str = "benchmark",
) -> pd.DataFrame:
    """Run every decoder on every prompt `repeats` times; return the rows (this configuration's, these
    prompts and repeats), running only those the file `out` does not already hold.

    Decoders run interleaved (prompt -> repeat -> decoder) so slow drifts of the machine hit every
    method alike; `warmup` untimed runs per decoder on the first prompt come first.
    """
    if not decoders:
        raise ValueError("no decoders given: pass a dict of name -> decoder")
    if not prompts:
        raise ValueError("empty prompt set: check prompt_set and num_prompts in the parameters")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_config = {"config": dict(config or {}), "decoders": sorted(decoders), "chat": chat}
    run_id = config_hash(run_config)
    done = {(r["decoder"], r["prompt_id"], r["repeat"]) for r in read_rows(out) if r.get("run_id") == run_id}
    jobs = [(p, rep, name) for p in prompts for rep in range(repeats) for name in decoders
            if (name, p.id, rep) not in done]
    encoded = {p.id: encode(tokenizer, p, chat=chat) for p in prompts}

    if jobs and warmup:
        for name, decode in tqdm(decoders.items(), desc=f"{desc}: warm-up", leave=False):
            for _ in range(warmup):
                decode(encoded[prompts[0].id])
    env = environment()
    for prompt, repeat, name in tqdm(jobs, desc=desc, initial=len(done), total=len(done) + len(jobs)):
        result = decoders[name](encoded[prompt.id])
        _append(out, _row(result, tokenizer, run_id=run_id, decoder=name, prompt_id=prompt.id,
                          category=prompt.category, repeat=repeat, config=run_config["config"], env=env))

    # the file may hold more of this configuration (an earlier run over more prompts or repeats): not asked for now
    wanted = {(p.id, rep) for p in prompts for rep in range(repeats)}
    rows = [r for r in read_rows(out) if r.get("run_id") == run_id and (r["prompt_id"], r["repeat"]) in wanted]
    return pd.DataFrame(rows)
