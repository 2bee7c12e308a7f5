"""Notebook 02: speculative decoding. Every method of the line-up side by side against AR of the
target, the draft-length sweep against Leviathan's prediction, and the fp32 control that checks
each declared-lossless method reproduces AR greedy token for token."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

import pandas as pd

from specdec_lab import data, hardware, metrics, models
from specdec_lab.experiments import common, lineups, picker
from specdec_lab.runs import bench, jsonl

NOTEBOOK = "02_speculative"


@dataclass
class Tables:
    rows: pd.DataFrame  # every method, with agreement against target AR
    table: pd.DataFrame  # one line per method (metrics.summary), all prompts
    by_category: pd.DataFrame  # one line per (category, method): speedup with its interval and prompt count
    focus: str  # the category the headline speaks of first (code when present)
    ours: str  # our speculative decoder at k
    theirs: str  # transformers' assisted generation at the same k
    lossy: list[str]  # methods declared not lossless
    texts: pd.DataFrame  # the first prompt's texts of target AR, ours and the lossy methods
    acceptance: pd.DataFrame  # acceptance by draft position, our speculative methods
    sweep: pd.DataFrame | None  # k sweep: one row per (k, prompt, repeat), measured and predicted
    control: pd.DataFrame | None  # fp32 control: one row per (method, prompt)
    picked: "Picked | None" = None  # the draft picker's predictions, checked against the measured rows
    per_category: pd.DataFrame | None = None  # per category: our best, the hybrid, the pick, transformers' best


@dataclass
class Picked:
    """What the draft picker predicted from its calibration prompts (held out from the line-up),
    before the line-up ran; `table` gains the measured speedups and a same-prompt check after it."""

    calibration_prompts: list[str]
    draft_agreement: float  # teacher-forced, per position
    costs: picker.Costs
    hybrid_settings: dict  # the hybrid's defaults, chosen by predicted speedup
    hybrid_grid: pd.DataFrame  # every hybrid setting weighed, with its predicted speedups
    table: pd.DataFrame  # per (category, source): predicted, then measured where the line-up ran it
    recommended: pd.DataFrame  # per category: our source with the highest predicted speedup

    def to_json(self) -> dict:
        return {"calibration_prompts": self.calibration_prompts, "draft_agreement": self.draft_agreement,
                "relative_target": {int(n): float(v) for n, v in self.costs.relative_target.items()},
                "draft_cost_ratio": self.costs.draft_cost_ratio, "hybrid_settings": self.hybrid_settings,
                **{name: getattr(self, name).to_dict("records") for name in ("hybrid_grid", "table", "recommended")}}

    @classmethod
    def from_json(cls, saved: dict) -> "Picked":
        costs = picker.Costs(pd.Series({int(n): v for n, v in saved["relative_target"].items()}),
                             saved["draft_cost_ratio"])
        return cls(saved["calibration_prompts"], saved["draft_agreement"], costs, saved["hybrid_settings"],
                   *(pd.DataFrame(saved[name]) for name in ("hybrid_grid", "table", "recommended")))


# Each prompt set is one kind of text: MT-bench's own eight categories would hold 1-2 of the ten
# prompts each, too few for an interval, so its prompts count as "chat".
KIND_OF_SET = {"humaneval": "code", "mtbench": "chat"}


def prompts_of(params: dict, per_set: int) -> list[data.Prompt]:
    """`per_set` prompts of each prompt set, labelled with the set's kind of text."""
    return [replace(p, category=KIND_OF_SET.get(name, p.category))
            for name in params["prompt_sets"] for p in data.load_prompts(name, per_set, seed=params["seed"])]


def focus_category(rows: pd.DataFrame) -> str:
    """The category the headline speaks of: code when there is code, else the first one."""
    return "code" if (rows.category == "code").any() else rows.category.iloc[0]


def run(params: dict) -> Tables:
    """The line-up side by side (with the k sweep on its first prompts), then (with `fp32_control`)
    the fp32 control. The bf16 models are gone by the time the fp32 ones load: `measure` holds the
    only references."""
    tables = measure(params)
    if params["fp32_control"]:
        tables.control = fp32_control(params, tables.picked.hybrid_settings if tables.picked else None)
    return tables


def measure(params: dict) -> Tables:
    if params["picker_prompts"]:
        calibration_prompts(params)  # enough prompts left for the picker? Say so before loading anything
    dtype, device = params["dtype"], params["device"]
    target, draft = models.load(params["target"], dtype, device), models.load(params["draft"], dtype, device)
    models.check_same_tokenizer(target.tokenizer, draft.tokenizer, params["target"], params["draft"])
    universal = models.load(params["universal_draft"], dtype, device) if params["universal_draft"] else None
    prompts = prompts_of(params, params["num_prompts"])
    print(f"{len(prompts)} prompts:", ", ".join(f"{p.id} ({p.category})" for p in prompts))
    c = draft_cost_ratio(target, draft) if params["hybrid"] or params["sweep_prompts"] or params["picker_prompts"] else None
    picked = pick(params, target, draft, c) if params["picker_prompts"] else None

    methods = lineups.speculative_methods(target, draft, params["k"], params["max_new_tokens"],
                                          prompt_lookup_k=params["prompt_lookup_k"], universal_draft=universal,
                                          transformers_defaults=params["transformers_defaults"],
                                          lossy=params["draft_then_score"], schedules=params["schedules"],
                                          hybrid_cost_ratio=c if params["hybrid"] else None,
                                          hybrid_settings=picked.hybrid_settings if picked else None)
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
                         config={**params, **({"hybrid_settings": picked.hybrid_settings} if picked else {})})
    rows = metrics.add_agreement(all_rows[all_rows.decoder.isin(names)], reference_decoder=lineups.TARGET_AR)
    table = metrics.summary(rows, baseline=lineups.TARGET_AR)
    schedule = params["schedules"][0]
    ours, theirs = (next(m.name for m in methods if m.implementation == implementation and m.params.get("k") == params["k"]
                         and m.params.get("schedule") == schedule and m.params.get("source") == "draft model")
                    for implementation in ("ours", "transformers"))
    lossy = [m.name for m in methods if not m.lossless]
    first = rows[(rows.prompt_id == prompts[0].id) & (rows.repeat == 0)].set_index("decoder").text
    texts = first[[lineups.TARGET_AR, ours, *lossy]]
    acceptance = metrics.acceptance_by_position(rows[rows.implementation == "ours"])

    sweep = None
    if sweep_methods:
        k_of = {m.name: m.params["k"] for m in [*methods, *sweep_methods]
                if m.implementation == "ours" and m.params.get("source") == "draft model"
                and m.params.get("schedule") == "constant" and m.params["k"] in params["k_values"]}
        sweep = metrics.k_sweep(all_rows[all_rows.prompt_id.isin(sweep_ids)], k_of, lineups.TARGET_AR, c)

    tables = Tables(rows, table, by_category(rows), focus_category(rows), ours, theirs, lossy, texts, acceptance,
                    sweep, None)
    if picked is not None:
        picked.table = picked_vs_measured(picked.table, same_prompt_check(params, picked, target, draft, all_rows),
                                          all_rows)
        tables.picked = picked
    tables.per_category = per_category(tables)
    common.write_outputs(params, NOTEBOOK, common.summary_lines(table, methods), headline(tables),
                         model=params["target"], dtype=params["dtype"])
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


def pick(params: dict, target: models.LoadedModel, draft: models.LoadedModel, c: float) -> Picked:
    """The draft picker on held-out calibration prompts: the target's greedy output and AR times,
    the draft's teacher-forced agreement, T(n) of the target; then every source's predicted speedup
    per category, and the hybrid's defaults (the settings predicted fastest). Saved, so a resumed
    run keeps the same hybrid (and its rows)."""
    saved = common.results_file(params, NOTEBOOK, "picker.json")
    key = jsonl.config_hash(params)
    if saved.exists():
        found = json.loads(saved.read_text())
        if found.get("key") == key:
            print(f"draft picker: resumed from {saved}")
            return Picked.from_json(found)
    prompts = calibration_prompts(params)
    calibrations = picker.calibrate(target.model, draft.model, prompts, target.tokenizer, params["max_new_tokens"])
    agreement = picker.draft_agreement(calibrations)
    costs = picker.measure_costs(target.model, c, max_n=params["max_new_tokens"])
    settings, grid = picker.choose_hybrid(calibrations, costs, params["k"], params["prompt_lookup_k"], c, agreement)
    listed = picker.sources(swept_k(params), params["k"], params["prompt_lookup_k"], c, settings)
    table = picker.per_category(picker.predict(calibrations, listed, costs))
    print(f"draft picker: {len(prompts)} calibration prompts, draft agreement (teacher-forced) {agreement:.3f}, "
          f"hybrid settings {settings}")
    picked = Picked([p.id for p in prompts], agreement, costs, settings, grid, table, picker.recommend(table))
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
    listed = picker.sources(swept_k(params), params["k"], params["prompt_lookup_k"],
                            picked.costs.draft_cost_ratio, picked.hybrid_settings)
    return picker.per_category(picker.predict(calibrations, listed, picked.costs))


def measured_key(method_params: dict, implementation: str) -> tuple:
    """How a measured row and a picker source are matched: source, k, schedule, implementation."""
    schedule = method_params.get("schedule")
    return method_params.get("source"), method_params.get("k"), schedule if isinstance(schedule, str) else None, implementation


def picked_vs_measured(predicted: pd.DataFrame, same_prompts: pd.DataFrame, all_rows: pd.DataFrame) -> pd.DataFrame:
    """The picker's per-category predictions (from held-out calibration prompts, and on the line-up's
    own prompts) beside the measured speedup of the same source (the line-up's rows, or the k
    sweep's on its prompts) with its interval, and each prediction's relative error."""
    speed = metrics.speedups(all_rows, lineups.TARGET_AR)
    keys = {decoder: measured_key(p, impl) for decoder, p, impl in
            all_rows[["decoder", "method_params", "implementation"]].drop_duplicates("decoder").itertuples(index=False)}
    speed["key"] = speed.decoder.map(keys)
    same = same_prompts.set_index(["category", "source"]).predicted_speedup
    records = []
    for line in predicted.itertuples():
        key = measured_key({"source": line.kind, "k": int(line.k), "schedule": line.schedule}, line.implementation)
        measured = speed[(speed.category == line.category) & speed.key.map(lambda found: found == key)]
        per_prompt = measured.groupby("prompt_id").speedup.median()
        low, high = metrics.bootstrap_interval(per_prompt)
        records.append({"predicted_same_prompts": same.get((line.category, line.source), float("nan")),
                        "measured_as": measured.decoder.iloc[0] if len(measured) else None,
                        "speedup": metrics.geometric_mean(per_prompt), "speedup_low": low, "speedup_high": high,
                        "measured_prompts": len(per_prompt)})
    table = pd.concat([predicted.reset_index(drop=True), pd.DataFrame(records)], axis=1)
    table["error"] = table.predicted_speedup / table.speedup - 1
    table["error_same_prompts"] = table.predicted_same_prompts / table.speedup - 1
    return table


def per_category_markdown(table: pd.DataFrame) -> str:
    """`per_category` as a Markdown table (its cells are sentences, too wide for a DataFrame's repr)."""
    lines = ["| kind of text | " + " | ".join(table.columns) + " |", "|---" * (len(table.columns) + 1) + "|"]
    lines += [f"| {category} | " + " | ".join(str(v) if isinstance(v, str) else "-" for v in row) + " |"
              for category, row in table.iterrows()]
    return "\n".join(lines)


def per_category(tables: Tables) -> pd.DataFrame:
    """Per category, measured with intervals: our fastest lossless method, the hybrid, transformers'
    fastest, and the picker's recommendation with what it predicted."""
    lines = tables.by_category.merge(
        tables.rows.drop_duplicates("decoder")[["decoder", "implementation", "lossless", "method_params"]],
        left_on="method", right_on="decoder")
    lines = lines[lines.lossless & (lines.method != lineups.TARGET_AR)]
    records = []
    for category, group in lines.groupby("category", sort=False):
        record = {"category": category}
        hybrid = group[group.method_params.map(lambda p: p.get("source") == "hybrid")]
        for label, part in (("our best", group[group.implementation == "ours"]), ("hybrid", hybrid),
                            ("transformers' best", group[group.implementation == "transformers"])):
            if len(part):
                best = part.loc[part.speedup.idxmax()]
                record[label] = f"{best.method}: {interval(best.speedup, best.speedup_low, best.speedup_high, int(best.prompts))}"
        if tables.picked is not None:
            chosen = tables.picked.recommended.set_index("category").loc[category]
            measured = tables.picked.table[(tables.picked.table.category == category)
                                           & (tables.picked.table.source == chosen.source)].iloc[0]
            record["picker's pick"] = (f"{chosen.source}: predicted {chosen.predicted_speedup:.2f}x"
                                       + (f", measured {measured.speedup:.2f}x" if measured.measured_prompts else
                                          ", not in the line-up"))
        records.append(record)
    return pd.DataFrame(records).set_index("category")


def hybrid_targets(tables: Tables, floor: float = 0.97) -> pd.DataFrame:
    """Per category, the hybrid's two targets, measured:
    - against the fastest single lossless method (ours or transformers'): hybrid ÷ that method, per
      prompt side by side (geometric mean, 95% interval); met ("at least the best within the
      interval") when the interval reaches 1, i.e. the hybrid is not shown slower;
    - where nothing helps (no single method's interval lies above 1): the hybrid's speedup over AR,
      met when it is at least `floor`.
    Empty when no hybrid ran."""
    is_hybrid = tables.rows.method_params.map(lambda p: p.get("source") == "hybrid")
    if not is_hybrid.any():
        return pd.DataFrame()
    hybrid = tables.rows[is_hybrid].decoder.iloc[0]
    singles = set(tables.rows[~is_hybrid & tables.rows.lossless & (tables.rows.decoder != lineups.TARGET_AR)].decoder)
    records = []
    for category, group in tables.by_category.groupby("category", sort=False):
        single = group[group.method.isin(singles)]
        best = single.loc[single.speedup.idxmax()]
        mine = group[group.method == hybrid].iloc[0]
        rows = tables.rows[tables.rows.category == category]
        ratio, low, high, prompts = metrics.mean_speedup(rows, hybrid, best.method)
        nothing_helps = bool((single.speedup_low <= 1).all())
        records.append({"category": category, "best single method": best.method,
                        "hybrid / best": ratio, "low": low, "high": high, "prompts": prompts,
                        "not shown slower": bool(high >= 1), "nothing helps": nothing_helps,
                        "hybrid over AR": mine.speedup, "hybrid low": mine.speedup_low, "hybrid high": mine.speedup_high,
                        "floor": floor, "at least the floor": bool(mine.speedup >= floor) if nothing_helps else None})
    return pd.DataFrame(records).set_index("category")


def hybrid_findings(targets: pd.DataFrame) -> str:
    """The hybrid's targets in words, one line per category."""
    lines = []
    for category, row in targets.iterrows():
        line = (f"- **{category}**: hybrid ÷ {row['best single method']} = {row['hybrid / best']:.2f}x "
                f"(95% CI {row.low:.2f}-{row.high:.2f}, {row.prompts} prompts, side by side): "
                + ("**not shown slower than the best single method** (the interval reaches 1)" if row["not shown slower"]
                   else "**below the best single method**"))
        if row["nothing helps"]:
            line += (f". No single method is shown to help here (every interval reaches 1); the hybrid runs at "
                     f"{row['hybrid over AR']:.2f}x AR ({row['hybrid low']:.2f}-{row['hybrid high']:.2f}): "
                     + ("**met**" if row["at least the floor"] else "**missed**") + f" (target ≥ {row.floor}x)")
        lines.append(line + ".")
    return "\n".join(lines)


def picker_findings(tables: Tables, tolerance: float = 0.15) -> str:
    """Per category: the pick and how far the predictions landed from the measured speedups."""
    table = tables.picked.table
    lines = []
    for category, group in table.groupby("category", sort=False):
        chosen = tables.picked.recommended.set_index("category").loc[category]
        checked = group.dropna(subset=["speedup"])
        within = (checked.error.abs() <= tolerance).sum()
        within_same = (checked.error_same_prompts.abs() <= tolerance).sum()
        worst = checked.loc[checked.error.abs().idxmax()] if len(checked) else None
        lines.append(f"- **{category}**: the picker recommends **{chosen.source}** (predicted "
                     f"{chosen.predicted_speedup:.2f}x over AR). Of the {len(checked)} sources the line-up measured, "
                     f"{within} are predicted within {tolerance:.0%} from the held-out calibration prompts and "
                     f"{within_same} on the line-up's own prompts"
                     + (f"; the furthest from held-out prompts is {worst.source}: predicted "
                        f"{worst.predicted_speedup:.2f}x, measured {worst.speedup:.2f}x ({worst.error:+.0%}), "
                        f"{worst.predicted_same_prompts:.2f}x on the same prompts." if worst is not None else "."))
    return "\n".join(lines)


def draft_cost_ratio(target: models.LoadedModel, draft: models.LoadedModel) -> float:
    """c = draft step / target step: T(1) of each after a 100-token prefix, median of 5, on this
    machine now. Leviathan's prediction for the k sweep and the hybrid candidate source use it."""
    cost = [hardware.forward_cost_curve(m.model, [1], prefix_tokens=100, repeats=5).ms.iloc[0] for m in (draft, target)]
    print(f"draft cost ratio c = {cost[0]:.1f} ms / {cost[1]:.1f} ms = {cost[0] / cost[1]:.3f}")
    return cost[0] / cost[1]


def fp32_control(params: dict, hybrid_settings: dict | None = None) -> pd.DataFrame:
    """Every declared-lossless method of the line-up in fp32, against AR greedy of the fp32 target.

    Lossless is a property of the decoder, not of the pair: `control_target` and `control_draft`
    (default: the line-up's) can name a smaller pair, whose draft may be quantized and in another
    dtype (only the target's arithmetic decides the output), so the control fits a CPU budget. The
    hybrid runs with the line-up's settings (`hybrid_settings`, the picker's choice)."""
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
                                          hybrid_settings=hybrid_settings)
    prompts = prompts_of(params, params["control_prompts"])
    control = bench.run(methods, prompts, target.tokenizer, out=common.results_file(params, NOTEBOOK, "fp32_control.jsonl"),
                        repeats=1, warmup=0, desc="fp32 control",
                        config={**params, **({"hybrid_settings": hybrid_settings} if hybrid_settings else {})})
    return metrics.add_agreement(control, lineups.TARGET_AR)


def control_mismatches(control: pd.DataFrame) -> pd.DataFrame:
    """The fp32 samples of declared-lossless methods that differ from AR greedy (empty = all exact)."""
    return control[control.lossless & ~control.full_match.astype(bool)]


def by_category(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (category, method): the per-token speedup over AR with its 95% interval and prompt count,
    tokens per target forward and agreement. No single method wins on every kind of text."""
    frames = []
    for category, group in rows.groupby("category", sort=False):
        table = metrics.summary(group, baseline=lineups.TARGET_AR)
        frames.append(table[["speedup", "speedup_low", "speedup_high", "prompts", "tokens_per_second",
                             "tokens_per_target_forward", "agreement"]].reset_index().assign(category=category))
    return pd.concat(frames, ignore_index=True).rename(columns={"decoder": "method"})


def interval(value: float, low: float, high: float, prompts: int) -> str:
    """'1.52x (95% CI 1.31-1.74, 10 prompts)'."""
    return f"{value:.2f}x (95% CI {low:.2f}-{high:.2f}, {prompts} prompts)"


def focus_numbers(tables: Tables, category: str | None = None) -> dict:
    category = category or tables.focus
    rows = tables.rows[tables.rows.category == category]
    return {
        "speedup_vs_ar": metrics.mean_speedup(rows, tables.ours, lineups.TARGET_AR),
        "ours_vs_theirs": metrics.mean_speedup(rows, tables.ours, tables.theirs),
    }


def headline(tables: Tables) -> dict:
    found = {}
    for category in tables.rows.category.unique():
        numbers = focus_numbers(tables, category)
        found[f"{tables.ours} over AR, {category}"] = interval(*numbers["speedup_vs_ar"])
        found[f"{tables.ours} / {tables.theirs}, {category}"] = interval(*numbers["ours_vs_theirs"])
    for name in tables.lossy:
        found[f"{name}: agreement with target greedy"] = round(float(tables.table.loc[name, "agreement"]), 3)
    return found


def findings(tables: Tables) -> str:
    text = ""
    for category in tables.rows.category.unique():
        numbers = focus_numbers(tables, category)
        best = tables.by_category[(tables.by_category.category == category)
                                  & (tables.by_category.method != lineups.TARGET_AR)].sort_values("speedup").iloc[-1]
        text += (f"- **{category}**: {tables.ours} runs at {interval(*numbers['speedup_vs_ar'])} the speed of AR "
                 f"(per generated token), and {interval(*numbers['ours_vs_theirs'])} the speed of {tables.theirs} "
                 f"(>1 = ours faster). Fastest here: {best.method}, "
                 f"{interval(best.speedup, best.speedup_low, best.speedup_high, int(best.prompts))}.\n")
    for name in tables.lossy:
        text += (f"\n{name} reproduces {tables.table.loc[name, 'agreement']:.0%} of the target's greedy text on "
                 f"average (ours: {tables.table.loc[tables.ours, 'agreement']:.0%}): its speed comes from returning "
                 "another model's text.")
    return text


def hybrid_sources(rows: pd.DataFrame) -> pd.DataFrame:
    """Per category: the share of steps the hybrid candidate source spent on each source (empty
    when no hybrid ran)."""
    hybrid = rows[rows.method_params.map(lambda p: p.get("source") == "hybrid")]
    if hybrid.empty:
        return pd.DataFrame()
    steps = pd.DataFrame([extras.get("sources", {}) for extras in hybrid.extras], index=hybrid.category.values)
    steps = steps.fillna(0).groupby(level=0, sort=False).sum()
    return steps.div(steps.sum(axis=1), axis=0)


def control_findings(control: pd.DataFrame) -> str:
    mismatched = control_mismatches(control)
    if mismatched.empty:
        return "**All lossless methods agree exactly in fp32.**"
    return f"**{len(mismatched)} fp32 samples differ from AR greedy**: " + ", ".join(sorted(set(mismatched.decoder)))


def texts_markdown(tables: Tables) -> str:
    """The first prompt's texts, one block per method, for reading side by side."""
    return "\n\n".join(f"**{name}**\n\n```\n{text[:600]}\n```" for name, text in tables.texts.items())


def markdown_by_category(results_dir: str) -> str:
    """The per-category table of the newest run in `results_dir` (its complete prompts only): what
    `python -m specdec_lab.experiments.speculative results/cpu` prints for the README."""
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
    table = by_category(metrics.add_agreement(pd.DataFrame(complete), reference_decoder=lineups.TARGET_AR))
    lines = ["| kind of text | method | speedup over AR (95% CI) | prompts | tokens/s | tokens per target forward "
             "| agreement with greedy |", "|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        lines.append(f"| {row.category} | {row.method} | {row.speedup:.2f} ({row.speedup_low:.2f}-{row.speedup_high:.2f}) "
                     f"| {row.prompts} | {row.tokens_per_second:.2f} | {row.tokens_per_target_forward:.2f} "
                     f"| {row.agreement:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_by_category(sys.argv[1] if len(sys.argv) > 1 else "results/cpu"))
