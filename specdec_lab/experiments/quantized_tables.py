"""Notebook 03's tables, computed from benchmark rows, footprints and cost curves: numbers only,
tested on synthetic rows. `quantized` runs the sweeps; `quantized_words` says what these tables show.

    python -m specdec_lab.experiments.quantized_tables results/cpu   # the README's tables
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specdec_lab import cost_model, metrics, words
from specdec_lab.experiments import common
from specdec_lab.metrics import Speedup
from specdec_lab.models import quantize

NOTEBOOK = "03_quantized"
LLAMA_CPP = "llama.cpp"  # the footprint sweep's "quantization" of the llama.cpp row: the GGUF file as it is


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
    token_views: object = None  # the first prompt, every pair's text coloured by token origin (HTML)


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


def unquantized_reference(ar_rows: pd.DataFrame, model_role: str = "target") -> pd.DataFrame:
    """The unquantized model's AR rows from the footprint sweep (empty when it was not run)."""
    if ar_rows.empty or "quantization" not in ar_rows:
        return ar_rows
    return ar_rows[(ar_rows.model_role == model_role) & (ar_rows.quantization == "none")]


def label_pairs(rows: pd.DataFrame, target_quantization: str, dtype: str, baseline: str) -> pd.DataFrame:
    """Columns the tables and plots group by, from each row's weights (its method's `Weights`): the
    target variant, the draft's label for a pair, and the AR baseline of the rows' target variant."""
    pairs = [quantize.Pair(target, draft, bool(self_draft)) if isinstance(draft, str) else None
             for target, draft, self_draft in zip(rows.quantization, rows.draft_quantization, rows.self_draft)]
    return rows.assign(target_quantization=target_quantization, target=quantize.label(target_quantization, dtype),
                       draft=[pair.draft_label(dtype) if pair else None for pair in pairs], baseline=baseline)


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
                "source": sub.source_kind.iloc[0], "k": int(sub.k.iloc[0]),
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


def best_k_table(spec_table: pd.DataFrame, rows: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per draft-model pair: alpha counted from the tokens it proposed, and, from the target
    variant's T(n) and the draft variant's T(1), the k that maximizes Leviathan's expected speedup
    beside the prediction at the k that was run and the measured speedup there."""
    lines = []
    for line in spec_table[spec_table.source == "draft model"].itertuples():
        sub = rows[rows.decoder == line.pair]
        alpha = cost_model.acceptance_alpha(sub.accepted_per_step, sub.proposed_per_step)
        target_curve = curves[curves.variant == f"target {line.target}"].set_index("n").ms
        label = line.draft[len("self "):] if line.self_draft else line.draft
        # a draft that is the target's model (self-drafts; target == draft) is named after the target
        names = [f"target {label}"] if line.self_draft else [f"draft {label}", f"target {label}"]
        draft_curve_name = next((n for n in names if (curves.variant == n).any()), names[0])
        draft_curve = curves[curves.variant == draft_curve_name].set_index("n").ms
        if target_curve.empty or draft_curve.empty:
            continue
        draft_ms = float(draft_curve.loc[1])  # the cost_curve_n rule makes n = 1 part of every curve
        best_k, best = cost_model.best_k_from_costs(alpha, target_curve, draft_ms)
        lines.append({"pair": line.pair, "alpha": alpha, "k_run": line.k, "measured_speedup": line.speedup,
                      "predicted_at_k_run": cost_model.predicted_speedup_from_costs(alpha, int(line.k), target_curve,
                                                                                 draft_ms),
                      "best_k": best_k, "predicted_at_best_k": best,
                      "target_T1_ms": float(target_curve.loc[1]), "draft_T1_ms": draft_ms,
                      "draft_curve": draft_curve_name})
    return pd.DataFrame(lines)


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
    `python -m specdec_lab.experiments.quantized_tables results/cpu` prints for the README."""
    folder = common.results_file({"results_dir": results_dir}, NOTEBOOK, "footprints.csv").parent
    if not (folder / "footprints.csv").exists():
        raise FileNotFoundError(f"no footprints.csv in {folder}: run notebook 03 first")
    footprints = pd.read_csv(folder / "footprints.csv")
    try:
        versus = pd.read_csv(folder / "versus_llama_cpp.csv")
    except pd.errors.EmptyDataError:  # a run without llama.cpp
        versus = pd.DataFrame()
    curves = pd.read_csv(folder / "cost_curves.csv")
    tables = [words.markdown_table(*backends_frame(footprints[footprints.model_role == "target"])),
              words.markdown_table(curves.pivot_table(index="variant", columns="n", values="ms", sort=False)
                                   .rename(columns=lambda n: f"T({n}) ms").reset_index(),
                                   {f"T({n}) ms": ".0f" for n in curves.n.unique()})]
    if not versus.empty:
        tables.append(words.markdown_table(*versus_frame(versus)))
    return "\n\n".join(tables)


def with_interval(frame: pd.DataFrame, column: str) -> list[str]:
    """'0.93 (0.90-0.95, 4 prompts)' per line, from `column`, `column_low`, `column_high` and `prompts`."""
    return [words.interval(Speedup.from_line(line, column), compact=True) for _, line in frame.iterrows()]


def backends_frame(footprints: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The AR backends of the target as the README shows them, and their formats."""
    nan = pd.Series(float("nan"), index=footprints.index)
    frame = pd.DataFrame({
        "AR backend (target)": footprints.variant, "weights MB": footprints.weight_mb,
        "tokens/s": footprints.tokens_per_second,
        "speed vs unquantized (95% CI)": with_interval(footprints, "speed_vs_unquantized"),
        "decode tokens/s": footprints.decode_tokens_per_second,
        "bandwidth bound tokens/s": footprints.get("bound_tokens_per_second", nan),
        "decode fraction of bound": footprints.get("fraction_of_bound", nan),
        "agreement with unquantized greedy": footprints.agreement})
    return frame, {"weights MB": ",.0f", "tokens/s": ".2f", "decode tokens/s": ".2f", "bandwidth bound tokens/s": ".1f",
                   "decode fraction of bound": ".0%", "agreement with unquantized greedy": ".2f"}


def versus_frame(versus: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Every configuration against llama.cpp's AR as the README shows it, and its formats."""
    frame = pd.DataFrame({
        "configuration": versus.configuration, "tokens/s": versus.tokens_per_second,
        "vs llama.cpp AR, same run (95% CI)": with_interval(versus, "vs_llama_cpp"),
        "llama.cpp tokens/s": versus.llama_cpp_tokens_per_second,
        "agreement with own target": versus.agreement_with_target,
        "with unquantized target": versus.agreement_with_unquantized})
    return frame, {"tokens/s": ".2f", "llama.cpp tokens/s": ".2f", "agreement with own target": ".2f",
                   "with unquantized target": ".2f"}


if __name__ == "__main__":
    import sys

    print(markdown_tables(sys.argv[1] if len(sys.argv) > 1 else "results/cpu"))
