"""Notebook 03, second part: the kit's methods on both engines, side by side, per kind of text.

Whether speculation pays depends on what a forward over n tokens costs, T(n), in the kernels that
run. So the same decoders run on two engines, in one interleaved benchmark over the kinds of text of
notebook 02:
- llama.cpp's own generation loop on the target's GGUF file: AR (the baseline every speedup here is
  over) and its prompt lookup;
- the kit's decoders on llama.cpp, same files (`decoders.backend`): AR, the draft model (constant
  k, so Leviathan's formula applies as it stands), prompt lookup and the hybrid;
- the kit's decoders on torch, the target on the dense path measured fastest for multi-token
  forwards on this CPU (it verifies proposals), the draft on the one fastest for one-token ones
  (`models.dense_path`); and, where it differs, the kit's AR on the target's fastest one-token path,
  the torch AR a user would run.
T(n) of both engines feeds the cost model, whose prediction per kind and engine stands beside the
measurement. A lossless method's text is checked against its own engine's AR (llama.cpp's batched
and one-token kernels may round apart: the first differing token is shown).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specdec_lab import hardware, metrics, models, token_view
from specdec_lab.decoders import llama_cpp_peer
from specdec_lab.decoders.backend import engine as engine_of
from specdec_lab.experiments import common, lineups
from specdec_lab.experiments.speculative import draft_cost_ratio, draft_prefill_ratio, prompts_of
from specdec_lab.method import Method, Weights
from specdec_lab.models import dense_path
from specdec_lab.quality import common_prefix_length
from specdec_lab.runs import bench

NOTEBOOK = "03_quantized"
PEER_AR = "llama.cpp AR (its own loop)"


@dataclass
class EngineTables:
    rows: pd.DataFrame  # every generation of the run
    per_kind: pd.DataFrame  # per (kind of text, method): speedup over llama.cpp's AR, agreement with its engine's AR
    best: pd.DataFrame  # per kind: the fastest lossless configuration over both engines, and llama.cpp's lookup
    predicted: pd.DataFrame  # per (kind, method) of the kit: the cost model's speedup over its engine's AR vs measured
    curves: pd.DataFrame  # T(n) of the target and the draft on each engine
    roofline: pd.DataFrame  # each AR loop's decode speed against bandwidth / bytes read per token
    dense_paths: pd.DataFrame  # each torch path's prefill and step time, target and draft, on this CPU
    first_differences: pd.DataFrame  # where a lossless method's text parts from its engine's AR, and why
    torch_path: str  # the torch path of the target the kit's torch methods ran on (fastest at verifying)
    torch_ar_path: str  # the target's fastest one-token torch path, where its AR ran too
    token_views: object = None  # one prompt per kind, the kit's methods on both engines, coloured by token origin


def torch_label(loaded: models.LoadedModel) -> str:
    return "torch " + loaded.precision


def lineup(target: models.LoadedModel, draft: models.LoadedModel, k: int, prompt_lookup_k: int,
           max_new_tokens: int, cost_ratio: float, where: str, relative_target=None,
           prefill_cost_ratio: float = 0.0) -> list[Method]:
    """The kit's four methods on one engine (`where` names it in the methods' names); given the engine's
    measured T(n) / T(1), `relative_target`, prompt lookup and the hybrid are cut and priced by it; the hybrid
    charges its draft's catch-up at `prefill_cost_ratio` target steps a token (the engine's, measured)."""
    cut = lineups.CUT_LABEL if relative_target is not None else ""
    lossless = target.quantization == "none" and target.dtype is not None  # equal to the unquantized target's AR
    weights = Weights(quantization=target.quantization, draft_quantization=draft.quantization)
    return [
        lineups.ar(target, max_new_tokens, name=f"AR (ours · {where})", lossless=lossless,
                   weights=Weights(quantization=target.quantization)),
        lineups.draft_model_speculative(target, draft, k, max_new_tokens, name=f"draft k={k} (ours · {where})",
                                        lossless=lossless, weights=weights),
        lineups.prompt_lookup(target, prompt_lookup_k, max_new_tokens, lossless=lossless,
                              name=f"prompt lookup k={prompt_lookup_k}{cut} (ours · {where})",
                              weights=Weights(quantization=target.quantization), relative_target=relative_target),
        lineups.hybrid(target, draft, k, prompt_lookup_k, max_new_tokens, cost_ratio,
                       name=f"hybrid{cut} (ours · {where})", lossless=lossless, weights=weights,
                       prefill_cost_ratio=prefill_cost_ratio, relative_target=relative_target),
    ]


def run(params: dict) -> EngineTables:
    new_tokens, k, lookup_k = params["engine_max_new_tokens"], params["engine_k"], params["prompt_lookup_k"]
    if lookup_k < 1:
        raise ValueError(f"the engines part runs prompt lookup on both engines: set prompt_lookup_k >= 1, got {lookup_k}")
    longest = max(k, 2 * lookup_k) + 1  # our prompt lookup grows its proposal up to 2k (PromptLookupCandidates)
    if max(params["engine_cost_curve_n"]) < longest:
        raise ValueError(f"engine_cost_curve_n must reach {longest} (a verify pass of the longest proposal, "
                         f"engine_k={k}, prompt_lookup_k={lookup_k} up to twice that, + 1): the cost model never "
                         f"extrapolates T(n); got {params['engine_cost_curve_n']}")
    prompts = prompts_of({**params, "prompt_sets": params["engine_prompt_sets"]}, params["engine_prompts"])
    out = common.results_file(params, NOTEBOOK, "engines.jsonl")
    specs = {"target": params["target"], "draft": params["draft"]}

    paths = pd.DataFrame([{"model_role": role, "path": timing.label, **vars(timing),
                           "generation_s": timing.generation_s(), "multi_token_generation_s": timing.generation_s(True),
                           "multi_token_width": dense_path.MULTI_TOKEN_WIDTH}
                          for role, spec in specs.items()
                          for timing in dense_path.measured_paths(spec, new_tokens=new_tokens)])
    # the target verifies (multi-token forwards); the draft drafts (one-token forwards)
    chosen = {role: dense_path.resolve(spec, params["torch_path"], new_tokens=new_tokens,
                                       multi_token=role == "target") for role, spec in specs.items()}
    # a path `auto` chose is loaded as `auto` loads it: a weight-only one with its wide copy for long forwards
    chosen_by_auto = params["torch_path"] == dense_path.AUTO
    on_torch = {role: models.load(spec, dtype=chosen[role][0], quantization=chosen[role][1], wide_copy=chosen_by_auto)
                for role, spec in specs.items()}
    ar_path = dense_path.resolve(params["target"], params["torch_path"], new_tokens=new_tokens)
    on_llama = {role: models.load_on_llama_cpp(spec) for role, spec in specs.items()}

    curves = pd.concat([hardware.forward_cost_curve(loaded.model, params["engine_cost_curve_n"],
                                                    repeats=params["cost_curve_repeats"])
                        .assign(model_role=role, engine=engine_of(loaded.model))
                        for group in (on_llama, on_torch) for role, loaded in group.items()], ignore_index=True)
    step_ms = curves[curves.n == 1].set_index(["engine", "model_role"]).ms_fit

    peer = llama_cpp_peer.load_for(params["target"])
    peer_lookup = llama_cpp_peer.load_for(params["target"], prompt_lookup_tokens=lookup_k)
    target_on_llama = on_llama["target"]
    methods = [lineups.llama_cpp_ar(peer, target_on_llama, new_tokens, name=PEER_AR),
               lineups.llama_cpp_prompt_lookup(peer_lookup, target_on_llama, new_tokens)]
    target_of_ar = {PEER_AR: target_on_llama}  # each AR loop's target, for its bandwidth bound
    for group, where in ((on_llama, f"llama.cpp {target_on_llama.quantization}"), (on_torch, torch_label(on_torch["target"]))):
        engine = engine_of(group["target"].model)
        cost_ratio = draft_cost_ratio(group["target"], group["draft"])  # the two T(1) timed in turn, as in 02
        target_curve = curves[(curves.engine == engine) & (curves.model_role == "target")].set_index("n").ms_fit
        # uncharged, the hybrid's draft explorations read the whole prompt first: on llama.cpp, where drafting never
        # paid, they cost 0.7-0.8x llama.cpp's AR against prompt lookup's 0.9-1.0x (AMD EPYC, AVX-512 BF16)
        prefill_ratio = draft_prefill_ratio(group["target"], group["draft"])
        group_methods = lineup(group["target"], group["draft"], k, lookup_k, new_tokens, cost_ratio, where,
                               target_curve / step_ms[(engine, "target")] if params["cost_sized"] else None,
                               prefill_ratio)
        target_of_ar[group_methods[0].name] = group["target"]  # the group's AR comes first
        methods += group_methods
    target_for_ar = on_torch["target"]
    if ar_path[1] != chosen["target"][1]:  # another quantization: the torch AR a user would run, beside
        target_for_ar = models.load(params["target"], dtype=ar_path[0], quantization=ar_path[1], wide_copy=chosen_by_auto)
        methods.append(lineups.ar(target_for_ar, new_tokens, name=f"AR (ours · {torch_label(target_for_ar)})",
                                  lossless=False, weights=Weights(quantization=target_for_ar.quantization)))
        target_of_ar[methods[-1].name] = target_for_ar
    elif ar_path != chosen["target"]:
        print(f"the target's fastest one-token path, {ar_path}, differs from its verify path only in dtype: "
              f"its AR is not run beside (the AR rows of one engine and quantization are one reference)")
    rows = bench.run(methods, prompts, target_on_llama.tokenizer, out=out, repeats=params["repeats"],
                     warmup=params["warmup"], config={**params, "torch_path": [list(c) for c in chosen.values()]},
                     desc="engines")
    per_kind = per_kind_table(rows, methods)
    weights_read = {name: hardware.bytes_read_per_token(model.model) for name, model in target_of_ar.items()}
    return EngineTables(rows, per_kind, best_table(per_kind, methods), predicted_table(rows, methods, curves),
                        curves, roofline_table(rows, weights_read, hardware.memory_bandwidth()), paths,
                        first_differences(rows, methods), torch_label(on_torch["target"]), torch_label(target_for_ar),
                        token_view.views_of_rows(rows, target_on_llama.tokenizer))


def roofline_table(rows: pd.DataFrame, bytes_read: dict[str, int], bandwidth: float) -> pd.DataFrame:
    """Per AR loop: decode tokens/s (after the first token; median over its rows) against the bound
    bandwidth / bytes of weights read per token, and the share of the bound it reaches."""
    lines = []
    for decoder, weights in bytes_read.items():
        rate = float(metrics.decode_tokens_per_second(rows[rows.decoder == decoder]).median())
        bound = bandwidth / weights
        lines.append({"decoder": decoder, "bytes_read_per_token_mb": weights / 2**20, "bandwidth_gb_s": bandwidth / 1e9,
                      "decode_tokens_per_second": rate, "bound_tokens_per_second": bound, "fraction_of_bound": rate / bound})
    return pd.DataFrame(lines)


def engine_ar(methods: list[Method], method: Method) -> Method:
    """The kit's AR on `method`'s engine and target weights: the reference it must equal."""
    quantization = method.weights.quantization if method.weights else None
    found = [m for m in methods if m.role == "target AR" and m.implementation == "ours" and m.engine == method.engine
             and (quantization is None or m.weights is None or m.weights.quantization == quantization)]
    if len(found) != 1:
        raise ValueError(f"expected one AR of the kit on {method.engine} with {quantization} weights for "
                         f"{method.name!r}, found {[m.name for m in found]}")
    return found[0]


def per_kind_table(rows: pd.DataFrame, methods: list[Method]) -> pd.DataFrame:
    """Per (kind, method): speedup over llama.cpp's own AR (per-token time, geometric mean over
    prompts, 95% interval), decode tokens/s, and token agreement with the AR of the method's engine."""
    frames = []
    for kind, group in rows.groupby("category", sort=False):
        table = metrics.summary(group, baseline=PEER_AR).reset_index()
        for method in methods:
            reference = engine_ar(methods, method).name
            agreement = metrics.add_agreement(group[group.decoder == method.name], reference_decoder=None,
                                              reference=metrics.reference_tokens(group, reference))
            table.loc[table.decoder == method.name, "agreement_with_engine_ar"] = agreement.agreement.mean()
        table["decode_tokens_per_second"] = table.decoder.map(  # after the first step: see the metric
            group.assign(rate=metrics.tokens_per_second_after_first_step(group)).groupby("decoder").rate.median())
        frames.append(table.assign(category=kind))
    table = pd.concat(frames, ignore_index=True)
    engine = {m.name: m.engine for m in methods}
    implementation = {m.name: m.implementation for m in methods}
    return table.assign(engine=table.decoder.map(engine), implementation=table.decoder.map(implementation))


def best_table(per_kind: pd.DataFrame, methods: list[Method]) -> pd.DataFrame:
    """Per kind: the kit's fastest configuration that equals its engine's AR on every prompt, over
    both engines (the highest point estimate: its interval is not adjusted for the choice), and
    llama.cpp's own prompt lookup, both over llama.cpp's AR."""
    ours = {m.name for m in methods if m.implementation == "ours" and m.role != "target AR"}
    lookup = next(m.name for m in methods if m.implementation == "llama.cpp" and m.source is not None)
    lines = []
    for kind, group in per_kind.groupby("category", sort=False):
        exact = group[group.decoder.isin(ours) & (group.agreement_with_engine_ar >= 0.999)]
        best = exact.loc[exact.speedup.idxmax()] if not exact.empty else None
        theirs = group[group.decoder == lookup].iloc[0]
        none = {"speedup": float("nan"), "speedup_low": float("nan"), "speedup_high": float("nan"), "prompts": 0}
        lines.append({"category": kind, "best": None if best is None else best.decoder,
                      **(metrics.Speedup.from_line(best).columns("speedup") if best is not None else none),
                      "llama_cpp_lookup": theirs.speedup, "llama_cpp_lookup_low": theirs.speedup_low,
                      "llama_cpp_lookup_high": theirs.speedup_high, "llama_cpp_lookup_prompts": theirs.prompts})
    return pd.DataFrame(lines)


def predicted_table(rows: pd.DataFrame, methods: list[Method], curves: pd.DataFrame) -> pd.DataFrame:
    """The cost model against the measurement, per kind and engine, for the kit's draft model and
    prompt lookup: Leviathan's expected tokens per step from the measured acceptance alpha, each
    step priced at the engine's T(proposed + 1) plus the draft's steps, over the engine's AR step
    T(1), the first step (it runs with the prefill) left out; measured: tokens per second after the
    first step, over the kit's AR on the same engine (the same basis: neither counts the first step)."""
    from specdec_lab import cost_model

    lines = []
    for kind, group in rows.groupby("category", sort=False):
        decode_rate = (group.assign(rate=metrics.tokens_per_second_after_first_step(group))
                       .groupby(["decoder", "prompt_id"]).rate.median())
        for method in methods:
            if method.implementation != "ours" or method.source is None or method.source.kind not in ("draft model", "prompt lookup"):
                continue
            curve = curves[(curves.engine == method.engine) & (curves.model_role == "target")].set_index("n").ms_fit
            draft_curve = curves[(curves.engine == method.engine) & (curves.model_role == "draft")].set_index("n").ms_fit
            draft_ms = float(draft_curve.loc[1]) if method.source.kind == "draft model" else 0.0
            mine = group[group.decoder == method.name]
            alpha = cost_model.acceptance_alpha(mine.accepted_per_step.tolist(), mine.proposed_per_step.tolist())
            # the first step runs with the prefill, inside the time to first token the measurement leaves out
            proposed = [n for steps in mine.proposed_per_step for n in steps[1:]]
            tokens = sum(cost_model.expected_tokens_per_step(alpha, n) if n else 1.0 for n in proposed)
            cost = sum(cost_model.cost_at(curve, n + 1) + n * draft_ms for n in proposed)
            predicted = tokens * float(curve.loc[1]) / cost
            ar_name = engine_ar(methods, method).name
            measured = metrics.over_prompts((decode_rate[method.name] / decode_rate[ar_name]).dropna())
            lines.append({"category": kind, "decoder": method.name, "engine": method.engine, "alpha": alpha,
                          "mean_proposed": sum(proposed) / max(len(proposed), 1), "predicted": predicted,
                          **measured.columns("measured"), "error": predicted / measured.value - 1})
    return pd.DataFrame(lines)


def first_differences(rows: pd.DataFrame, methods: list[Method]) -> pd.DataFrame:
    """Every generation of a kit method whose text parts from its engine's AR: where it parts and the
    two tokens there. On llama.cpp a verify pass over n tokens runs batched matrix kernels where AR
    runs one-row kernels; their sums round differently, so near-ties can flip."""
    lines = []
    for method in methods:
        if method.implementation != "ours" or method.role == "target AR":
            continue
        reference = metrics.reference_tokens(rows, engine_ar(methods, method).name)
        for row in rows[rows.decoder == method.name].itertuples():
            expected = reference.get(row.prompt_id)
            position = common_prefix_length(expected, row.tokens)
            if position < min(len(expected), len(row.tokens)):
                lines.append({"decoder": method.name, "engine": method.engine, "prompt_id": row.prompt_id,
                              "category": row.category, "position": position, "ar_token": expected[position],
                              "method_token": row.tokens[position]})
    return pd.DataFrame(lines, columns=["decoder", "engine", "prompt_id", "category", "position", "ar_token",
                                        "method_token"])
