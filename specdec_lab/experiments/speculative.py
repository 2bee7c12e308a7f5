"""Notebook 02: speculative decoding. Every method of the line-up side by side against AR of the
target, the draft-length sweep against Leviathan's prediction, and the fp32 control that checks
each declared-lossless method reproduces AR greedy token for token."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace

import pandas as pd

from specdec_lab import cost_model, data, hardware, metrics, models, token_view, words
from specdec_lab.decoders import suffix
from specdec_lab.experiments import common, lineups, picker
from specdec_lab.experiments.speculative_tables import (Picked, Tables, by_category, constant_k_of, focus_category,
                                                        per_category, picked_vs_measured, suffix_vs_peer,
                                                        the_draft_model_pair, tree_vs_chain)
from specdec_lab.experiments.speculative_words import headline
from specdec_lab.decoders.candidates import PromptLookupCandidates
from specdec_lab.decoders.suffix import SuffixCandidates, SuffixTrie
from specdec_lab.method import HybridSettings, SuffixSettings, TreeSettings, shape_label
from specdec_lab.metrics import Speedup
from specdec_lab.runs import bench, jsonl

NOTEBOOK = "02_speculative"


# Each prompt set is one kind of text: MT-bench's own eight categories would hold 1-2 of the ten
# prompts each, too few for an interval, so its prompts count as "chat".
KIND_OF_SET = {"humaneval": "code", "mtbench": "chat"}


def prompts_of(params: dict, per_set: int) -> list[data.Prompt]:
    """`per_set` prompts of each prompt set, labelled with the set's kind of text."""
    return [replace(p, category=KIND_OF_SET.get(name, p.category))
            for name in params["prompt_sets"] for p in data.load_prompts(name, per_set, seed=params["seed"])]


def run(params: dict) -> Tables:
    """The line-up side by side (with the k sweep on its first prompts), then (with `fp32_control`)
    the fp32 control. The bf16 models are gone by the time the fp32 ones load: `measure` holds the
    only references."""
    tables = measure(params)
    if params["fp32_control"]:
        tables.control = fp32_control(params, tables.picked.hybrid_settings if tables.picked else None,
                                      trees(params, tables.picked))
    return tables


def measure(params: dict) -> Tables:
    if params["picker_prompts"]:
        calibration_prompts(params)  # enough prompts left for the picker? Say so before loading anything
    dtype, device = params["dtype"], params["device"]
    # with dtype 'auto': the target on the path fastest at verifying (multi-token forwards), the draft
    # on the one fastest at drafting (one-token forwards)
    target = models.load(params["target"], dtype, device, multi_token=True)
    draft = models.load(params["draft"], dtype, device)
    models.check_same_tokenizer(target.tokenizer, draft.tokenizer, params["target"], params["draft"])
    universal = models.load(params["universal_draft"], dtype, device) if params["universal_draft"] else None
    print(f"target {params['target']} in {target.precision}, draft {params['draft']} in {draft.precision}"
          + (" (dtype auto: the target on the torch path measured fastest at multi-token forwards, the draft at "
             "one-token steps; notebook 03 sets the paths side by side)" if dtype == "auto" else ""))
    prompts = prompts_of(params, params["num_prompts"])
    print(f"{len(prompts)} prompts:", ", ".join(f"{p.id} ({p.category})" for p in prompts))
    c = draft_cost_ratio(target, draft) if params["hybrid"] or params["sweep_prompts"] or params["picker_prompts"] else None
    prefill_ratio = draft_prefill_ratio(target, draft) if params["hybrid"] or params["picker_prompts"] else 0.0
    picked = pick(params, target, draft, c, prefill_ratio) if params["picker_prompts"] else None

    methods = lineups.speculative_methods(target, draft, params["k"], params["max_new_tokens"],
                                          prompt_lookup_k=params["prompt_lookup_k"], universal_draft=universal,
                                          transformers_defaults=params["transformers_defaults"],
                                          lossy=params["draft_then_score"], schedules=params["schedules"],
                                          hybrid_cost_ratio=c if params["hybrid"] else None,
                                          hybrid_settings=picked.hybrid_settings if picked else None,
                                          hybrid_prefill_ratio=prefill_ratio, **trees(params, picked))
    # The k sweep runs on the first `sweep_prompts` of each set (none: no sweep), in the same units as
    # the line-up: its speedups share the line-up's AR rows instead of timing an AR of their own.
    names = {m.name for m in methods}
    sweep_methods = [m for m in lineups.k_sweep(target, draft, swept_k(params), params["max_new_tokens"])
                     if m.name not in names]
    sweep_ids = {p.id for p in prompts_of(params, params["sweep_prompts"])} if sweep_methods else set()
    all_rows = bench.run([*methods, *sweep_methods], prompts, target.tokenizer,
                         out=common.results_file(params, NOTEBOOK, "methods.jsonl"), repeats=params["repeats"],
                         warmup=params["warmup"], desc="methods", only_on={m.name: sweep_ids for m in sweep_methods},
                         # the picker's choice of hybrid settings is part of what these rows measured
                         config={**params, **hybrid_config(picked.hybrid_settings if picked else None),
                                 **tree_config(picked), **common.precisions(target=target, draft=draft)})
    rows = metrics.add_agreement(all_rows[all_rows.decoder.isin(names)], reference_decoder=lineups.TARGET_AR)
    table = metrics.summary(rows, baseline=lineups.TARGET_AR)
    ours, theirs = the_draft_model_pair(methods, params["k"], params["schedules"][0])
    lossy = [m.name for m in methods if not m.lossless]
    first = rows[(rows.prompt_id == prompts[0].id) & (rows.repeat == 0)].set_index("decoder").text
    texts = first[[lineups.TARGET_AR, ours, *lossy]]
    acceptance = metrics.acceptance_by_position(rows[rows.implementation == "ours"])

    sweep = None
    if sweep_methods:
        sweep = metrics.k_sweep(all_rows[all_rows.prompt_id.isin(sweep_ids)],
                                constant_k_of([*methods, *sweep_methods], params["k_values"]), lineups.TARGET_AR, c)

    tables = Tables(rows, table, by_category(rows), focus_category(rows), ours, theirs, lossy, texts, acceptance,
                    sweep, None)
    if picked is not None:
        picked.table = picked_vs_measured(picked.table, same_prompt_check(params, picked, target, draft, all_rows),
                                          all_rows)
        tables.picked = picked
    tables.per_category = per_category(tables)
    tables.trees = tree_vs_chain(rows, tables.by_category, picked) if params["tree_nodes"] or params["suffix_k"] else None
    tables.suffix = suffix_vs_peer(rows)
    tables.token_views = token_view.views_of_rows(rows, target.tokenizer)
    tables.names = words.short_names(rows)
    common.write_outputs(params, NOTEBOOK, common.summary_lines(table, methods), headline(tables),
                         model=params["target"], dtype=target.precision)
    return tables


def swept_k(params: dict) -> list[int]:
    """The constant k values this run measures: `k_values` when the k sweep runs, else none (the
    picker then predicts only sources the line-up measures)."""
    return params["k_values"] if params["sweep_prompts"] else []


def calibration_prompts(params: dict) -> list[data.Prompt]:
    """The `picker_prompts` prompts that follow the line-up's in each set: the picker calibrates on
    prompts the line-up never runs."""
    lineup = {p.id for p in prompts_of(params, params["num_prompts"])}
    held_out = [p for p in prompts_of(params, params["num_prompts"] + params["picker_prompts"]) if p.id not in lineup]
    missing = sorted({p.category for p in prompts_of(params, 1)} - {p.category for p in held_out})
    if missing:
        raise ValueError(f"picker_prompts: no prompt of {missing} is left after the line-up's num_prompts="
                         f"{params['num_prompts']}; lower num_prompts, or set picker_prompts: 0 (no picker)")
    return held_out


def pick(params: dict, target: models.LoadedModel, draft: models.LoadedModel, c: float,
         prefill_ratio: float = 0.0) -> Picked:
    """The draft picker on held-out calibration prompts: the target's greedy output and AR times,
    the draft's teacher-forced agreement, T(n) of the target; then every source's predicted speedup
    per category, and the hybrid's defaults (the settings predicted fastest). Saved, so a resumed
    run keeps the same hybrid (and its rows)."""
    saved = common.results_file(params, NOTEBOOK, "picker.json")
    key = jsonl.config_hash(params)
    if saved.exists():
        found = json.loads(saved.read_text())
        # a picker.json from before the source records (no source columns), or from before the hybrid drafted the
        # picker's tree (no `draft_tree` in its settings), is computed again
        if (found.get("key") == key and "source_kind" in (found.get("table") or [{}])[0]
                and "draft_tree" in found.get("hybrid_settings", {})):
            print(f"draft picker: resumed from {saved}")
            return Picked.from_json(found)
    prompts = calibration_prompts(params)
    calibrations = picker.calibrate(target.model, draft.model, prompts, target.tokenizer, params["max_new_tokens"])
    agreement = picker.draft_agreement(calibrations)
    costs = picker.measure_costs(target.model, c, max_n=max(params["max_new_tokens"], params["tree_nodes"] + 1),
                                 draft=draft.model if params["tree_nodes"] else None, max_draft_n=params["tree_nodes"],
                                 draft_prefill_ratio=prefill_ratio)
    shape = tree_grid = None
    if params["tree_nodes"]:
        shape, tree_grid = picker.size_tree(calibrations, costs, params["tree_nodes"], tree_max_depth(params))
        print(f"draft picker: tree of {len(shape)} nodes sized from T(n) and per-rank acceptance "
              f"{[round(a, 3) for a in picker.rank_acceptance(calibrations)]}: {shape_label(shape)}")
    # the hybrid's draft fills that tree, as the line-up's draft tree does
    settings, grid = picker.choose_hybrid(calibrations, costs, params["k"], params["prompt_lookup_k"], c, agreement,
                                          cost_sized=params["cost_sized"], suffix_k=params["suffix_k"],
                                          suffix=suffix_settings(params),
                                          draft_tree=shape_label(shape) if shape else None)
    cut_by = costs.relative_target if params["cost_sized"] else None
    listed = [*picker.candidates(swept_k(params), params["k"], params["prompt_lookup_k"], c, settings,
                                 prefill_cost_ratio=prefill_ratio, relative_target=cut_by,
                                 suffix_k=params["suffix_k"], suffix=suffix_settings(params)),
              *picker.tree_candidates(shape, params["prompt_lookup_k"], lookup_tree(params),
                                      suffix_k=params["suffix_k"], suffix=suffix_settings(params),
                                      relative_target=cut_by)]
    table = picker.per_category(picker.predict(calibrations, listed, costs))
    print(f"draft picker: {len(prompts)} calibration prompts, draft agreement (teacher-forced) {agreement:.3f}, "
          f"hybrid settings {settings}")
    picked = Picked([p.id for p in prompts], agreement, costs, settings, grid, table, picker.recommend(table),
                    shape, tree_grid, picker.rank_acceptance(calibrations) if shape else None)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps({"key": key, **picked.to_json()}, indent=1))
    return picked


def same_prompt_check(params: dict, picked: Picked, target: models.LoadedModel, draft: models.LoadedModel,
                      all_rows: pd.DataFrame) -> pd.DataFrame:
    """The picker's model run on the line-up's own prompts, calibrated by the line-up's AR rows
    (its greedy text and times): per (category, source), what it predicts where it is measured.
    Prediction error here is the model's; the held-out prediction adds the prompts' spread."""
    ar_rows = all_rows[(all_rows.decoder == lineups.TARGET_AR) & (all_rows.repeat == 0)]
    prompts = {p.id: p for p in prompts_of(params, params["num_prompts"])}
    calibrations = picker.calibrations_from_rows(ar_rows, prompts, target.tokenizer, draft.model,
                                                 target.model.config.vocab_size, params["max_new_tokens"])
    cut_by = cost_curve(params, picked)
    listed = [*picker.candidates(swept_k(params), params["k"], params["prompt_lookup_k"],
                                 picked.costs.draft_cost_ratio, picked.hybrid_settings,
                                 prefill_cost_ratio=picked.costs.draft_prefill_ratio, relative_target=cut_by,
                                 suffix_k=params["suffix_k"], suffix=suffix_settings(params)),
              *picker.tree_candidates(picked.tree_shape, params["prompt_lookup_k"], lookup_tree(params),
                                      suffix_k=params["suffix_k"], suffix=suffix_settings(params),
                                      relative_target=cut_by)]
    return picker.per_category(picker.predict(calibrations, listed, picked.costs))


def tree_max_depth(params: dict) -> int:
    """The deepest draft tree the picker weighs: twice k, as deep as prompt lookup's longest proposal."""
    return 2 * params["k"]


def lookup_tree(params: dict) -> TreeSettings | None:
    """The prompt-lookup tree: `tree_branches` matches merged within `tree_nodes` nodes (either 0: none)."""
    return TreeSettings(params["tree_nodes"], params["tree_branches"]) if params["tree_nodes"] and params["tree_branches"] else None


def suffix_settings(params: dict) -> SuffixSettings:
    return SuffixSettings(spec_factor=float(params["suffix_spec_factor"]))


def cost_curve(params: dict, picked: Picked | None):
    """The target's T(n) / T(1) our model-free sources (prompt lookup, the hybrid, suffix decoding) cut their
    proposals by, with `cost_sized` (the picker's measured curve); None: uncut."""
    return picked.costs.relative_target if params["cost_sized"] and picked is not None else None


def trees(params: dict, picked: Picked | None) -> dict:
    """The line-up's token trees: the picker's draft tree, the prompt-lookup tree, and suffix decoding's
    (`suffix_k` nodes a step, 0: none; at most `suffix_spec_factor` x the match length), with its path
    (`suffix_path`) and arctic-inference's tree beside ours (`suffix_peer`) where `make arctic` has built it;
    with `cost_sized`, every suffix proposal is cut to the nodes worth verifying at the picker's T(n)."""
    peer = bool(params["suffix_peer"] and params["suffix_k"])
    if peer and not suffix.arctic_available():
        print(f"arctic-inference's suffix tree is not built here (`make arctic`, which `make reproduce` runs, builds "
              f"it from {suffix.ARCTIC_PACKAGE}): its suffix-decoding rows are left out")
        peer = False
    return {"tree_shape": picked.tree_shape if picked else None, "lookup_tree": lookup_tree(params),
            "suffix_k": params["suffix_k"], "suffix": suffix_settings(params),
            "suffix_path": params["suffix_path"], "suffix_peer": peer,
            "relative_target": cost_curve(params, picked)}


def tree_config(picked: Picked | None) -> dict:
    """What the rows' configuration records of the picker's draft tree (its shape is part of what they measured)."""
    return {"tree_shape": shape_label(picked.tree_shape)} if picked is not None and picked.tree_shape else {}


def draft_cost_ratio(target: models.LoadedModel, draft: models.LoadedModel) -> float:
    """c = draft step / target step: T(1) of each after a 100-token prefix, the two timed in turn (median of 15 each,
    `hardware.interleaved_forward_costs`), on this machine now. Leviathan's prediction for the k sweep, the picker and
    the hybrid candidate source use it: where the draft is near break-even, an error in c decides whether it drafts."""
    draft_ms, target_ms = hardware.interleaved_forward_costs([(draft.model, 1), (target.model, 1)], prefix_tokens=100)
    print(f"draft cost ratio c = {draft_ms:.1f} ms / {target_ms:.1f} ms = {draft_ms / target_ms:.3f}")
    return draft_ms / target_ms


def draft_prefill_ratio(target: models.LoadedModel, draft: models.LoadedModel, tokens: int = 64) -> float:
    """The draft's prefill per token over the target's AR step: a forward of the draft over `tokens` tokens after a
    100-token prefix, per token, over T(1) of the target, the two timed in turn (median of 7 each). The hybrid charges
    the draft's catch-up (its first prefill of the prompt) at this rate."""
    draft_ms, target_ms = hardware.interleaved_forward_costs([(draft.model, tokens), (target.model, 1)],
                                                             prefix_tokens=100, repeats=7)
    print(f"draft prefill: {draft_ms / tokens:.1f} ms a token = {draft_ms / tokens / target_ms:.3f} target steps")
    return draft_ms / tokens / target_ms


def hybrid_config(settings: HybridSettings | None) -> dict:
    """What the rows' configuration records of the hybrid's settings (nothing without a picker)."""
    return {"hybrid_settings": asdict(settings)} if settings is not None else {}


def fp32_control(params: dict, hybrid_settings: HybridSettings | None = None, tree_settings: dict | None = None
                 ) -> pd.DataFrame:
    """Every declared-lossless method of the line-up in fp32, against AR greedy of the fp32 target.

    Lossless is a property of the decoder, not of the pair: `control_target` and `control_draft`
    (default: the line-up's) can name a smaller pair, whose draft may be quantized and in another
    dtype (only the target's arithmetic decides the output), so the control fits a CPU budget. The
    hybrid runs with the line-up's settings (`hybrid_settings`, the picker's choice), the trees with the
    line-up's shapes (`tree_settings`)."""
    target_spec = params["control_target"] or params["target"]
    draft_spec = params["control_draft"] or params["draft"]
    draft_quantization = params["control_draft_quantization"]
    target = models.load(target_spec, dtype="float32", device=params["device"])
    draft = models.load(draft_spec, dtype=params["control_draft_dtype"], device=params["device"],
                        quantization=draft_quantization)
    models.check_same_tokenizer(target.tokenizer, draft.tokenizer, target_spec, draft_spec)
    print(f"fp32 control: target {target_spec} (float32), draft {draft_spec} "
          f"({params['control_draft_dtype']}, quantization {draft_quantization})")
    methods = lineups.speculative_methods(target, draft, params["k"], params["control_max_new_tokens"],
                                          prompt_lookup_k=params["prompt_lookup_k"], lossy=False,
                                          transformers_defaults=params["transformers_defaults"],
                                          schedules=params["schedules"],
                                          hybrid_cost_ratio=draft_cost_ratio(target, draft) if params["hybrid"] else None,
                                          hybrid_settings=hybrid_settings, **(tree_settings or {}),
                                          hybrid_prefill_ratio=draft_prefill_ratio(target, draft) if params["hybrid"] else 0.0)
    prompts = prompts_of(params, params["control_prompts"])
    control = bench.run(methods, prompts, target.tokenizer, out=common.results_file(params, NOTEBOOK, "fp32_control.jsonl"),
                        repeats=1, warmup=0, desc="fp32 control",
                        config={**params, **hybrid_config(hybrid_settings),
                                **({"tree_shape": shape_label(tree_settings["tree_shape"])}
                                   if tree_settings and tree_settings.get("tree_shape") else {})})
    return metrics.add_agreement(control, lineups.TARGET_AR)


def newest_complete_rows(results_dir: str) -> pd.DataFrame:
    """The newest run's rows in `results_dir`, its complete prompts only, with agreement against AR."""
    path = common.results_file({"results_dir": results_dir}, NOTEBOOK, "methods.jsonl")
    rows = jsonl.read(path)
    if not rows:
        raise FileNotFoundError(f"no rows in {path}: run notebook 02 first")
    newest = [row for row in rows if row["run_id"] == rows[-1]["run_id"]]
    # the line-up runs on every prompt; the k sweep's extra rows on the first few only
    prompts_of_decoder: dict[str, set] = {}
    for row in newest:
        prompts_of_decoder.setdefault(row["decoder"], set()).add(row["prompt_id"])
    every = max(len(ids) for ids in prompts_of_decoder.values())
    names = [name for name, ids in prompts_of_decoder.items() if len(ids) == every]
    complete = [row for unit in bench.complete_units([r for r in newest if r["decoder"] in names], names).values()
                for row in unit]
    return metrics.add_agreement(pd.DataFrame(complete), reference_decoder=lineups.TARGET_AR)


def markdown_by_category(results_dir: str) -> str:
    """The per-category table of the newest run in `results_dir` (its complete prompts only): what
    `python -m specdec_lab.experiments.speculative results/cpu` prints for the README."""
    table = by_category(newest_complete_rows(results_dir))
    return words.markdown_table(readme_columns(table), {"tokens/s": ".2f", "tokens per target forward": ".2f",
                                                        "agreement with greedy": ".2f"})


def markdown_trees(results_dir: str) -> str:
    """Tree ÷ chain per kind of text and source from the newest run (measured; the picker's
    predictions are in the notebook): `python -m specdec_lab.experiments.speculative results/cpu --trees`."""
    rows = newest_complete_rows(results_dir)
    table = tree_vs_chain(rows, by_category(rows))
    if table.empty:
        raise ValueError(f"no tree methods in the newest run of {results_dir}: run notebook 02 with tree_nodes > 0")
    return words.markdown_table(pd.DataFrame({
        "kind of text": table.category, "source": table.source_kind,
        "tree ÷ chain (95% CI)": [words.interval(Speedup.from_line(line), compact=True, prompts=False)
                                  for _, line in table.iterrows()],
        "prompts": table.prompts, "tokens per forward, tree": table.tree_tokens_per_forward,
        "tokens per forward, chain": table.chain_tokens_per_forward}),
        {"tokens per forward, tree": ".2f", "tokens per forward, chain": ".2f"})


SUFFIX_FACTORS = (1.0, 2.0, 4.0)  # vLLM's default spec factor, and more where a longer proposal is nearly free


def model_free_replay(results_dir: str) -> pd.DataFrame:
    """Suffix decoding and prompt lookup replayed on the newest run's AR answers (no model runs: a model-free
    source's acceptance on greedy text is exact), one row per (source, prompt): tokens per target forward,
    and the decode speedup over AR that the run's measured T(n) predicts (the answer's tokens over the
    replayed steps' forward costs, T(proposed + 1) / T(1) each; prefill and proposing left out). The
    sources: our suffix tree at each of `SUFFIX_FACTORS`; ours and arctic-inference's tree (where `make
    arctic` built it) at the run's own settings, uncut and cut to the nodes worth verifying at that T(n);
    ours on the prompt alone; our prompt lookup uncut and cut. Each suffix tree keeps the answers of the
    prompts before, in the run's order. How the CPU profiles' spec factor was chosen, what the earlier
    answers add, what the cut by T(n) gives and whether ours proposes what arctic's does:
    `python -m specdec_lab.experiments.speculative results/cpu --replay`."""
    rows = newest_complete_rows(results_dir)
    config = rows.config.iloc[0]
    ar_rows = rows[(rows.decoder == lineups.TARGET_AR) & (rows.repeat == 0)].set_index("prompt_id")
    prompts = [p for p in prompts_of(config, config["num_prompts"]) if p.id in ar_rows.index]
    tokenizer = models.load_tokenizer(config["target"])
    k = config.get("suffix_k") or 16
    uncut = SuffixSettings(spec_factor=float(config.get("suffix_spec_factor", 1.0)))
    picked = Picked.from_json(json.loads(common.results_file(config, NOTEBOOK, "picker.json").read_text()))
    curve = picked.costs.relative_target  # the run's T(n) / T(1), measured by its picker

    def ours(settings: SuffixSettings, history: SuffixTrie | None = None, cut_by=None):
        return lambda: SuffixCandidates(k, True, settings, history, cut_by)

    def lookup(cut_by=None):
        return lambda: PromptLookupCandidates(config["prompt_lookup_k"], max_ngram=lineups.PROMPT_LOOKUP_NGRAM,
                                              relative_target=cut_by)

    # (label, a fresh source for one prompt); those that keep earlier answers share one history each
    sources = [*((f"ours, factor {factor:g}", ours(replace(uncut, spec_factor=factor), SuffixTrie(uncut.max_depth)))
                 for factor in SUFFIX_FACTORS),
               (f"ours, factor {uncut.spec_factor:g}{lineups.CUT_LABEL}", ours(uncut, SuffixTrie(uncut.max_depth), curve)),
               (f"ours, factor {uncut.spec_factor:g}, the prompt only", ours(uncut))]
    if suffix.arctic_available():
        def arctic(cut_by=None):
            cache = suffix.arctic_cache(uncut.max_depth)  # one history per source, as ours
            return lambda: suffix.ArcticSuffixCandidates(cache, k, True, uncut, cut_by)

        sources += [(f"arctic-inference, factor {uncut.spec_factor:g}", arctic()),
                    (f"arctic-inference, factor {uncut.spec_factor:g}{lineups.CUT_LABEL}", arctic(curve))]
    sources += [(f"prompt lookup k={config['prompt_lookup_k']} (ours)", lookup()),
                (f"prompt lookup k={config['prompt_lookup_k']} (ours){lineups.CUT_LABEL}", lookup(curve))]
    records = []
    for label, make in sources:
        for prompt in prompts:
            answer = list(ar_rows.loc[prompt.id].tokens)
            run = picker.replay(make(), data.encode(tokenizer, prompt, chat=True), answer, config["max_new_tokens"])
            records.append({"source": label, "category": prompt.category, "prompt_id": prompt.id,
                            "tokens_per_target_forward": len(answer) / len(run.proposed),
                            "predicted_decode_speedup": len(answer) / sum(cost_model.cost_at(curve, n + 1)
                                                                          for n in run.proposed)})
    return pd.DataFrame(records)


def replay_table(replayed: pd.DataFrame, value: str) -> pd.DataFrame:
    """One value of the replay per source and kind of text: the mean over prompts of tokens per forward, the
    geometric mean of the predicted speedups."""
    aggregate = "mean" if value == "tokens_per_target_forward" else metrics.geometric_mean
    return replayed.pivot_table(index="source", columns="category", values=value, aggfunc=aggregate, sort=False)


def readme_columns(by_category: pd.DataFrame) -> pd.DataFrame:
    """`by_category` as the README shows it: the speedup with its interval in one column."""
    return pd.DataFrame({
        "kind of text": by_category.category, "method": by_category.method,
        "speedup over AR (95% CI)": [words.interval(Speedup.from_line(line), compact=True, prompts=False)
                                     for _, line in by_category.iterrows()],
        "prompts": by_category.prompts, "tokens/s": by_category.tokens_per_second,
        "tokens per target forward": by_category.tokens_per_target_forward,
        "agreement with greedy": by_category.agreement})


if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[1:] if not argument.startswith("--")]
    folder = arguments[0] if arguments else "results/cpu"
    if "--trees" in sys.argv[1:]:
        print(markdown_trees(folder))
    elif "--replay" in sys.argv[1:]:
        replayed = model_free_replay(folder)
        for value in ("tokens_per_target_forward", "predicted_decode_speedup"):
            table = replay_table(replayed, value)
            print(f"\n{value.replace('_', ' ')}:\n")
            print(words.markdown_table(table.reset_index(), {column: ".2f" for column in table.columns}))
    else:
        print(markdown_by_category(folder))
