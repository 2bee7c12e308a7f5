"""Notebook 03: quantized decoding. What a quantization saves (memory), costs (speed, quality), and
what it does to speculative decoding when the draft, the target or both are quantized. This module
runs the sweeps; `quantized_tables` computes the tables and `quantized_words` the sentences.

Memory is measured three ways and kept apart: weight bytes, the peak memory while generating
(above what the process held before the model was loaded), and the KV cache after a given length.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from specdec_lab import data, hardware, memory, models, quality, token_view
from specdec_lab.decoders import llama_cpp_peer
from specdec_lab.experiments import common, lineups, quantized_tables
from specdec_lab.experiments.quantized_tables import (LLAMA_CPP, Tables, best_k_table, footprint_table, label_pairs,
                                                      speculative_table, summary_lines, unquantized_reference,
                                                      versus_llama_cpp)
from specdec_lab.experiments.quantized_words import headline
from specdec_lab.method import Weights
from specdec_lab.models import llama_cpp, quantize
from specdec_lab.runs import bench, jsonl

NOTEBOOK = quantized_tables.NOTEBOOK
Variants = dict  # (model spec, quantization name) -> LoadedModel, handed from the footprint sweep to the grid


def run(params: dict) -> Tables:
    """Both sweeps; a quantization or pair that cannot run on the device fails before any model loads."""
    quantize.check_quantizations(params["quantizations"], params["device"], params["dtype"], params["double_quant"])
    quantize.check_pairs(params["spec_pairs"], params["device"], params["dtype"])
    prompts = data.load_prompts(params["prompt_set"], params["num_prompts"], seed=params["seed"])
    print(f"{len(prompts)} prompts:", ", ".join(f"{p.id} ({p.category})" for p in prompts))
    engine = llama_cpp_peer.load_for(params["target"]) if params["llama_cpp"] else None
    engine_lookup = (llama_cpp_peer.load_for(params["target"], params["prompt_lookup_k"])
                     if params["llama_cpp"] and params["prompt_lookup_k"] else None)
    out_dir = common.results_file(params, NOTEBOOK, "ar.jsonl").parent
    settings = dict(dtype=params["dtype"], device=params["device"], double_quant=params["double_quant"],
                    max_new_tokens=params["max_new_tokens"], warmup=params["warmup"], config=params)
    specs = {"target": params["target"], "draft": params["draft"]}
    variants: Variants = {}  # loaded models, handed from the footprint sweep to the speculative grid
    footprints, ar_rows = footprint_sweep(
        {role: specs[role] for role in params["footprint_models"]}, params["quantizations"], prompts,
        repeats=params["footprint_repeats"], out_dir=out_dir, variants=variants, engine=engine, **settings)
    bandwidth = hardware.memory_bandwidth()
    table = footprint_table(footprints, ar_rows, bandwidth)
    target_variant = next((v for (spec, _), v in variants.items() if spec == params["target"]), None)
    kernels = pd.DataFrame()
    if models.device_type(params["device"]) == "cpu" and target_variant is not None:
        config = target_variant.model.config
        kernels = hardware.linear_kernel_table(config.hidden_size, config.intermediate_size,
                                               dtype=models.parse_dtype(params["dtype"]), bandwidth=bandwidth)
    free_unneeded(variants, params["spec_pairs"], params["target"], params["draft"])
    curves = cost_curves({key: _variant(variants, *key, params["dtype"], params["device"], params["double_quant"])
                          for key in sorted(needed_variants(params["spec_pairs"], params["target"], params["draft"]))},
                         specs, params["dtype"], params["cost_curve_n"], params["cost_curve_repeats"])
    curves.to_csv(out_dir / "cost_curves.csv", index=False)
    tokenizer = next(iter(variants.values())).tokenizer  # every variant's (one model family), for the token views
    spec_rows = speculative_grid(params["spec_pairs"], prompts, target=params["target"], draft=params["draft"],
                                 k=params["k"], repeats=params["repeats"], out=out_dir / "speculative.jsonl",
                                 variants=variants, prompt_lookup_k=params["prompt_lookup_k"], engine=engine,
                                 engine_lookup=engine_lookup, **settings)
    reference = unquantized_reference(ar_rows, "target")
    spec_table = speculative_table(spec_rows, reference)
    tables = Tables(table, ar_rows, spec_rows, spec_table, curves, best_k_table(spec_table, spec_rows, curves),
                    versus_llama_cpp(spec_rows, reference), kernels,
                    token_view.views_of_rows(spec_rows, tokenizer))
    for name, frame in (("footprints.csv", table), ("best_k.csv", tables.best_k),
                        ("versus_llama_cpp.csv", tables.versus_llama_cpp), ("kernels.csv", kernels)):
        frame.to_csv(out_dir / name, index=False)  # what `python -m specdec_lab.experiments.quantized_tables` prints
    common.write_outputs(params, NOTEBOOK, summary_lines(spec_table), headline(tables),
                         model=params["target"], dtype=params["dtype"])
    return tables


# --- loading and measuring one variant --------------------------------------------------------------

def load_variant(spec: str, quantization: str, dtype: str, device: str,
                 double_quant: bool = False) -> models.LoadedModel:
    """`models.load` in the dtype the quantization computes in; double_quant for the 4-bit ones only."""
    return models.load(spec, dtype=quantize.dtype_for(quantization, dtype), device=device, quantization=quantization,
                       double_quant=double_quant and quantization in ("nf4", "fp4"))


def _footprint(model_role: str, spec: str, quantization: str, loaded: models.LoadedModel, prompt: data.Prompt, *,
               dtype: str, device: str, max_new_tokens: int) -> dict:
    """What a variant stores: weight bytes (quantization state included), the KV cache at the
    length of one generation, and perplexity on the fixed text set."""
    prompt_ids = data.encode(loaded.tokenizer, prompt)
    kv_tokens = len(prompt_ids) + max_new_tokens
    return {
        "model_role": model_role, "model": spec, "quantization": quantization,
        "variant": f"{model_role} {quantize.label(quantization, dtype)}",
        "label": quantize.label(quantization, dtype), "dtype": quantize.dtype_for(quantization, dtype),
        "description": quantize.describe(quantization, dtype, device), "weight_bytes": loaded.weight_bytes,
        "bytes_read_per_token": hardware.bytes_read_per_token(loaded.model),
        "kv_cache_tokens": kv_tokens, "kv_cache_bytes": hardware.kv_cache_bytes_at(loaded.model, prompt_ids, kv_tokens),
        "perplexity": quality.text_perplexity(loaded.model, loaded.tokenizer),
        "perplexity_tokens": sum(len(ids) - 1 for ids in quality.encode_texts(loaded.tokenizer)),
    }


def footprint_sweep(models_by_role: dict[str, str], quantizations: Sequence[str], prompts, *, dtype: str,
                    device: str, double_quant: bool, max_new_tokens: int, repeats: int, warmup: int,
                    out_dir: Path, config: dict, variants: Variants | None = None,
                    engine: llama_cpp_peer.LlamaCppPeer | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """For each model (role -> spec): load every quantization (into `variants`, where the
    speculative grid finds them), measure what each stores (footprints.jsonl), then time greedy AR of
    all of them side by side in one benchmark run, interleaved like every other ratio; with `engine`,
    llama.cpp's AR on the target's GGUF file runs in the target's run too. Returns (footprints, AR
    rows). A rerun resumes from footprints.jsonl and ar.jsonl."""
    quantize.check_quantizations(quantizations, device, dtype)
    variants = {} if variants is None else variants
    footprint_file = Path(out_dir) / "footprints.jsonl"
    run_id = jsonl.config_hash(config)
    done = jsonl.done(footprint_file, run_id, key=lambda row: (row["model_role"], row["quantization"]))
    footprints, frames = [], []
    for model_role, spec in models_by_role.items():
        methods = []
        for quantization in quantizations:
            loaded = _variant(variants, spec, quantization, dtype, device, double_quant)
            quantize.warm_up(loaded.model)  # one-time repacking is not part of any measurement
            row = done.get((model_role, quantization))
            if row is None:
                row = {"run_id": run_id, **_footprint(model_role, spec, quantization, loaded, prompts[0], dtype=dtype,
                                                      device=device, max_new_tokens=max_new_tokens)}
                jsonl.append(footprint_file, row)
            footprints.append(row)
            methods.append(lineups.ar(loaded, max_new_tokens, name=row["variant"],
                                      role="target AR" if model_role == "target" else "draft AR",
                                      lossless=model_role == "target" and quantization == "none",
                                      weights=Weights(model_role, quantization)))
        if engine is not None and model_role == "target":
            footprints.append(_llama_cpp_footprint(engine, dtype))
            methods.append(lineups.llama_cpp_ar(engine, variants[(spec, quantizations[0])], max_new_tokens,
                                                name=footprints[-1]["variant"], weights=Weights(model_role, LLAMA_CPP)))
        memory.free_memory()
        rows = bench.run(methods, prompts, variants[(spec, quantizations[0])].tokenizer, out=Path(out_dir) / "ar.jsonl",
                         repeats=repeats, warmup=warmup, config={**config, "role": model_role},
                         desc=f"AR {model_role}, every quantization side by side")
        frames.append(rows)  # each row's model_role and quantization come from its method's Weights
    return pd.DataFrame(footprints), pd.concat(frames, ignore_index=True)


def _llama_cpp_footprint(engine: llama_cpp_peer.LlamaCppPeer, dtype: str) -> dict:
    """The llama.cpp row of the footprint table: the GGUF file's bytes (it is memory-mapped and used
    as it is); the KV cache and perplexity are not measured through the binding."""
    kind = llama_cpp_peer.gguf_kind(engine.path.name)
    return {"model_role": "target", "model": engine.path.name, "quantization": LLAMA_CPP,
            "variant": f"target llama.cpp ({kind})", "label": f"llama.cpp {kind}", "dtype": "gguf",
            "description": (f"llama.cpp {llama_cpp_peer.PACKAGE.split('==')[1]} running the GGUF file as it is "
                            f"(its own 4/6-bit block formats and kernels), {engine.threads} threads"),
            "weight_bytes": engine.weight_bytes, "bytes_read_per_token": llama_cpp.gguf_bytes_read_per_token(engine.path),
            "kv_cache_tokens": float("nan"), "kv_cache_bytes": float("nan"),
            "perplexity": float("nan"), "perplexity_tokens": float("nan")}


# --- speculative decoding with quantized targets and drafts -----------------------------------------

def needed_variants(pairs: Sequence[str], target: str, draft: str) -> set[tuple[str, str]]:
    """The (spec, quantization) keys the speculative grid loads (a self-draft is a target variant)."""
    keys = set()
    for pair in map(quantize.parse_pair, pairs):
        keys |= {(target, pair.target), (target if pair.self_draft else draft, pair.draft)}
    return keys


def free_unneeded(variants: Variants, pairs: Sequence[str], target: str, draft: str) -> None:
    """Drop the variants the speculative grid will not use (the footprint sweep loaded them all)."""
    needed = needed_variants(pairs, target, draft)
    for key in [key for key in variants if key not in needed]:
        del variants[key]
    memory.free_memory()


def _variant(variants: Variants, spec: str, quantization: str, dtype: str, device: str,
             double_quant: bool) -> models.LoadedModel:
    if (spec, quantization) not in variants:
        variants[(spec, quantization)] = load_variant(spec, quantization, dtype, device, double_quant)
    return variants[(spec, quantization)]


def speculative_grid(pairs: Sequence[str], prompts, *, target: str, draft: str, dtype: str, device: str,
                     double_quant: bool, k: int, max_new_tokens: int, repeats: int, warmup: int, out: Path,
                     config: dict, variants: Variants | None = None, prompt_lookup_k: int = 0,
                     engine: llama_cpp_peer.LlamaCppPeer | None = None,
                     engine_lookup: llama_cpp_peer.LlamaCppPeer | None = None) -> pd.DataFrame:
    """Every pair, grouped by target variant; each group is one bench run (AR + its pairs side by
    side, + prompt lookup on that target when `prompt_lookup_k` > 0, + llama.cpp's AR when `engine`
    is given, so every configuration is timed against llama.cpp in the same run, + llama.cpp's
    prompt lookup when `engine_lookup` is given). Variants come from
    `variants` or are loaded into it; a target variant is freed after its group unless a later pair
    drafts with it, so one target variant is in memory at a time and each draft variant is loaded
    once. Resumable through `out`."""
    parsed = quantize.check_pairs(pairs, device, dtype)
    variants = {} if variants is None else variants
    by_target: dict[str, list[quantize.Pair]] = {}
    for pair in parsed:
        by_target.setdefault(pair.target, []).append(pair)
    draft_keys = {(target if p.self_draft else draft, p.draft) for p in parsed}
    frames = []
    for target_quantization, group in by_target.items():
        variant = lambda spec, q: _variant(variants, spec, q, dtype, device, double_quant)  # noqa: E731
        target_model = variant(target, target_quantization)
        drafts = [(pair, variant(target if pair.self_draft else draft, pair.draft)) for pair in group]
        methods = lineups.quantized_pairs(target_model, drafts, k, max_new_tokens, dtype)
        if prompt_lookup_k:
            methods.append(lineups.prompt_lookup(
                target_model, prompt_lookup_k, max_new_tokens, lossless=target_quantization == "none",
                name=(f"target {quantize.label(target_quantization, dtype)} · prompt lookup k={prompt_lookup_k} adaptive, "
                      "longest match"),
                weights=Weights(quantization=target_quantization)))
        if engine is not None:
            methods.append(lineups.llama_cpp_ar(engine, target_model, max_new_tokens))
        if engine_lookup is not None:
            methods.append(lineups.llama_cpp_prompt_lookup(engine_lookup, target_model, max_new_tokens))
        rows = bench.run(methods, prompts, target_model.tokenizer, out=out, repeats=repeats, warmup=warmup,
                         config={**config, "target_quantization": target_quantization},
                         desc=f"target {quantize.label(target_quantization, dtype)}")
        frames.append(label_pairs(rows, target_quantization, dtype, baseline=methods[0].name))
        del target_model, drafts, methods
        if (target, target_quantization) not in draft_keys:
            variants.pop((target, target_quantization), None)
            memory.free_memory()
    return pd.concat(frames, ignore_index=True)


# --- the cost of verifying n tokens, per backend --------------------------------------------------------

def variant_name(spec: str, quantization: str, specs: dict, dtype: str) -> str:
    """'target int4 weight-only', 'draft bf16': how curves and pairs name a loaded variant."""
    role = next((role for role, name in specs.items() if name == spec), spec)
    return f"{role} {quantize.label(quantization, dtype)}"


def cost_curves(loaded: dict, specs: dict, dtype: str, n_values: Sequence[int], repeats: int) -> pd.DataFrame:
    """T(n) of every loaded (spec, quantization) variant: one forward over n tokens after a
    200-token cache (`hardware.forward_cost_curve`, the curve notebooks 01 and 04 use)."""
    frames = []
    for (spec, quantization), variant in loaded.items():
        curve = hardware.forward_cost_curve(variant.model, n_values, repeats=repeats)
        frames.append(curve.assign(variant=variant_name(spec, quantization, specs, dtype), quantization=quantization,
                                   model=spec))
    return pd.concat(frames, ignore_index=True)
