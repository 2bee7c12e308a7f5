"""What this machine allows: its memory bandwidth, the bound it sets on decoding speed, and the
cost of one forward pass over n tokens, T(n).

Decoding one token reads every weight once, so tokens/s can never exceed
bandwidth / bytes read per token: the roofline each measured speed is compared with. T(n) says
what verifying n tokens at once costs against decoding one (T(n)/T(1)), the number speculative and
Jacobi decoding live on; the speculative speedup model and the parallel-decoding break-even read it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

import pandas as pd
import torch

from specdec_lab.decoders.backend import open_sequence, vocab_size
from specdec_lab.decoders.batched import RaggedCache
from specdec_lab.decoders.common import clock
from specdec_lab.memory import kv_cache_bytes
from specdec_lab.models.llama_cpp import LlamaCppModel, gguf_bytes_read_per_token


def memory_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (read + write counted), best of `repeats`: what the
    memory system delivers to torch on this machine with its current thread count."""
    source = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best


def bytes_read_per_token(model) -> int:
    """Weight bytes one decode step reads: every weight once, except the input embedding table
    (one row is looked up) unless it is tied to the output head (then the head reads it all), and
    the wide copies of weight-only layers, which only forwards over many rows read (`cpu_kernels`)."""
    from specdec_lab.models import weight_bytes
    from specdec_lab.models.cpu_kernels import wide_copy_bytes

    if isinstance(model, LlamaCppModel):
        return gguf_bytes_read_per_token(model.path)
    total = weight_bytes(model) - wide_copy_bytes(model)
    embedding = model.get_input_embeddings().weight
    tied = embedding is getattr(model.get_output_embeddings(), "weight", None)
    return total if tied else total - embedding.numel() * embedding.element_size()


def roofline_tokens_per_second(model, bandwidth: float) -> float:
    """The memory-bandwidth bound on AR decoding: bandwidth / bytes read per token."""
    return bandwidth / bytes_read_per_token(model)


@torch.inference_mode()
def forward_cost_curve(model, n_values=range(1, 33), prefix_tokens: int = 200, repeats: int = 5,
                       token_id: int = 100) -> pd.DataFrame:
    """T(n): median wall time (ms) of one forward over n new tokens after a `prefix_tokens` cache,
    for each n, the cache rolled back after each pass. n values are interleaved over repeats so a
    drift of the machine hits them alike; one untimed pass per n warms up first. `ms_fit` is the
    nondecreasing fit of the medians and `relative_to_one` = ms_fit / ms_fit at n = 1: every ratio
    divides by T(1), so a T(1) above its neighbours is pooled with them rather than divided by (the
    fit also lifts a real dip, e.g. a kernel that is faster at n = 8 than at n = 5-7)."""
    device = model.device
    token_id = min(token_id, vocab_size(model) - 1)  # any token costs the same; a tiny vocabulary has few
    sequence = open_sequence(model)
    sequence.forward([token_id] * prefix_tokens, keep=1)
    n_values = list(n_values)
    times: dict[int, list[float]] = {n: [] for n in n_values}
    for repeat in range(repeats + 1):
        for n in n_values:
            start = clock(device)
            sequence.forward([token_id] * n, keep=n)  # verification needs every row's logits
            elapsed = clock(device) - start
            sequence.crop(prefix_tokens)
            if repeat:  # the first round is the warm-up
                times[n].append(1000 * elapsed)
    curve = pd.DataFrame({"n": n_values, "ms": [float(pd.Series(times[n]).median()) for n in n_values]})
    curve = curve.sort_values("n", ignore_index=True)
    curve["ms_fit"] = nondecreasing(curve.ms.tolist())
    curve["relative_to_one"] = curve.ms_fit / curve.ms_fit[curve.n == 1].iloc[0] if 1 in n_values else float("nan")
    return curve


@torch.inference_mode()
def interleaved_forward_costs(forwards: Sequence[tuple[object, int]], prefix_tokens: int = 100, repeats: int = 15,
                              token_id: int = 100) -> list[float]:
    """Median wall time (ms) of each (model, n) forward over n new tokens after a `prefix_tokens` cache, the cache
    rolled back after each pass. The forwards take turns, one of each per round, so a drift of the machine hits them
    alike and their ratio holds: on the AVX-512 BF16 EPYC (2 vCPUs) the draft's T(1) over the target's, each median of
    5 and measured one after the other, came out 0.41, 0.54, 0.63 and 0.44 in four tries a minute apart; taking turns,
    0.49-0.52. One untimed round warms up first."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1 (timed rounds), got {repeats!r}")
    # any token costs the same; a tiny vocabulary has few
    tokens = [min(token_id, vocab_size(model) - 1) for model, _ in forwards]
    sequences = [open_sequence(model) for model, _ in forwards]
    for sequence, token in zip(sequences, tokens):
        sequence.forward([token] * prefix_tokens, keep=1)
    times: list[list[float]] = [[] for _ in forwards]
    for repeat in range(repeats + 1):
        for (model, n), sequence, token, spent in zip(forwards, sequences, tokens, times):
            start = clock(model.device)
            sequence.forward([token] * n, keep=n)
            elapsed = clock(model.device) - start
            sequence.crop(prefix_tokens)
            if repeat:  # the first round is the warm-up
                spent.append(1000 * elapsed)
    return [float(statistics.median(spent)) for spent in times]


def nondecreasing(values: list[float]) -> list[float]:
    """The least-squares nondecreasing fit of `values` (pool adjacent violators). A forward over
    more tokens never costs less than one over fewer, so a dip between neighbours is timing noise:
    the pair (or run) that breaks the order is replaced by its mean."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run, in order
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def linear_kernel_table(in_features: int, out_features: int, rows=(1, 8), dtype=torch.bfloat16,
                        repeats: int = 20, bandwidth: float | None = None) -> pd.DataFrame:
    """One Linear layer's matmul on each CPU backend, alone: median ms for `rows` input rows and the
    weight bytes streamed per second at that speed (against `bandwidth` when given). It separates
    what a kernel can do from what a whole decode step adds around it."""
    from specdec_lab.models.cpu_kernels import Int4WeightOnlyLinear, Int8WeightOnlyLinear, WeightLeftLinear

    torch.manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features, bias=False).to(dtype)
    weight_left = WeightLeftLinear(in_features, out_features, bias=False, dtype=dtype)
    weight_left.weight.data = linear.weight.data
    from specdec_lab.models.dtypes import DTYPE_LABELS

    held = DTYPE_LABELS[dtype]
    layers = {f"{held} x @ W^T (torch default)": linear, f"{held} W @ x^T (kit)": weight_left,
              "int8 weight-only": Int8WeightOnlyLinear(linear, dtype),
              "int4 weight-only (groups of 32)": Int4WeightOnlyLinear(linear, dtype, 32)}
    records = []
    with torch.inference_mode():
        for name, layer in layers.items():
            stored = sum(t.numel() * t.element_size() for t in [*layer.parameters(), *layer.buffers()])
            for n in rows:
                x = torch.randn(n, in_features, dtype=dtype)
                for _ in range(3):
                    layer(x)
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    layer(x)
                    times.append(time.perf_counter() - start)
                ms = 1000 * float(pd.Series(times).median())
                records.append({"kernel": name, "rows": n, "ms": ms, "weight_mb": stored / 2**20,
                                "gb_per_s": stored / (ms / 1000) / 1e9})
    table = pd.DataFrame(records)
    if bandwidth:
        table["fraction_of_bandwidth"] = table.gb_per_s * 1e9 / bandwidth
    return table


@torch.inference_mode()
def kv_cache_bytes_at(model, prompt_ids: Sequence[int], num_tokens: int) -> int:
    """Bytes of the KV cache once it holds `num_tokens` tokens (prompt + generated). The cache's
    size does not depend on which tokens they are, so one forward pass over the prompt, repeated to
    length, stands in for a whole generation."""
    prompt_ids = list(prompt_ids)
    if num_tokens < 1 or not prompt_ids:
        raise ValueError(f"need a non-empty prompt and num_tokens >= 1, got {len(prompt_ids)} tokens "
                         f"and num_tokens={num_tokens}")
    if isinstance(model, LlamaCppModel):
        raise ValueError("KV cache bytes are read off transformers' cache; llama.cpp allocates its cache for the whole "
                         "context up front: measure this on the transformers model (models.load)")
    token_ids = (prompt_ids * math.ceil(num_tokens / len(prompt_ids)))[:num_tokens]
    sequence = open_sequence(model)
    sequence.forward(token_ids, keep=1)
    return kv_cache_bytes(sequence.cache)


@torch.inference_mode()
def batch_cost_grid(model, batch_sizes: Sequence[int], n_values: Sequence[int], prefix_tokens: int = 64,
                    repeats: int = 3, token_id: int = 100) -> pd.DataFrame:
    """T_b(n): median wall time (ms) of one forward over b rows of n new tokens each, after a
    `prefix_tokens` cache in every row, through the batched decoders' own cache (`batched.RaggedCache`),
    rolled back after each pass. Batch sizes and n are interleaved over repeats; the first round is a
    warm-up. Columns: batch, n, ms, ms_fit (per batch size, the nondecreasing fit over n, as
    `forward_cost_curve`'s) and relative_to_one (ms_fit / T_1(1), a single row's one-token step)."""
    device = model.device
    token_id = min(token_id, vocab_size(model) - 1)
    caches = {}
    for batch in batch_sizes:
        caches[batch] = RaggedCache(model, batch)
        caches[batch].forward([[token_id] * prefix_tokens] * batch, keep=1)
    times: dict[tuple[int, int], list[float]] = {(b, n): [] for b in batch_sizes for n in n_values}
    for repeat in range(repeats + 1):
        for batch in batch_sizes:
            for n in n_values:
                cache = caches[batch]
                start = clock(device)
                cache.forward([[token_id] * n] * batch, keep=n)
                elapsed = clock(device) - start
                for row in range(batch):
                    cache.truncate(row, prefix_tokens)
                cache.compact()
                if repeat:
                    times[(batch, n)].append(1000 * elapsed)
    grid = pd.DataFrame([{"batch": b, "n": n, "ms": float(pd.Series(times[(b, n)]).median())} for b, n in times])
    grid = grid.sort_values(["batch", "n"], ignore_index=True)
    grid["ms_fit"] = [fit for _, group in grid.groupby("batch", sort=True) for fit in nondecreasing(group.ms.tolist())]
    single = grid[(grid.batch == 1) & (grid.n == 1)].ms_fit
    grid["relative_to_one"] = grid.ms_fit / single.iloc[0] if len(single) else float("nan")
    return grid
