"""Quantized decoding: what a quantization saves (memory), costs (speed, quality), and what it does
to speculative decoding when the draft, the target or both are quantized.

Quantization names (the notebook's vocabulary; `models.load` takes the same names, "none" = None):
- "none": the weights in `dtype` as loaded. For the offline zoo models these are 4-bit GGUF
  weights (Q4_K_M, Q4_1) dequantized to bf16/fp32: a Q4-quality model held in 16/32-bit.
- "nf4", "fp4": bitsandbytes 4-bit weights (blockwise NF4 / FP4), activations in `dtype`.
- "int8": bitsandbytes LLM.int8 (int8 weights; activation columns with outliers kept in fp16).
- "torch-int8": torch.ao dynamic quantization: int8 Linear weights, activations quantized per
  call, everything else float32 (a CPU backend).

Memory is measured three ways and kept apart: weight bytes, the peak memory while generating
(above what the process held before the model was loaded), and the KV cache after a given length.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from specdec_lab import bench, data, memory, metrics, models, quality
from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.decoders.candidates import DraftModelCandidates
from specdec_lab.decoders.common import forward, new_cache

NAMES = ("none", "nf4", "fp4", "int8", "torch-int8")
SELF = "self-"  # a draft spelled "self-<name>" is the target's own copy quantized with <name>
LABELS = {"none": None, "nf4": "nf4", "fp4": "fp4", "int8": "LLM.int8", "torch-int8": "torch-int8"}
DTYPE_LABELS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


# --- names, labels, loading ------------------------------------------------------------------------

def check_name(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"unknown quantization {name!r}: use one of {NAMES} "
                         "(int8 = bitsandbytes LLM.int8, torch-int8 = torch.ao dynamic int8, CPU only)")
    return name


def dtype_for(quantization: str, dtype: str) -> str:
    """The dtype a variant is loaded in: torch-int8's kernels take float32 activations only."""
    return "float32" if check_name(quantization) == "torch-int8" else dtype


def label(quantization: str, dtype: str) -> str:
    """Short plot label: the dtype for "none", else the quantization's name."""
    return LABELS[check_name(quantization)] or DTYPE_LABELS[models.parse_dtype(dtype)]


def describe(quantization: str, dtype: str, device: str) -> str:
    """One honest sentence on what is stored and what is computed in which precision."""
    compute = DTYPE_LABELS[models.parse_dtype(dtype_for(quantization, dtype))]
    if quantization == "none":
        return f"weights and compute in {compute}"
    if quantization in ("nf4", "fp4"):
        text = (f"4-bit {quantization} weights (blocks of 64, one absmax each), dequantized for every matmul; "
                f"compute dtype {compute}")
        if device == "cpu" and _cpu_4bit_kernel_is_bf16():
            text += (" (this CPU has AVX512-BF16: bitsandbytes' fused CPU kernel computes the 4-bit matmuls "
                     "in bf16 whatever the compute dtype)")
        return text
    if quantization == "int8":
        return (f"LLM.int8: int8 weights, activations quantized per row to int8, outlier columns (|x| > 6) "
                f"in fp16; the rest of the model (attention, norms, KV cache) in {compute}")
    return ("torch.ao dynamic int8: int8 Linear weights, activations quantized per call; embeddings, norms, "
            "attention and the KV cache in fp32")


def describe_all(names: Sequence[str], dtype: str, device: str) -> str:
    """A Markdown list: each variant's label and what it stores and computes in which precision."""
    return "\n".join(f"- **{label(name, dtype)}**: {describe(name, dtype, device)}" for name in names)


def _cpu_4bit_kernel_is_bf16() -> bool:
    try:
        from bitsandbytes.functional import has_avx512bf16
        return bool(has_avx512bf16())
    except Exception:  # no bitsandbytes or no CPU library: the generic path keeps the compute dtype
        return False


def check_quantizations(names: Sequence[str], device: str, dtype: str, double_quant: bool = False) -> None:
    """Refuse, before any model loads, a quantization that cannot run on `device`
    (see models.check_quantization)."""
    for name in names:
        models.check_quantization(None if check_name(name) == "none" else name,
                                  models.parse_dtype(dtype_for(name, dtype)), device,
                                  double_quant and name in ("nf4", "fp4"))


def load_variant(spec: str, quantization: str, dtype: str, device: str,
                 double_quant: bool = False) -> models.LoadedModel:
    """`models.load` with a quantization name; double_quant applies to the 4-bit ones only. Loads
    without transformers' per-load progress bar (a sweep loads many variants; the benchmark's own
    progress bars say where it is)."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        return models.load(spec, dtype=dtype_for(quantization, dtype), device=device,
                           quantization=None if quantization == "none" else quantization,
                           double_quant=double_quant and quantization in ("nf4", "fp4"))
    finally:
        if shown:
            transformers_logging.enable_progress_bar()


def memory_now(device: str) -> int:
    """What the process holds now: RSS on CPU, allocated bytes on CUDA (the same kinds of number
    `PeakMemory` reports, so a peak minus this is what came on top)."""
    if models._device_type(device) == "cuda":
        return int(torch.cuda.memory_allocated())
    return memory.rss_bytes()


def free_memory() -> None:
    """Return freed memory to the system, so the next variant's baseline is what is really in use:
    glibc keeps freed heap memory in the process (and in its RSS) until malloc_trim."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


@torch.inference_mode()
def first_forward(model) -> None:
    """One tiny forward pass, so one-time work is done before anything is measured: bitsandbytes'
    CPU 4-bit layers repack their weights on first use (a transient of hundreds of MB that would
    otherwise land in the first generation's peak memory)."""
    forward(model, [0], new_cache(model), logits_to_keep=1)


@torch.inference_mode()
def kv_cache_bytes_at(model, prompt_ids: Sequence[int], num_tokens: int) -> int:
    """Bytes of the KV cache once it holds `num_tokens` tokens (prompt + generated). The cache's
    size does not depend on which tokens they are, so one forward pass over the prompt, repeated to
    length, stands in for a whole generation."""
    prompt_ids = list(prompt_ids)
    if num_tokens < 1 or not prompt_ids:
        raise ValueError(f"need a non-empty prompt and num_tokens >= 1, got {len(prompt_ids)} tokens "
                         f"and num_tokens={num_tokens}")
    token_ids = (prompt_ids * math.ceil(num_tokens / len(prompt_ids)))[:num_tokens]
    cache = new_cache(model)
    forward(model, token_ids, cache, logits_to_keep=1)
    return memory.kv_cache_bytes(cache)


# --- one model, every quantization: memory, speed, quality ------------------------------------------

Variants = dict  # (model spec, quantization name) -> models.LoadedModel, shared by the sweeps


def _measure_variant(role: str, spec: str, quantization: str, prompts, *, dtype, device, double_quant,
                     max_new_tokens, repeats, warmup, out_dir: Path, config: dict,
                     footprint: dict | None) -> tuple[dict, pd.DataFrame, models.LoadedModel]:
    """Load one variant, time AR greedy decoding (bench rows, whose peak memory comes first, before
    anything else ran on this model), then measure weights, KV cache and perplexity unless
    `footprint` already holds them."""
    free_memory()
    baseline = memory_now(device)
    loaded = load_variant(spec, quantization, dtype, device, double_quant)
    first_forward(loaded.model)
    free_memory()  # what loading and repacking freed is not the model's memory
    name = f"{role} {label(quantization, dtype)}"
    rows = bench.run({name: partial(autoregressive.generate, loaded.model, max_new_tokens=max_new_tokens)},
                     prompts, loaded.tokenizer, out=out_dir / "ar.jsonl", repeats=repeats, warmup=warmup,
                     config={**config, "role": role, "quantization": quantization}, desc=f"AR {name}")
    if footprint is None:
        prompt_ids = data.encode(loaded.tokenizer, prompts[0])
        kv_tokens = len(prompt_ids) + max_new_tokens
        footprint = {
            "role": role, "model": spec, "quantization": quantization, "variant": name,
            "label": label(quantization, dtype), "dtype": dtype_for(quantization, dtype),
            "description": describe(quantization, dtype, device),
            "weight_bytes": loaded.weight_bytes, "baseline_bytes": baseline,
            "kv_cache_tokens": kv_tokens, "kv_cache_bytes": kv_cache_bytes_at(loaded.model, prompt_ids, kv_tokens),
            "perplexity": quality.text_perplexity(loaded.model, loaded.tokenizer),
            "perplexity_tokens": sum(len(ids) - 1 for ids in quality.encode_texts(loaded.tokenizer)),
        }
    return footprint, rows.assign(role=role, quantization=quantization), loaded


def footprint_sweep(models_by_role: dict[str, str], quantizations: Sequence[str], prompts, *, dtype: str,
                    device: str, double_quant: bool, max_new_tokens: int, repeats: int, warmup: int,
                    out_dir: Path, config: dict, variants: Variants | None = None,
                    keep: set = frozenset()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """For each model (role -> spec) and quantization: AR bench rows and a footprint row. Returns
    (footprints, AR rows). Each variant is loaded fresh and freed after its measurement, except the
    (spec, quantization) keys in `keep`, which are left in `variants` for a later sweep (the peak
    memory is taken above what the process held before the load, so kept variants do not count).
    A rerun resumes: rows already written for this configuration (ar.jsonl, footprints.jsonl under
    out_dir) are kept."""
    check_quantizations(quantizations, device, dtype)
    variants = {} if variants is None else variants
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    footprint_file = out_dir / "footprints.jsonl"
    run_id = bench.config_hash(config)
    done = {(r["role"], r["quantization"]): r for r in bench.read_rows(footprint_file) if r.get("run_id") == run_id}
    footprints, frames = [], []
    for role, spec in models_by_role.items():
        for quantization in quantizations:
            variants.pop((spec, quantization), None)  # a copy from an earlier run would blur the baseline
            known = done.get((role, quantization))
            row, rows, loaded = _measure_variant(
                role, spec, quantization, prompts, dtype=dtype, device=device, double_quant=double_quant,
                max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup, out_dir=out_dir, config=config,
                footprint=known)
            if (spec, quantization) in keep:
                variants[(spec, quantization)] = loaded
            del loaded
            if known is None:
                row = {"run_id": run_id, **row}
                _append(footprint_file, row)
            footprints.append(row)
            frames.append(rows)
    free_memory()
    return pd.DataFrame(footprints), pd.concat(frames, ignore_index=True)


def _append(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row, default=str) + "\n")


def footprint_table(footprints: pd.DataFrame, ar_rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (role, quantization): memory three ways, speed, perplexity, and greedy agreement
    with the same model unquantized ("none"), whose speed and weights are the 1.0 of the ratios."""
    keys = ["role", "quantization"]
    per_variant = ar_rows.groupby(keys).agg(peak_bytes=("peak_memory_bytes", "max"),
                                            ms_per_token=("ms_per_token", "median"),
                                            tokens_per_second=("tokens_per_second", "median"),
                                            wall_time_s=("wall_time_s", "median")).reset_index()
    table = footprints.merge(per_variant, on=keys).merge(agreement_with_unquantized(ar_rows), on=keys, how="left")
    table["peak_above_baseline_bytes"] = table.peak_bytes - table.baseline_bytes
    for column in ("weight_bytes", "peak_above_baseline_bytes", "kv_cache_bytes"):
        table[column.replace("_bytes", "_mb")] = table[column] / 2**20
    unquantized = table[table.quantization == "none"].set_index("role")
    table["speed_vs_unquantized"] = table.tokens_per_second / table.role.map(unquantized.tokens_per_second)
    table["weights_vs_unquantized"] = table.weight_bytes / table.role.map(unquantized.weight_bytes)
    return table


def agreement_with_unquantized(ar_rows: pd.DataFrame) -> pd.DataFrame:
    """Per (role, quantization): mean greedy agreement (matched prefix fraction) and full-match rate of
    the repeat-0 outputs against the "none" variant's output on the same prompt (NaN without one)."""
    first = ar_rows[ar_rows.repeat == 0]
    reference = {(r.role, r.prompt_id): r.tokens for r in first[first.quantization == "none"].itertuples()}
    records = []
    for (role, quantization), group in first.groupby(["role", "quantization"]):
        scores = [quality.greedy_agreement(reference[(role, p)], tokens)
                  for p, tokens in zip(group.prompt_id, group.tokens) if (role, p) in reference]
        records.append({"role": role, "quantization": quantization,
                        "agreement": sum(s.fraction for s in scores) / len(scores) if scores else float("nan"),
                        "full_match_rate": sum(s.full_match for s in scores) / len(scores) if scores else float("nan")})
    return pd.DataFrame(records, columns=["role", "quantization", "agreement", "full_match_rate"])


# --- speculative decoding with quantized targets and drafts -----------------------------------------

@dataclass(frozen=True)
class Pair:
    """A target quantization and a draft: the draft model quantized, or the target's own copy."""

    target: str
    draft: str
    self_draft: bool = False

    def draft_label(self, dtype: str) -> str:
        return ("self " if self.self_draft else "") + label(self.draft, dtype)

    def name(self, dtype: str) -> str:
        who = "self" if self.self_draft else "draft"
        return f"target {label(self.target, dtype)} · {who} {label(self.draft, dtype)}"


def parse_pair(text: str) -> Pair:
    """'none/nf4' (target unquantized, draft nf4), 'nf4/none', 'none/self-torch-int8' (the target
    drafts for itself from its own torch-int8 copy, gpt-fast style)."""
    if not isinstance(text, str) or text.count("/") != 1:
        raise ValueError(f"bad speculative pair {text!r}: write 'target_quantization/draft_quantization', e.g. "
                         f"'none/nf4' or 'none/self-torch-int8'; quantizations: {NAMES}")
    target, draft = text.split("/")
    self_draft = draft.startswith(SELF)
    draft = draft[len(SELF):] if self_draft else draft
    for part in (target, draft):
        if part not in NAMES:
            raise ValueError(f"bad speculative pair {text!r}: {part!r} is not a quantization, use one of {NAMES}")
    if self_draft and draft == target:
        raise ValueError(f"bad speculative pair {text!r}: a self-draft must be quantized differently from the "
                         "target (it would accept every token and save nothing)")
    return Pair(target, draft, self_draft)


def full_grid(quantizations: Sequence[str], self_quantizations: Sequence[str] = ()) -> list[str]:
    """Every target x draft combination, plus the unquantized target drafting from its own copies."""
    grid = [f"{t}/{d}" for t in quantizations for d in quantizations]
    return grid + [f"none/{SELF}{q}" for q in self_quantizations if q != "none"]


def check_pairs(pairs: Sequence[str], device: str, dtype: str = "bfloat16") -> list[Pair]:
    """Parse every pair and refuse, before any model loads, one that cannot load on `device`."""
    parsed = [parse_pair(p) for p in pairs]
    check_quantizations(sorted({q for pair in parsed for q in (pair.target, pair.draft)}), device, dtype)
    return parsed


def target_ar_name(target_quantization: str, dtype: str) -> str:
    return f"target {label(target_quantization, dtype)} AR"


def needed_variants(pairs: Sequence[str], target: str, draft: str) -> set[tuple[str, str]]:
    """The (spec, quantization) keys the speculative grid loads (a self-draft is a target variant)."""
    keys = set()
    for pair in map(parse_pair, pairs):
        keys |= {(target, pair.target), (target if pair.self_draft else draft, pair.draft)}
    return keys


def variants_to_keep(pairs: Sequence[str], target: str, draft: str, device: str) -> set[tuple[str, str]]:
    """On CPU the footprint sweep hands its variants on to the speculative grid: bitsandbytes
    quantizes on the CPU slowly (about a minute for a 1.5B model on 2 cores). On a GPU loading is
    quick and memory scarcer, so every variant is loaded when needed and freed after."""
    return needed_variants(pairs, target, draft) if models._device_type(device) == "cpu" else set()


def _variant(variants: Variants, spec: str, quantization: str, dtype: str, device: str,
             double_quant: bool) -> models.LoadedModel:
    if (spec, quantization) not in variants:
        variants[(spec, quantization)] = load_variant(spec, quantization, dtype, device, double_quant)
    return variants[(spec, quantization)]


def _grid_for_target(target_quantization: str, pairs: list[Pair], prompts, variants: Variants, *, target: str,
                     draft: str, dtype: str, device: str, double_quant: bool, k: int, max_new_tokens: int,
                     repeats: int, warmup: int, out: Path, config: dict) -> pd.DataFrame:
    """AR of one target variant and every speculative pair on it, side by side in one bench run."""
    target_model = _variant(variants, target, target_quantization, dtype, device, double_quant)
    line_up = {target_ar_name(target_quantization, dtype):
               partial(autoregressive.generate, target_model.model, max_new_tokens=max_new_tokens)}
    for pair in pairs:
        draft_model = _variant(variants, target if pair.self_draft else draft, pair.draft, dtype, device,
                               double_quant)
        models.check_same_tokenizer(target_model.tokenizer, draft_model.tokenizer, target, draft)
        line_up[pair.name(dtype)] = partial(speculative.generate, target_model.model,
                                            DraftModelCandidates(draft_model.model, k), max_new_tokens=max_new_tokens)
    rows = bench.run(line_up, prompts, target_model.tokenizer, out=out, repeats=repeats, warmup=warmup,
                     config={**config, "target_quantization": target_quantization},
                     desc=f"target {label(target_quantization, dtype)}")
    kinds = {pair.name(dtype): pair for pair in pairs}
    return rows.assign(
        target_quantization=target_quantization, target=label(target_quantization, dtype),
        draft_quantization=rows.decoder.map(lambda d: kinds[d].draft if d in kinds else None),
        self_draft=rows.decoder.map(lambda d: kinds[d].self_draft if d in kinds else None),
        draft=rows.decoder.map(lambda d: kinds[d].draft_label(dtype) if d in kinds else None),
        baseline=target_ar_name(target_quantization, dtype),
    )


def speculative_grid(pairs: Sequence[str], prompts, *, target: str, draft: str, dtype: str, device: str,
                     double_quant: bool, k: int, max_new_tokens: int, repeats: int, warmup: int, out: Path,
                     config: dict, variants: Variants | None = None) -> pd.DataFrame:
    """Every pair, grouped by target variant; each group is one bench run (AR + its pairs side by
    side). Variants come from `variants` or are loaded into it; a target variant is freed after its
    group unless a later pair drafts with it, so one target variant is in memory at a time and each
    draft variant is loaded once. Resumable through `out`."""
    parsed = check_pairs(pairs, device, dtype)
    variants = {} if variants is None else variants
    by_target: dict[str, list[Pair]] = {}
    for pair in parsed:
        by_target.setdefault(pair.target, []).append(pair)
    draft_keys = {(target if p.self_draft else draft, p.draft) for p in parsed}
    frames = []
    for target_quantization, group in by_target.items():
        frames.append(_grid_for_target(target_quantization, group, prompts, variants, target=target, draft=draft,
                                       dtype=dtype, device=device, double_quant=double_quant, k=k,
                                       max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup, out=Path(out),
                                       config=config))
        if (target, target_quantization) not in draft_keys:
            variants.pop((target, target_quantization), None)
            free_memory()
    return pd.concat(frames, ignore_index=True)


def speculative_table(rows: pd.DataFrame, unquantized_reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per pair: acceptance rate (accepted / proposed draft tokens, pooled), speedup over AR
    of the same target variant (geometric mean over prompts of per-prompt median side-by-side
    ratios), tokens per target forward, agreement with that target's greedy AR output, and, when
    `unquantized_reference` (AR rows of the unquantized target: decoder, prompt_id, repeat,
    tokens) is given, agreement with the unquantized target's output."""
    lines = []
    for baseline, group in rows.groupby("baseline", sort=False):
        with_agreement = metrics.add_agreement(group, reference_decoder=baseline)
        speed = metrics.speedups(group, baseline)
        for decoder, sub in with_agreement[with_agreement.decoder != baseline].groupby("decoder", sort=False):
            per_prompt = speed[speed.decoder == decoder].groupby("prompt_id").speedup.median()
            accepted = sum(sum(s) for s in sub.accepted_per_step)
            proposed = sum(sum(s) for s in sub.proposed_per_step)
            lines.append({
                "pair": decoder, "target": sub.target.iloc[0], "draft": sub.draft.iloc[0],
                "target_quantization": sub.target_quantization.iloc[0],
                "draft_quantization": sub.draft_quantization.iloc[0], "self_draft": bool(sub.self_draft.iloc[0]),
                "acceptance_rate": accepted / proposed if proposed else float("nan"),
                "speedup": metrics.geometric_mean(per_prompt),
                "speedup_min": speed[speed.decoder == decoder].speedup.min(),
                "speedup_max": speed[speed.decoder == decoder].speedup.max(),
                "tokens_per_target_forward": sub.tokens_per_target_forward.mean(),
                "ms_per_token": sub.ms_per_token.median(),
                "agreement_with_target": sub.agreement.mean(),
                "full_match_rate": sub.full_match.mean(),
                "agreement_with_unquantized": _agreement_with(sub, unquantized_reference),
            })
    return pd.DataFrame(lines)


def speculative_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Long form: one speedup per (pair, prompt, repeat) over AR of the same target variant."""
    frames = []
    for baseline, group in rows.groupby("baseline", sort=False):
        speed = metrics.speedups(group, baseline)
        frames.append(speed[speed.decoder != baseline].assign(target=group.target.iloc[0]))
    return pd.concat(frames, ignore_index=True)


def unquantized_reference(ar_rows: pd.DataFrame, role: str = "target") -> pd.DataFrame:
    """The unquantized model's AR rows from the footprint sweep (empty when it was not run)."""
    if ar_rows.empty or "quantization" not in ar_rows:
        return ar_rows
    return ar_rows[(ar_rows.role == role) & (ar_rows.quantization == "none")]


def _agreement_with(rows: pd.DataFrame, reference: pd.DataFrame | None) -> float:
    if reference is None or reference.empty:
        return float("nan")
    tokens = reference[reference.repeat == 0].set_index("prompt_id").tokens
    first = rows[(rows.repeat == 0) & rows.prompt_id.isin(tokens.index)]
    scores = [quality.greedy_agreement(tokens[p], t).fraction for p, t in zip(first.prompt_id, first.tokens)]
    return sum(scores) / len(scores) if scores else float("nan")


# --- plain-language verdicts (computed, never typed) -------------------------------------------------

def tradeoff_sentences(table: pd.DataFrame) -> list[str]:
    """For each quantized variant: how much smaller its weights are and how its speed compares with
    the unquantized model, in words, e.g. 'saves memory but costs speed'."""
    sentences = []
    for row in table[table.quantization != "none"].itertuples():
        smaller = 1 - row.weights_vs_unquantized
        faster = row.speed_vs_unquantized
        size = f"{smaller:.0%} smaller" if smaller >= 0 else f"{-smaller:.0%} larger"
        verdict = ("saves weight memory and is faster" if smaller > 0 and faster >= 1 else
                   "saves weight memory but costs speed" if smaller > 0 else
                   "saves no weight memory here" + (" but is faster" if faster >= 1 else " and is slower"))
        sentences.append(
            f"{row.role} {row.label}: weights {row.weight_mb:,.0f} MB ({size} than unquantized), "
            f"{row.tokens_per_second:.1f} tokens/s ({faster:.2f}x the unquantized speed), KV cache "
            f"{row.kv_cache_mb:,.1f} MB at {row.kv_cache_tokens} tokens, perplexity {row.perplexity:.2f}, "
            f"greedy agreement with unquantized {row.agreement:.0%}: {verdict}.")
    return sentences


def baseline_note(spec: str, dtype: str) -> str:
    """What "unquantized" means for this model (the zoo mirrors are already 4-bit GGUFs)."""
    from specdec_lab import zoo

    held = DTYPE_LABELS[models.parse_dtype(dtype)]
    if spec in zoo.ZOO:
        found = re.search(r"q\d+(_[a-z0-9]+)*", zoo.ZOO[spec].gguf_name, re.IGNORECASE)
        kind = found.group(0).upper() if found else "quantized"
        return (f"`{spec}` comes from an offline mirror of a **{kind}** GGUF file: its \"unquantized\" "
                f"baseline ({held}) holds those 4-bit weights dequantized to {held}. Quantizing it again "
                "re-rounds already-rounded weights: the memory saved is real, but quality is measured against a "
                "Q4-quality model, not against the original checkpoint.")
    return f"`{spec}`: the unquantized baseline holds the checkpoint's weights in {held}."


def speculative_sentences(table: pd.DataFrame) -> list[str]:
    """One computed line per pair, best speedup first."""
    lines = []
    for row in table.sort_values("speedup", ascending=False).itertuples():
        line = (f"{row.pair}: acceptance {row.acceptance_rate:.0%}, {row.speedup:.2f}x over AR of the {row.target} "
                f"target (samples {row.speedup_min:.2f}-{row.speedup_max:.2f}x), "
                f"{row.tokens_per_target_forward:.2f} tokens per target forward, agreement with that target's "
                f"greedy output {row.agreement_with_target:.0%}")
        if not math.isnan(row.agreement_with_unquantized):
            line += f", with the unquantized target's {row.agreement_with_unquantized:.0%}"
        lines.append(line + ".")
    return lines


def headline(table: pd.DataFrame, spec_table: pd.DataFrame) -> dict:
    """The few numbers the report index shows."""
    numbers = {}
    for row in table[(table.role == "target") & (table.quantization != "none")].itertuples():
        numbers[f"target {row.label}: weights vs unquantized"] = round(float(row.weights_vs_unquantized), 3)
        numbers[f"target {row.label}: speed vs unquantized (x)"] = round(float(row.speed_vs_unquantized), 2)
    if not spec_table.empty:
        best = spec_table.sort_values("speedup", ascending=False).iloc[0]
        numbers["fastest speculative pair"] = best.pair
        numbers["its speedup over AR of its target (x)"] = round(float(best.speedup), 2)
    return numbers


def summary_table(spec_table: pd.DataFrame) -> pd.DataFrame:
    """The speculative pairs in the summary's columns (index = method), for `summary.write`."""
    return pd.DataFrame({
        "speedup": spec_table.speedup.values,
        "tokens_per_second": 1000 / spec_table.ms_per_token.values,
        "tokens_per_target_forward": spec_table.tokens_per_target_forward.values,
        "agreement": spec_table.agreement_with_target.values,
        "full_match_rate": spec_table.full_match_rate.values,
        "acceptance_rate": spec_table.acceptance_rate.values,
    }, index=pd.Index(spec_table.pair.values, name="method"))
