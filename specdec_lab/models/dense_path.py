"""The fastest torch path for a model on this CPU, measured: `dtype: auto` in the parameters.

The same bf16 code runs at about 90% of its bandwidth bound on an Intel Xeon with AMX and at a
third of it on an AMD EPYC without: which of bf16, fp32, int8 or int4 weight-only is fastest depends
on the CPU's kernels, not on the model. So each path is loaded and timed on a generation of the
kind the kit runs (a prefill of `prompt_tokens`, then `new_tokens` forwards), and the one with the
least time wins. The choice is kept per CPU model, kernel flags, torch version, threads and model in
the kit's cache, so each machine measures it once.

Which forwards count depends on the work. AR decoding (and a draft model's drafting) runs one-token
forwards; a target that verifies proposals, lookahead decoding and a batch run forwards over many
tokens. The two regimes can pick different paths: on an Intel Xeon with AMX a bf16 forward over 8
tokens costs about what one token costs, while int4 weight-only, the fastest one-token path there,
pays about twice as much for 8 tokens. So each path's forward over `MULTI_TOKEN_WIDTH` tokens is
timed too, and a model that verifies takes the path fastest at that width (`multi_token=True`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace

import torch

from specdec_lab.machine import cpu_model
from specdec_lab.models import zoo
from specdec_lab.models.dtypes import parse_dtype, path_label

AUTO = "auto"
# (dtype, quantization): the dense paths torch has on a CPU. int4 weight-only is re-quantized from
# the bf16 weights (int4-wo), so it exists for any model, not only for those with a GGUF file.
PATHS = (("bfloat16", "none"), ("float32", "none"), ("bfloat16", "int8-wo"), ("bfloat16", "int4-wo"))
# Part of the cache key: raise it when the kit's CPU kernels or what is timed change, so every machine
# measures again (2: bf16 products over many rows in fp32 on CPUs without bf16 dot products,
# `cpu_kernels`; 3: the multi-token forward; 4: weight-only paths with their wide copy for long forwards).
KERNELS_VERSION = 4
# The width of the multi-token forward timed per path: a verify pass of the kit's usual proposals
# (k = 4-7 plus the bonus token), a lookahead step's n-gram rows, a small batch's step.
MULTI_TOKEN_WIDTH = 8


@dataclass(frozen=True)
class PathTiming:
    dtype: str
    quantization: str
    prefill_s: float  # one prefill of prompt_tokens
    step_s: float  # median one-token decode step
    multi_token_s: float  # median forward over MULTI_TOKEN_WIDTH tokens after the prompt
    prompt_tokens: int
    new_tokens: int

    def generation_s(self, multi_token: bool = False) -> float:
        """A prefill and `new_tokens` forwards: one-token steps, or (multi_token) forwards over
        MULTI_TOKEN_WIDTH tokens, as many as tokens for want of the acceptance (a verifying target
        makes fewer: the count weighs the prefill less, and the paths rank the same unless their
        prefills differ a lot)."""
        return self.prefill_s + self.new_tokens * (self.multi_token_s if multi_token else self.step_s)

    @property
    def label(self) -> str:
        return path_label(self.dtype, self.quantization)


@torch.inference_mode()
def time_path(spec: str, dtype: str, quantization: str, prompt_tokens: int = 64, new_tokens: int = 32,
              steps: int = 6) -> PathTiming:
    """Load `spec` on this path and time one prefill of `prompt_tokens`, `steps` decode steps and
    `steps` forwards over MULTI_TOKEN_WIDTH tokens (each cropped from the cache again), after a
    short untimed forward (kernels that repack weights on first use do it there)."""
    from transformers import DynamicCache

    from specdec_lab.models.load import load

    # weight-only paths as `dtype: auto` loads them, with their wide copy (`cpu_kernels`), which a long forward (the prefill) takes
    model = load(spec, dtype=dtype, quantization=quantization, wide_copy=True).model
    token = min(100, model.config.vocab_size - 1)  # any token costs the same; a tiny vocabulary has few

    def forward(n: int, cache: DynamicCache) -> float:
        start = time.perf_counter()
        model(input_ids=torch.full((1, n), token, dtype=torch.long), cache=cache, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start

    forward(4, DynamicCache(config=model.config))
    cache = DynamicCache(config=model.config)
    prefill_s = forward(prompt_tokens, cache)
    times = [forward(1, cache) for _ in range(steps + 1)][1:]  # the first step warms the one-row kernels
    multi_times = []
    for _ in range(steps + 1):
        multi_times.append(forward(MULTI_TOKEN_WIDTH, cache))
        cache.crop(-MULTI_TOKEN_WIDTH)  # back to the prompt and the steps: each forward sees the same cache
    return PathTiming(dtype, quantization, prefill_s, median(times), median(multi_times[1:]), prompt_tokens, new_tokens)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _choice_file():
    return zoo.cache_dir() / "dense-paths.json"


def _key(spec: str, prompt_tokens: int) -> str:
    machine = cpu_model()
    return json.dumps([machine["cpu_model"], machine["cpu_flags"], torch.__version__, torch.get_num_threads(),
                       spec, prompt_tokens, KERNELS_VERSION])


def measured_paths(spec: str, prompt_tokens: int = 64, new_tokens: int = 32, paths=PATHS,
                   remeasure: bool = False) -> list[PathTiming]:
    """Every path's timing for `spec` on this machine, from the cache or measured now (a minute or
    two per model: each path is loaded once)."""
    store = _choice_file()
    known = json.loads(store.read_text()) if store.is_file() else {}
    key = _key(spec, prompt_tokens)
    wanted = [list(path) for path in paths]
    if not remeasure and key in known and [[t["dtype"], t["quantization"]] for t in known[key]] == wanted:
        # a step costs the same however many follow: the stored timings serve any generation length
        return [replace(PathTiming(**timing), new_tokens=new_tokens) for timing in known[key]]
    from tqdm.auto import tqdm

    timings = [time_path(spec, dtype, quantization, prompt_tokens, new_tokens)
               for dtype, quantization in tqdm(paths, desc=f"dense paths of {spec}")]
    known[key] = [asdict(timing) for timing in timings]
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(known, indent=1))
    return timings


def fastest(spec: str, prompt_tokens: int = 64, new_tokens: int = 32, multi_token: bool = False) -> PathTiming:
    """The path with the least time for a prefill of `prompt_tokens` plus `new_tokens` forwards, of
    one token or (multi_token) of MULTI_TOKEN_WIDTH tokens."""
    return min(measured_paths(spec, prompt_tokens, new_tokens), key=lambda timing: timing.generation_s(multi_token))


def resolve(spec: str, dtype: str, quantization: str = "none", prompt_tokens: int = 64,
            new_tokens: int = 32, multi_token: bool = False) -> tuple[str, str]:
    """(dtype, quantization) to load: as given, or, when dtype is 'auto', the path measured fastest
    for the model's forwards: one-token ones (AR, drafting) or multi-token ones (verifying)."""
    if dtype != AUTO:
        return dtype, quantization
    if quantization != "none":
        raise ValueError(f"dtype 'auto' chooses the quantization too, but quantization {quantization!r} was given: "
                         "give one of them")
    chosen = fastest(spec, prompt_tokens, new_tokens, multi_token)
    parse_dtype(chosen.dtype)
    return chosen.dtype, chosen.quantization
