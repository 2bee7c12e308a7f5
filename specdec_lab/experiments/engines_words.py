"""The sentences of notebook 03's engines part, every number from its tables."""

from __future__ import annotations

import pandas as pd

from specdec_lab.metrics import GEOMETRIC_MEAN, Speedup
from specdec_lab.words import interval


def paths_sentence(paths: pd.DataFrame, chosen: str, ar_chosen: str) -> str:
    """Which torch path won, by how much, for each model role, for one-token forwards (AR, drafting)
    and for multi-token forwards (verifying)."""
    parts = []
    for role, group in paths.groupby("model_role", sort=False):
        one, multi = group.sort_values("generation_s"), group.sort_values("multi_token_generation_s")
        best, slowest = one.iloc[0], one.iloc[-1]
        line = (f"for the {role}, {best.path} takes {best.generation_s:.1f} s for a prefill of {best.prompt_tokens} "
                f"tokens and {best.new_tokens} one-token steps ({1000 * best.step_s:.0f} ms a step), {slowest.path} "
                f"{slowest.generation_s:.1f} s ({1000 * slowest.step_s:.0f} ms a step)")
        if role == "target":
            wide = multi.iloc[0]
            line += (f"; with forwards over {wide.multi_token_width} tokens in place of the steps, as a "
                     f"verifying target runs, {wide.path} is fastest ({1000 * wide.multi_token_s:.0f} ms a forward, "
                     f"{wide.multi_token_s / wide.step_s:.2f} of its one-token step), "
                     + ", ".join(f"{line.path} {1000 * line.multi_token_s:.0f} ms "
                                 f"({line.multi_token_s / line.step_s:.2f})" for line in multi.iloc[1:].itertuples()))
        parts.append(line)
    ar = "" if ar_chosen == chosen else f" The kit's AR runs on {ar_chosen} as well, the torch AR a user would run."
    return (f"**The fastest torch path on this CPU**, measured: {'; '.join(parts)}. The kit's torch methods below run "
            f"the target on {chosen}, the path fastest at verifying, and the draft on its fastest one-token path.{ar}")


def roofline_sentences(roofline: pd.DataFrame) -> list[str]:
    return [f"{line.decoder}: {line.decode_tokens_per_second:.1f} tokens/s decoding (median over its rows), "
            f"{100 * line.fraction_of_bound:.0f}% of the {line.bound_tokens_per_second:.1f} tokens/s that "
            f"{line.bandwidth_gb_s:.1f} GB/s allow when each token reads {line.bytes_read_per_token_mb:,.0f} MiB of weights."
            for line in roofline.itertuples()]


def cost_sentences(curves: pd.DataFrame) -> list[str]:
    """Per engine, what verifying costs: T(2)/T(1) and the acceptance a one-token proposal needs."""
    lines = []
    for (engine, role), curve in curves[curves.model_role == "target"].groupby(["engine", "model_role"], sort=False):
        relative = curve.set_index("n").relative_to_one
        largest = int(relative.index.max())
        line = f"{engine}: T(1) = {curve.set_index('n').ms_fit.loc[1]:.0f} ms for the {role}"
        if 2 in relative.index:
            line += (f"; T(2)/T(1) = {relative.loc[2]:.2f}, so a one-token proposal pays only if it is accepted more "
                     f"than {100 * (relative.loc[2] - 1):.0f}% of the time")
        lines.append(line + f"; T({largest})/T(1) = {relative.loc[largest]:.2f}.")
    return lines


def best_sentences(best: pd.DataFrame) -> list[str]:
    """Per kind: the kit's fastest configuration equal to its engine's AR against llama.cpp's AR and its prompt lookup."""
    lines = []
    for line in best.itertuples():
        theirs = Speedup(line.llama_cpp_lookup, line.llama_cpp_lookup_low, line.llama_cpp_lookup_high,
                         int(line.llama_cpp_lookup_prompts), GEOMETRIC_MEAN)
        if line.best is None or pd.isna(line.speedup):
            lines.append(f"{line.category}: no method of the kit equalled its engine's AR on every prompt "
                         f"(llama.cpp's prompt lookup: {interval(theirs)} over llama.cpp's AR).")
            continue
        ours = Speedup.from_line(line)
        verdict = "beats" if ours.low > theirs.high else ("trails" if ours.high < theirs.low else "is level with")
        lines.append(f"{line.category}: the fastest configuration equal to its engine's AR is {line.best}, "
                     f"{interval(ours)} over llama.cpp's AR; it {verdict} llama.cpp's prompt lookup "
                     f"({interval(theirs, prompts=False)}).")
    return lines


def prediction_sentences(predicted: pd.DataFrame, curves: pd.DataFrame) -> list[str]:
    """Per engine: how far the cost model lands from the measurement, and where speculation cannot pay."""
    lines = []
    for engine, group in predicted.groupby("engine", sort=False):
        errors = group.error.abs()
        within = int((errors <= 0.15).sum())
        lines.append(f"{engine}: the prediction lands within 15% of the measured decode speedup for {within} of "
                     f"{len(group)} (kind, method) pairs; the largest miss is {100 * errors.max():.0f}% "
                     f"({group.loc[errors.idxmax()].decoder}, {group.loc[errors.idxmax()].category}).")
        losing = group[group.predicted < 1]
        for line in losing.itertuples():
            lines.append(f"{engine}, {line.category}: {line.decoder} cannot pay at its measured acceptance "
                         f"(alpha = {line.alpha:.2f}, {line.mean_proposed:.1f} tokens proposed a step): predicted "
                         f"{line.predicted:.2f}x, measured {line.measured:.2f}x.")
    return lines


def differences_sentence(differences: pd.DataFrame, per_kind: pd.DataFrame, torch_path: str) -> str:
    """Where the kit's texts part from their engine's AR, set beside llama.cpp's own prompt lookup
    against llama.cpp's own AR (the same kernels, the engine's own decoder)."""
    if differences.empty:
        return "Every method of the kit produced its engine's AR text, token for token, on every prompt."
    counts = differences.groupby("engine").size()
    first = differences.sort_values("position").iloc[0]
    theirs = per_kind[(per_kind.implementation == "llama.cpp") & (per_kind.agreement < 1)]
    peer = ("" if theirs.empty else
            f" llama.cpp's own prompt lookup parts from llama.cpp's own AR too (agreement "
            f"{theirs.agreement.min():.2f} on {theirs.loc[theirs.agreement.idxmin()].category}).")
    return (f"{len(differences)} generations parted from their engine's AR text "
            f"({', '.join(f'{engine}: {n}' for engine, n in counts.items())}); the earliest, {first.decoder} on "
            f"{first.prompt_id}, at generated token {first.position + 1} ({first.method_token} where AR has "
            f"{first.ar_token}). A verify pass runs batched matrix kernels where AR runs one-row kernels (llama.cpp's "
            f"quantized blocks; {torch_path}); their sums round apart, so near-ties can flip." + peer +
            " In fp32, where both kernels agree, the decoders are exact (tests/test_engines.py, notebook 02's control).")


# --- part 5: vLLM ----------------------------------------------------------------------------------------

def vllm_sentences(tables) -> list[str]:
    """`vllm_engine.VllmTables` in words: what ran, vLLM's AR and speculation over llama.cpp's AR and over
    its own AR, whether its text kept vLLM's AR and the kit's, and the kit's fastest against vLLM's fastest."""
    lines = [f"vLLM {tables.version} ran the target's weights in {tables.dtype} on {tables.cpu}; "
             f"{len(tables.per_kind.decoder.unique())} configurations, each in its own run beside llama.cpp's AR."]
    for line in tables.errors.itertuples():
        lines.append(f"{line.configuration} could not run here ({line.speculative_config}): {line.error[:300]}")
    for kind, group in tables.per_kind.groupby("category", sort=False):
        parts = [f"{line.decoder} {interval(Speedup.from_line(line))}" for line in group.itertuples()]
        lines.append(f"{kind}, over llama.cpp's AR: " + "; ".join(parts) + ".")
    for name, group in tables.over_vllm_ar.groupby("decoder", sort=False):
        parts = [f"{line.category} {interval(Speedup.from_line(line, 'speedup_over_vllm_ar'))}" for line in group.itertuples()]
        lines.append(f"{name} over vLLM's AR (per prompt, the quotient of the two runs' ratios over llama.cpp's AR, so "
                     "it carries both runs' drift): " + "; ".join(parts) + ".")
    kept = tables.per_kind[tables.per_kind.agreement_with_vllm_ar < 0.999]
    lines.append("Every speculative configuration of vLLM kept vLLM's AR text on every prompt." if kept.empty else
                 f"{len(kept)} (kind, configuration) pairs parted from vLLM's AR text (lowest agreement "
                 f"{kept.agreement_with_vllm_ar.min():.2f}, {kept.loc[kept.agreement_with_vllm_ar.idxmin()].decoder}).")
    same, parted = tables.same_weights, tables.same_weights.dropna(subset=["position"])
    line = (f"On the same weights ({tables.dtype}), vLLM's AR text equals the kit's AR text on {len(same) - len(parted)} of "
            f"{len(same)} prompts")
    if not parted.empty:
        first = parted.sort_values("position").iloc[0]
        line += (f"; the earliest parting, on {first.prompt_id}, is at generated token {int(first.position) + 1} (vLLM "
                 f"{int(first.vllm_token)} where the kit has {int(first.kit_token)}): the two engines' kernels sum in "
                 "another order, so a near-tie can flip (in fp32 on SmolLM2-135M the texts are equal, "
                 "tests/test_vllm_peer.py)")
    lines.append(line + f". vLLM's AR runs at {interval(tables.vllm_ar_over_kit_ar)} the kit's AR on those weights, "
                        "per token, side by side.")
    return lines


def kit_versus_vllm_sentences(versus: pd.DataFrame) -> list[str]:
    """Per kind: the kit's fastest lossless configuration against vLLM's fastest speculation, both over
    llama.cpp's AR on the same prompts."""
    lines = []
    for line in versus.itertuples():
        kit = Speedup(line.kit_speedup, line.kit_speedup_low, line.kit_speedup_high, int(line.kit_prompts), GEOMETRIC_MEAN)
        if line.vllm is None:
            lines.append(f"{line.category}: the kit's {line.kit} runs at {interval(kit)} over llama.cpp's AR; no "
                         "speculation of vLLM ran here.")
            continue
        theirs = Speedup(line.vllm_speedup, line.vllm_speedup_low, line.vllm_speedup_high, int(line.vllm_prompts),
                         GEOMETRIC_MEAN)
        verdict = "at least as fast as" if line.kit_over_vllm >= 1 else "slower than"
        lines.append(f"{line.category}: the kit's {line.kit}, {interval(kit)} over llama.cpp's AR, is {verdict} "
                     f"vLLM's fastest speculation, {line.vllm}, {interval(theirs)} ({line.kit_over_vllm:.2f}x of it; "
                     f"vLLM's AR: {line.vllm_ar_speedup:.2f}x).")
    return lines
