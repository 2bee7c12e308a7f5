"""A decode step's cost beyond reading the weights: the KV cache's kind and torch.compile.

The kit's decoders run on transformers' DynamicCache, which grows by concatenation every step and
rolls back with `crop`. A StaticCache is allocated once at its full length and written in place; torch.compile
can then trace a step of fixed shapes. This module times both on the kit's greedy AR loop, side by side
in one process (the variants' runs interleaved, after a warm-up round), and checks that every variant
produces the same tokens. A change is worth adopting only where it pays here, compile time included.

    python -m specdec_lab.experiments.overhead [model] [--default-linear]

prints the table (Qwen2.5-Coder-1.5B in bf16 by default, the kit's W @ x^T Linear layers unless
--default-linear asks for torch's x @ W^T).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import pandas as pd
import torch
from transformers import StaticCache

from specdec_lab import data, models
from specdec_lab.decoders import autoregressive
from specdec_lab.decoders.backend import open_sequence


@torch.inference_mode()
def timed_greedy(prefill: Callable[[], torch.Tensor], step: Callable[[int], torch.Tensor],
                 steps: int) -> tuple[list[int], list[float]]:
    """Greedy AR from `prefill()`'s logits, one `step(token)` per new token: the tokens and each
    step's seconds (the prefill is not timed)."""
    token = int(prefill().argmax())
    tokens, seconds = [token], []
    for _ in range(steps):
        start = time.perf_counter()
        token = int(step(token).argmax())
        seconds.append(time.perf_counter() - start)
        tokens.append(token)
    return tokens, seconds


def dynamic_cache_run(model, prompt_ids: Sequence[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy AR on a DynamicCache, through the AR decoder's own prefill and decode step."""
    sequence = open_sequence(model)
    return timed_greedy(lambda: autoregressive.prefill(sequence, list(prompt_ids)),
                        lambda token: autoregressive.decode_one_token(sequence, token), steps)


def static_step(model) -> Callable:
    """One decode step on a StaticCache: logits of the last position (a function torch.compile can
    trace). The cache keeps its own length: transformers 5 takes no cache_position."""
    def step(input_ids: torch.Tensor, cache: StaticCache) -> torch.Tensor:
        return model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    return step


def static_cache_run(model, prompt_ids: Sequence[int], steps: int, step: Callable) -> tuple[list[int], list[float]]:
    """Greedy AR on a StaticCache of the generation's full length, each step through `step`."""
    prompt_ids = list(prompt_ids)
    cache = StaticCache(config=model.config, max_cache_len=len(prompt_ids) + steps + 1)
    return timed_greedy(lambda: model(input_ids=torch.tensor([prompt_ids]), cache=cache, use_cache=True,
                                      logits_to_keep=1).logits[0, -1],
                        lambda token: step(torch.tensor([[token]]), cache), steps)


def median_ms(seconds: Sequence[float]) -> float:
    return 1000 * float(pd.Series(seconds).median())


def overhead_table(model, prompt_ids: Sequence[int], steps: int = 24, compile_step: bool = True,
                   rounds: int = 3) -> pd.DataFrame:
    """One row per variant: median ms per decode step over `rounds` interleaved runs of each
    variant (after one warm-up round, so a drift of the machine hits them alike), the seconds spent
    compiling (compile plus its first run), and whether every run's tokens equal the DynamicCache
    loop's."""
    runs = {"dynamic cache, eager (the kit's decoders)": lambda: dynamic_cache_run(model, prompt_ids, steps),
            "static cache, eager": lambda: static_cache_run(model, prompt_ids, steps, static_step(model))}
    compile_s = {name: 0.0 for name in runs}
    if compile_step:
        compiled = torch.compile(static_step(model), dynamic=False)
        start = time.perf_counter()
        static_cache_run(model, prompt_ids, steps, compiled)  # compiles on its first step
        compile_s["static cache, torch.compile"] = time.perf_counter() - start
        runs["static cache, torch.compile"] = lambda: static_cache_run(model, prompt_ids, steps, compiled)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    same = {name: True for name in runs}
    reference = None
    for round_ in range(rounds + 1):
        for name, run in runs.items():
            tokens, step_seconds = run()
            reference = reference or tokens
            same[name] &= tokens == reference
            if round_:  # the first round warms up
                seconds[name] += step_seconds
    table = pd.DataFrame([{"variant": name, "ms_per_step": median_ms(seconds[name]), "compile_s": compile_s[name],
                           "same_tokens": same[name]} for name in runs])
    table["vs_dynamic"] = table.ms_per_step / table.ms_per_step.iloc[0]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--default-linear", action="store_true", help="torch's x @ W^T instead of the kit's W @ x^T")
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    loaded = models.load(args.model, args.dtype, "cpu", fast_cpu_linear=not args.default_linear)
    prompt_ids = data.encode(loaded.tokenizer, data.load_prompts("humaneval", 1)[0])
    print(overhead_table(loaded.model, prompt_ids, args.steps).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
