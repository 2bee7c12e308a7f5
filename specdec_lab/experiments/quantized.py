"""Notebook 03: quantized decoding. What a quantization saves (memory), costs (speed, quality), and
what it does to speculative decoding when the draft, the target or both are quantized.

Memory is measured three ways and kept apart: weight bytes, the peak memory while generating
(above what the process held before the model was loaded), and the KV cache after a given length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from specdec_lab import data, hardware, memory, metrics, models, quality
from specdec_lab.decoders import llama_cpp_peer
from specdec_lab.decoders.common import forward, new_cache
from specdec_lab.experiments import common, lineups
from specdec_lab.models import quantize
from specdec_lab.runs import bench, jsonl

NOTEBOOK = "03_quantized"
LLAMA_CPP = "llama.cpp"  # the footprint sweep's "quantization" of the llama.cpp row: the GGUF file as it is
Variants = dict  # (model spec, quantization name) -> LoadedModel, handed from the footprint sweep to the grid


@dataclass
class Tables:
    footprints: pd.DataFrame  # one line per (model role, quantization): memory, speed, perplexity, agreement
    ar_rows: pd.DataFrame  # AR rows of every variant
    spec_rows: pd.DataFrame  # speculative grid rows, each with its target variant's AR baseline
    spec_table: pd.DataFrame  # one line per pair (or prompt lookup) on a target variant
    cost_curves: pd.DataFrame  # T(n) per loaded variant: variant, n, ms, relative_to_one
    best_k: pd.DataFrame  # per draft-model pair: the k that maximizes Leviathan's speedup given T(n)
    versus_llama_cpp: pd.DataFrame  # every configuration against llama.cpp AR of the same run
    kernels: pd.DataFrame  # one MLP-sized Linear on each CPU backend alone: ms and GB/s (CPU only)


def run(params: dict) -> Tables:
    """Both sweeps; a quantization or pair that cannot run on the device fails before any model loads."""
    quantize.check_quantizations(params["quantizations"], params["device"], params["dtype"], params["double_quant"])
    quantize.check_pairs(params["spec_pairs"], params["device"], params["dtype"])
    prompts = data.load_prompts(params["prompt_set"], params["num_prompts"], seed=params["seed"])
    print(f"{len(prompts)} prompts:", ", ".join(f"{p.id} ({p.category})" for p in prompts))
    engine = load_llama_cpp(params["target"]) if params["llama_cpp"] else None
    engine_lookup = (load_llama_cpp(params["target"], params["prompt_lookup_k"])
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
    spec_rows = speculative_grid(params["spec_pairs"], prompts, target=params["target"], draft=params["draft"],
                                 k=params["k"], repeats=params["repeats"], out=out_dir / "speculative.jsonl",
                                 variants=variants, prompt_lookup_k=params["prompt_lookup_k"], engine=engine,
                                 engine_lookup=engine_lookup, **settings)
    reference = unquantized_reference(ar_rows, "target")
    spec_table = speculative_table(spec_rows, reference)
    tables = Tables(table, ar_rows, spec_rows, spec_table, curves, best_k_table(spec_table, spec_rows, curves),
                    versus_llama_cpp(spec_rows, reference), kernels)
    for name, frame in (("footprints.csv", table), ("best_k.csv", tables.best_k),
                        ("versus_llama_cpp.csv", tables.versus_llama_cpp), ("kernels.csv", kernels)):
        frame.to_csv(out_dir / name, index=False)  # what `python -m specdec_lab.experiments.quantized` prints
    common.write_outputs(params, NOTEBOOK, summary_lines(spec_table), headline(tables),
                         model=params["target"], dtype=params["dtype"])
    return tables


# --- loading and measuring one variant --------------------------------------------------------------

def load_variant(spec: str, quantization: str, dtype: str, device: str,
                 double_quant: bool = False) -> models.LoadedModel:
    """`models.load` in the dtype the quantization computes in; double_quant for the 4-bit ones only."""
    return models.load(spec, dtype=quantize.dtype_for(quantization, dtype), device=device, quantization=quantization,
                       double_quant=double_quant and quantization in ("nf4", "fp4"))


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
        "kv_cache_tokens": kv_tokens, "kv_cache_bytes": kv_cache_bytes_at(loaded.model, prompt_ids, kv_tokens),
        "perplexity": quality.text_perplexity(loaded.model, loaded.tokenizer),
        "perplexity_tokens": sum(len(ids) - 1 for ids in quality.encode_texts(loaded.tokenizer)),
    }


def footprint_sweep(models_by_role: dict[str, str], quantizations: Sequence[str], prompts, *, dtype: str,
                    device: str, double_quant: bool, max_new_tokens: int, repeats: int, warmup: int,
                    out_dir: Path, config: dict, variants: Variants | None = None,
                    engine: llama_cpp_peer.LlamaCppModel | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
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
                                      params={"model_role": model_role, "quantization": quantization}))
        if engine is not None and model_role == "target":
            footprints.append(_llama_cpp_footprint(engine, dtype))
            methods.append(lineups.llama_cpp_ar(engine, variants[(spec, quantizations[0])], max_new_tokens,
                                                name=footprints[-1]["variant"],
                                                params={"model_role": model_role, "quantization": LLAMA_CPP}))
        memory.free_memory()
        rows = bench.run(methods, prompts, variants[(spec, quantizations[0])].tokenizer, out=Path(out_dir) / "ar.jsonl",
                         repeats=repeats, warmup=warmup, config={**config, "role": model_role},
                         desc=f"AR {model_role}, every quantization side by side")
        frames.append(rows.assign(model_role=model_role,
                                  quantization=rows.method_params.map(lambda params: params["quantization"])))
    return pd.DataFrame(footprints), pd.concat(frames, ignore_index=True)


def load_llama_cpp(spec: str, prompt_lookup_tokens: int = 0) -> llama_cpp_peer.LlamaCppModel:
    """llama.cpp on the GGUF file a zoo model (or a .gguf spec) comes from, on torch's thread count;
    with prompt_lookup_tokens > 0, decoding with the binding's prompt lookup."""
    if spec in models.zoo.ZOO:
        return llama_cpp_peer.load(models.zoo.assemble_gguf(spec), prompt_lookup_tokens=prompt_lookup_tokens)
    if str(spec).endswith(".gguf"):
        return llama_cpp_peer.load(spec, prompt_lookup_tokens=prompt_lookup_tokens)
    raise ValueError(f"llama_cpp: true needs a GGUF file to run, but target {spec!r} is neither a zoo name nor a "
                     ".gguf path: set llama_cpp: false, or give the target as a .gguf file")


def _llama_cpp_footprint(engine: llama_cpp_peer.LlamaCppModel, dtype: str) -> dict:
    """The llama.cpp row of the footprint table: the GGUF file's bytes (it is memory-mapped and used
    as it is); the KV cache and perplexity are not measured through the binding."""
    kind = gguf_kind(engine.path.name)
    return {"model_role": "target", "model": engine.path.name, "quantization": LLAMA_CPP,
            "variant": f"target llama.cpp ({kind})", "label": f"llama.cpp {kind}", "dtype": "gguf",
            "description": (f"llama.cpp {llama_cpp_peer.PACKAGE.split('==')[1]} running the GGUF file as it is "
                            f"(its own 4/6-bit block formats and kernels), {engine.threads} threads"),
            "weight_bytes": engine.weight_bytes, "bytes_read_per_token": gguf_bytes_read_per_token(engine.path),
            "kv_cache_tokens": float("nan"), "kv_cache_bytes": float("nan"),
            "perplexity": float("nan"), "perplexity_tokens": float("nan")}


def gguf_kind(file_name: str, unknown: str = "GGUF") -> str:
    """'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf' -> 'Q4_K_M', 'SmolLM2-135M-Instruct.Q4_1.gguf' -> 'Q4_1'."""
    found = re.search(r"q\d+(_[a-z0-9]+)*(?=\.gguf$)", file_name, re.IGNORECASE)
    return found.group(0).upper() if found else unknown


def gguf_bytes_read_per_token(path: Path) -> int:
    """Bytes of a GGUF's tensors that one decode step reads: all of them but the token-embedding
    table, unless the file has no separate output matrix (then the tied table is the output head)."""
    import gguf

    sizes = {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(str(path)).tensors}
    embedding = sizes.get("token_embd.weight", 0)
    return sum(sizes.values()) - (embedding if "output.weight" in sizes else 0)


def footprint_table(footprints: pd.DataFrame, ar_rows: pd.DataFrame, bandwidth: float | None = None) -> pd.DataFrame:
    """One line per (model role, quantization): memory three ways, speed (per-token speedup over
    the same model unquantized, side by side, with its interval), perplexity, greedy agreement
    with the unquantized model and, given the memory `bandwidth` (bytes/s), the roofline: the
    tokens/s that reading the weights once per token allows, and the fraction of it reached while
    decoding (`metrics.decode_tokens_per_second`: the prefill is not part of that bound)."""
    keys = ["model_role", "quantization"]
    per_variant = ar_rows.groupby(keys).agg(peak_working_bytes=("peak_memory_bytes", "max"),
                                            wall_time_s=("wall_time_s", "median"),
                                            decoder=("decoder", "first")).reset_index()
    decoding = metrics.aggregate(ar_rows.assign(decode=metrics.decode_tokens_per_second(ar_rows)), "decode").decode
    per_variant["decode_tokens_per_second"] = per_variant.pop("decoder").map(decoding)
    table = footprints.merge(per_variant, on=keys).merge(agreement_with_unquantized(ar_rows), on=keys, how="left")
    for column in ("weight_bytes", "peak_working_bytes", "kv_cache_bytes"):
        table[column.replace("_bytes", "_mb")] = table[column] / 2**20
    speed = []
    for model_role, rows in ar_rows.groupby("model_role"):
        unquantized = rows[rows.quantization == "none"].decoder.iloc[0]
        summary = metrics.summary(rows, baseline=unquantized)
        quantization_of = rows.drop_duplicates("decoder").set_index("decoder").quantization
        speed.append(summary.assign(model_role=model_role, quantization=summary.index.map(quantization_of)))
    columns = ["tokens_per_second", "ms_per_token", "speedup", "speedup_low", "speedup_high", "prompts"]
    speed = pd.concat(speed)[keys + columns].rename(columns={"speedup": "speed_vs_unquantized",
                                                              "speedup_low": "speed_vs_unquantized_low",
                                                              "speedup_high": "speed_vs_unquantized_high"})
    table = table.merge(speed, on=keys, how="left")
    unquantized = table[table.quantization == "none"].set_index("model_role")
    table["weights_vs_unquantized"] = table.weight_bytes / table.model_role.map(unquantized.weight_bytes)
    if bandwidth and "bytes_read_per_token" in table:
        table["bound_tokens_per_second"] = bandwidth / table.bytes_read_per_token
        table["fraction_of_bound"] = table.decode_tokens_per_second / table.bound_tokens_per_second
    return table


def agreement_with_unquantized(ar_rows: pd.DataFrame) -> pd.DataFrame:
    """Per (model role, quantization): mean greedy agreement and full-match rate of the repeat-0
    outputs against the "none" variant's output of the same model on the same prompt (NaN without one)."""
    first = ar_rows[ar_rows.repeat == 0]
    records = []
    for (model_role, quantization), group in first.groupby(["model_role", "quantization"]):
        reference = first[(first.model_role == model_role) & (first.quantization == "none")].set_index("prompt_id").tokens
        scored = metrics.add_agreement(group, reference=reference)
        records.append({"model_role": model_role, "quantization": quantization,
                        "agreement": scored.agreement.mean(), "full_match_rate": scored.full_match.mean()})
    return pd.DataFrame(records, columns=["model_role", "quantization", "agreement", "full_match_rate"])


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
                     engine: llama_cpp_peer.LlamaCppModel | None = None,
                     engine_lookup: llama_cpp_peer.LlamaCppModel | None = None) -> pd.DataFrame:
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
                params={"target_quantization": target_quantization}))
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


def label_pairs(rows: pd.DataFrame, target_quantization: str, dtype: str, baseline: str) -> pd.DataFrame:
    """Columns the tables and plots group by, from each method's recorded parameters."""
    pair_of = lambda params: quantize.Pair(params["target_quantization"], params["draft_quantization"],  # noqa: E731
                                           params["self_draft"]) if "draft_quantization" in (params or {}) else None
    pairs = rows.method_params.map(pair_of)
    return rows.assign(
        target_quantization=target_quantization, target=quantize.label(target_quantization, dtype),
        draft_quantization=pairs.map(lambda p: p.draft if p else None),
        self_draft=pairs.map(lambda p: p.self_draft if p else None),
        draft=pairs.map(lambda p: p.draft_label(dtype) if p else None),
        baseline=baseline,
    )


def speculative_table(rows: pd.DataFrame, unquantized_reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per pair: acceptance rate (accepted / proposed draft tokens, pooled), per-token
    speedup over AR of the same target variant (geometric mean over prompts, 95% interval, prompt
    count), tokens per target forward, agreement with that target's greedy AR output and, when
    `unquantized_reference` (AR rows of the unquantized target) is given, with the unquantized
    target's: what a user who quantizes the target cares about."""
    lines = []
    for baseline, group in rows.groupby("baseline", sort=False):
        # agreement with this target's own AR comes with the summary; with the unquantized target's, here
        with_agreement = with_unquantized_agreement(group, unquantized_reference)
        speed = metrics.summary(group, baseline)
        # our candidate sources on this target; llama.cpp's rows are compared in `versus_llama_cpp` instead
        # (a ratio of its prompt lookup to our AR would mix two engines in one "speedup")
        candidates = with_agreement[(with_agreement.decoder != baseline) & (with_agreement.role == "speculative")
                                    & (with_agreement.implementation != "llama.cpp")]
        for decoder, sub in candidates.groupby("decoder", sort=False):
            accepted = sum(sum(s) for s in sub.accepted_per_step)
            proposed = sum(sum(s) for s in sub.proposed_per_step)
            first = sub[sub.repeat == 0]
            lines.append({
                "pair": decoder, "lossless": bool(sub.lossless.iloc[0]), "target": sub.target.iloc[0],
                "source": sub.method_params.iloc[0].get("source"), "k": sub.method_params.iloc[0].get("k"),
                "draft": sub.draft.iloc[0], "target_quantization": sub.target_quantization.iloc[0],
                "draft_quantization": sub.draft_quantization.iloc[0], "self_draft": bool(sub.self_draft.iloc[0]),
                "acceptance_rate": accepted / proposed if proposed else float("nan"),
                **speed.loc[decoder, ["speedup", "speedup_low", "speedup_high", "prompts", "tokens_per_second"]],
                "tokens_per_target_forward": sub.tokens_per_target_forward.mean(),
                "agreement_with_target": speed.loc[decoder, "agreement"],
                "full_match_rate": speed.loc[decoder, "full_match_rate"],
                "agreement_with_unquantized": first.unquantized_agreement.mean() if len(first) else float("nan"),
            })
    return pd.DataFrame(lines)


def with_unquantized_agreement(rows: pd.DataFrame, unquantized: pd.DataFrame | None) -> pd.DataFrame:
    """`rows` with `unquantized_agreement` (and its full-match and divergence columns): agreement
    with the unquantized target's repeat-0 greedy output on the same prompt; NaN without one."""
    if unquantized is None or unquantized.empty:
        return rows.assign(unquantized_agreement=float("nan"))
    reference = unquantized[unquantized.repeat == 0].set_index("prompt_id").tokens
    return metrics.add_agreement(rows, reference=reference, prefix="unquantized_")


def versus_llama_cpp(rows: pd.DataFrame, unquantized: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every configuration of every target variant (its AR, its pairs, its prompt lookup) against
    llama.cpp's AR timed in the same run: per-token speed ratio (geometric mean over prompts, 95%
    interval), tokens/s, and agreement with that target's own greedy output (1.0 on every prompt =
    lossless for that backend) and with the unquantized target's. Empty without llama.cpp rows."""
    lines = []
    for baseline, group in rows.groupby("baseline", sort=False):
        engine_rows = group[(group.implementation == "llama.cpp") & (group.role == "target AR")]
        if engine_rows.empty:
            continue
        llama = engine_rows.decoder.iloc[0]
        labels = group.drop_duplicates("decoder").set_index("decoder")
        table = metrics.summary(group, baseline=llama, reference=baseline)
        scored = with_unquantized_agreement(group, unquantized)
        for decoder, line in table.drop(index=llama).iterrows():
            first = scored[(scored.decoder == decoder) & (scored.repeat == 0)]
            lines.append({
                "configuration": decoder, "target": group.target.iloc[0], "role": labels.role[decoder],
                "implementation": labels.implementation[decoder],
                "vs_llama_cpp": line.speedup, "vs_llama_cpp_low": line.speedup_low,
                "vs_llama_cpp_high": line.speedup_high, "prompts": line.prompts,
                "tokens_per_second": line.tokens_per_second,
                "llama_cpp_tokens_per_second": table.loc[llama, "tokens_per_second"],
                "agreement_with_target": line.agreement, "full_match_rate": line.full_match_rate,
                "agreement_with_unquantized": first.unquantized_agreement.mean(),
            })
    return pd.DataFrame(lines)


def fastest_lossless(versus: pd.DataFrame) -> pd.Series | None:
    """The fastest configuration whose output equalled its own target backend's greedy output on
    every prompt (measured, not declared), or None."""
    if versus.empty:
        return None
    exact = versus[(versus.full_match_rate == 1.0) & (versus.implementation != "llama.cpp") & versus.vs_llama_cpp.notna()]
    return None if exact.empty else exact.loc[exact.vs_llama_cpp.idxmax()]


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


def best_k_table(spec_table: pd.DataFrame, rows: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per draft-model pair: alpha counted from the tokens it proposed, and, from the target
    variant's T(n) and the draft variant's T(1), the k that maximizes Leviathan's expected speedup
    beside the prediction at the k that was run and the measured speedup there."""
    lines = []
    for line in spec_table[spec_table.source == "draft model"].itertuples():
        sub = rows[rows.decoder == line.pair]
        alpha = metrics.acceptance_alpha(sub.accepted_per_step, sub.proposed_per_step)
        target_curve = curves[curves.variant == f"target {line.target}"].set_index("n").ms
        label = line.draft[len("self "):] if line.self_draft else line.draft
        # a draft that is the target's model (self-drafts; target == draft) is named after the target
        names = [f"target {label}"] if line.self_draft else [f"draft {label}", f"target {label}"]
        draft_curve_name = next((n for n in names if (curves.variant == n).any()), names[0])
        draft_curve = curves[curves.variant == draft_curve_name].set_index("n").ms
        if target_curve.empty or draft_curve.empty:
            continue
        draft_ms = float(draft_curve.loc[1])  # the cost_curve_n rule makes n = 1 part of every curve
        best_k, best = metrics.best_k_from_costs(alpha, target_curve, draft_ms)
        lines.append({"pair": line.pair, "alpha": alpha, "k_run": line.k, "measured_speedup": line.speedup,
                      "predicted_at_k_run": metrics.predicted_speedup_from_costs(alpha, int(line.k), target_curve,
                                                                                 draft_ms),
                      "best_k": best_k, "predicted_at_best_k": best,
                      "target_T1_ms": float(target_curve.loc[1]), "draft_T1_ms": draft_ms,
                      "draft_curve": draft_curve_name})
    return pd.DataFrame(lines)


def unquantized_reference(ar_rows: pd.DataFrame, model_role: str = "target") -> pd.DataFrame:
    """The unquantized model's AR rows from the footprint sweep (empty when it was not run)."""
    if ar_rows.empty or "quantization" not in ar_rows:
        return ar_rows
    return ar_rows[(ar_rows.model_role == model_role) & (ar_rows.quantization == "none")]


# --- plain-language verdicts (computed, never typed) -------------------------------------------------

def describe_all(names: Sequence[str], dtype: str, device: str) -> str:
    """A Markdown list: each variant's label and what it stores and computes in which precision."""
    return "\n".join(f"- **{quantize.label(name, dtype)}**: {quantize.describe(name, dtype, device)}" for name in names)


def tradeoff_sentences(table: pd.DataFrame) -> list[str]:
    """For each quantized variant: how much smaller its weights are and how its speed compares with
    the unquantized model, in words, e.g. 'saves memory but costs speed'."""
    sentences = []
    for row in table[~table.quantization.isin(["none", LLAMA_CPP])].itertuples():
        smaller = 1 - row.weights_vs_unquantized
        faster = row.speed_vs_unquantized
        size = f"{smaller:.0%} smaller" if smaller >= 0 else f"{-smaller:.0%} larger"
        verdict = ("saves weight memory and is faster" if smaller > 0 and faster >= 1 else
                   "saves weight memory but costs speed" if smaller > 0 else
                   "saves no weight memory here" + (" but is faster" if faster >= 1 else " and is slower"))
        sentences.append(
            f"{row.model_role} {row.label}: weights {row.weight_mb:,.0f} MB ({size} than unquantized), "
            f"{row.tokens_per_second:.1f} tokens/s ({faster:.2f}x the unquantized speed), KV cache "
            f"{row.kv_cache_mb:,.1f} MB at {row.kv_cache_tokens} tokens, perplexity {row.perplexity:.2f}, "
            f"greedy agreement with unquantized {row.agreement:.0%}: {verdict}.")
    return sentences


def baseline_note(spec: str, dtype: str) -> str:
    """What "unquantized" means for this model (the zoo mirrors are already 4-bit GGUFs)."""
    held = models.DTYPE_LABELS[models.parse_dtype(dtype)]
    if spec in models.zoo.ZOO:
        kind = gguf_kind(models.zoo.ZOO[spec].gguf_name, unknown="quantized")
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
                f"target (95% CI {row.speedup_low:.2f}-{row.speedup_high:.2f}x over {row.prompts} prompts), "
                f"{row.tokens_per_target_forward:.2f} tokens per target forward, agreement with that target's "
                f"greedy output {row.agreement_with_target:.0%}")
        if not math.isnan(row.agreement_with_unquantized):
            line += f", with the unquantized target's {row.agreement_with_unquantized:.0%}"
        lines.append(line + ".")
    return lines


def limit_sentences(tables: Tables) -> list[str]:
    """How close each AR backend comes to the memory-bandwidth bound, what verifying 8 tokens costs
    on each, and the fastest lossless configuration against llama.cpp (computed, never typed)."""
    lines = []
    table = tables.footprints[tables.footprints.model_role == "target"]
    if "fraction_of_bound" in table:
        for row in table.itertuples():
            lines.append(f"{row.variant}: {row.decode_tokens_per_second:.1f} tokens/s while decoding, "
                         f"{row.fraction_of_bound:.0%} of the bandwidth bound ({row.bound_tokens_per_second:.1f} "
                         f"tokens/s for {row.bytes_read_per_token / 2**20:,.0f} MB read per token); "
                         f"{row.tokens_per_second:.1f} tokens/s with its prefill.")
    if not tables.kernels.empty:
        for row in tables.kernels[tables.kernels.rows == 1].itertuples():
            lines.append(f"{row.kernel}, one {row.weight_mb:.1f} MB MLP matrix alone, one row: {row.ms:.2f} ms, "
                         f"{row.gb_per_s:.1f} GB/s = {row.fraction_of_bandwidth:.0%} of the copy bandwidth.")
    curves = tables.cost_curves
    if not curves.empty and {1, 8} <= set(curves.n):
        for variant, curve in curves.groupby("variant", sort=False):
            ms = curve.set_index("n").ms
            lines.append(f"{variant}: T(1) = {ms[1]:.0f} ms, T(8) = {ms[8]:.0f} ms: verifying 8 tokens costs "
                         f"{ms[8] / ms[1]:.1f}x one.")
    for row in tables.best_k.itertuples():
        lines.append(f"{row.pair}: alpha {row.alpha:.2f}; at k={int(row.k_run)} predicted {row.predicted_at_k_run:.2f}x, "
                     f"measured {row.measured_speedup:.2f}x; the cost curve's best k is {row.best_k} "
                     f"(predicted {row.predicted_at_best_k:.2f}x).")
    best = fastest_lossless(tables.versus_llama_cpp)
    if best is not None:
        verdict = "at least as fast as" if best.vs_llama_cpp_low >= 1 else (
            "level with" if best.vs_llama_cpp_high >= 1 else "slower than")
        lines.append(f"Fastest configuration that equalled its own target's greedy output on every prompt: "
                     f"{best.configuration}, {best.tokens_per_second:.1f} tokens/s = {best.vs_llama_cpp:.2f}x llama.cpp's "
                     f"AR in the same run (95% CI {best.vs_llama_cpp_low:.2f}-{best.vs_llama_cpp_high:.2f}, "
                     f"{int(best.prompts)} prompts; llama.cpp {best.llama_cpp_tokens_per_second:.1f} tokens/s): "
                     f"{verdict} llama.cpp. Its agreement with the unquantized target's greedy output: "
                     f"{best.agreement_with_unquantized:.0%}.")
    return lines


def headline(tables: Tables) -> dict:
    """The few numbers the report index shows, each speed ratio with its interval and prompt count."""
    numbers = {}
    table, spec_table = tables.footprints, tables.spec_table
    for row in table[(table.model_role == "target") & (table.quantization != "none")].itertuples():
        numbers[f"target {row.label}: weights vs unquantized"] = round(float(row.weights_vs_unquantized), 3)
        numbers[f"target {row.label}: speed per token vs unquantized"] = (
            f"{row.speed_vs_unquantized:.2f}x (95% CI {row.speed_vs_unquantized_low:.2f}-"
            f"{row.speed_vs_unquantized_high:.2f}, {row.prompts} prompts)")
    if not spec_table.empty:
        best = spec_table.sort_values("speedup", ascending=False).iloc[0]
        numbers["fastest speculative pair"] = best.pair
        numbers["its speedup over AR of its target"] = (f"{best.speedup:.2f}x (95% CI {best.speedup_low:.2f}-"
                                                        f"{best.speedup_high:.2f}, {int(best.prompts)} prompts)")
        numbers["its agreement with the unquantized target's greedy output"] = round(float(best.agreement_with_unquantized), 3)
    fastest = fastest_lossless(tables.versus_llama_cpp)
    if fastest is not None:
        numbers["fastest lossless configuration (own target backend)"] = fastest.configuration
        numbers["its speed vs llama.cpp AR"] = (f"{fastest.vs_llama_cpp:.2f}x (95% CI {fastest.vs_llama_cpp_low:.2f}-"
                                                f"{fastest.vs_llama_cpp_high:.2f}, {int(fastest.prompts)} prompts)")
        numbers["its agreement with the unquantized target"] = round(float(fastest.agreement_with_unquantized), 3)
    return numbers


def summary_lines(spec_table: pd.DataFrame) -> pd.DataFrame:
    """The speculative pairs in the summary's columns, with their declared lossless property."""
    return pd.DataFrame({
        "method": spec_table.pair.values,
        "lossless": spec_table.lossless.values,
        "role": "speculative",
        "speedup": spec_table.speedup.values,
        "speedup_low": spec_table.speedup_low.values,
        "speedup_high": spec_table.speedup_high.values,
        "prompts": spec_table.prompts.values,
        "tokens_per_second": spec_table.tokens_per_second.values,
        "tokens_per_target_forward": spec_table.tokens_per_target_forward.values,
        "agreement": spec_table.agreement_with_target.values,
        "agreement_with_unquantized": spec_table.agreement_with_unquantized.values,
        "full_match_rate": spec_table.full_match_rate.values,
        "acceptance_rate": spec_table.acceptance_rate.values,
    })


def markdown_tables(results_dir: str) -> str:
    """The backends against their bandwidth bound, T(n) per backend and every configuration against
    llama.cpp, from the CSV files the last run of notebook 03 wrote: what
    `python -m specdec_lab.experiments.quantized results/cpu` prints for the README."""
    folder = common.results_file({"results_dir": results_dir}, NOTEBOOK, "footprints.csv").parent
    if not (folder / "footprints.csv").exists():
        raise FileNotFoundError(f"no footprints.csv in {folder}: run notebook 03 first")
    footprints = pd.read_csv(folder / "footprints.csv")
    try:
        versus = pd.read_csv(folder / "versus_llama_cpp.csv")
    except pd.errors.EmptyDataError:  # a run without llama.cpp
        versus = pd.DataFrame()
    curves = pd.read_csv(folder / "cost_curves.csv")
    lines = ["| AR backend (target) | weights MB | tokens/s | speed vs unquantized (95% CI) | decode tokens/s | "
             "bandwidth bound tokens/s | decode fraction of bound | agreement with unquantized greedy |",
             "|---|---|---|---|---|---|---|---|"]
    for row in footprints[footprints.model_role == "target"].itertuples():
        bound = getattr(row, "bound_tokens_per_second", float("nan"))
        fraction = getattr(row, "fraction_of_bound", float("nan"))
        lines.append(f"| {row.variant} | {row.weight_mb:,.0f} | {row.tokens_per_second:.2f} | "
                     f"{row.speed_vs_unquantized:.2f} ({row.speed_vs_unquantized_low:.2f}-{row.speed_vs_unquantized_high:.2f}, "
                     f"{int(row.prompts)} prompts) | {row.decode_tokens_per_second:.2f} | {bound:.1f} | {fraction:.0%} "
                     f"| {row.agreement:.2f} |")
    lines += ["", "| variant | " + " | ".join(f"T({n}) ms" for n in sorted(curves.n.unique())) + " |",
              "|---|" + "---|" * curves.n.nunique()]
    for variant, curve in curves.groupby("variant", sort=False):
        lines.append(f"| {variant} | " + " | ".join(f"{ms:.0f}" for ms in curve.sort_values("n").ms) + " |")
    if not versus.empty:
        lines += ["", "| configuration | tokens/s | vs llama.cpp AR, same run (95% CI) | llama.cpp tokens/s | "
                  "agreement with own target | with unquantized target |", "|---|---|---|---|---|---|"]
        for row in versus.itertuples():
            lines.append(f"| {row.configuration} | {row.tokens_per_second:.2f} | {row.vs_llama_cpp:.2f} "
                         f"({row.vs_llama_cpp_low:.2f}-{row.vs_llama_cpp_high:.2f}, {int(row.prompts)} prompts) | "
                         f"{row.llama_cpp_tokens_per_second:.2f} | {row.agreement_with_target:.2f} | "
                         f"{row.agreement_with_unquantized:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(markdown_tables(sys.argv[1] if len(sys.argv) > 1 else "results/cpu"))
