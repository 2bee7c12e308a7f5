"""Notebook 02's tables, computed from benchmark rows (and the picker's predictions): numbers only,
tested on synthetic rows. `speculative` runs the experiment; `speculative_words` says what these
tables show."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import pandas as pd

from specdec_lab import metrics
from specdec_lab.experiments import lineups, picker
from specdec_lab.method import HybridSettings, Method, source_columns, source_from_columns
from specdec_lab.metrics import Speedup


@dataclass
class Picked:
    """What the draft picker predicted from its calibration prompts (held out from the line-up),
    before the line-up ran; `table` gains the measured speedups and a same-prompt check after it."""

    calibration_prompts: list[str]
    draft_agreement: float  # teacher-forced, per position
    costs: picker.Costs
    hybrid_settings: HybridSettings  # the hybrid's defaults, chosen by predicted speedup
    hybrid_grid: pd.DataFrame  # every hybrid setting weighed, with its predicted speedups
    table: pd.DataFrame  # per (category, source): predicted, then measured where the line-up ran it
    recommended: pd.DataFrame  # per category: our source with the highest predicted speedup
    tree_shape: list[tuple[int, int]] | None = None  # the draft tree the picker sized (None: no trees)
    tree_grid: pd.DataFrame | None = None  # every (nodes, depth) weighed, with its predicted steady-state speedup
    rank_acceptance: list[float] | None = None  # P(the target's token is the draft's r-th ranked one), teacher-forced

    def to_json(self) -> dict:
        relative_draft = self.costs.relative_draft
        return {"calibration_prompts": self.calibration_prompts, "draft_agreement": self.draft_agreement,
                "relative_target": {int(n): float(v) for n, v in self.costs.relative_target.items()},
                "relative_draft": None if relative_draft is None else {int(n): float(v) for n, v in relative_draft.items()},
                "draft_cost_ratio": self.costs.draft_cost_ratio, "draft_prefill_ratio": self.costs.draft_prefill_ratio,
                "hybrid_settings": asdict(self.hybrid_settings),
                **{name: getattr(self, name).to_dict("records") for name in ("hybrid_grid", "table", "recommended")},
                "tree_shape": self.tree_shape, "rank_acceptance": self.rank_acceptance,
                "tree_grid": None if self.tree_grid is None else self.tree_grid.to_dict("records")}

    @classmethod
    def from_json(cls, saved: dict) -> "Picked":
        relative_draft = saved.get("relative_draft")
        costs = picker.Costs(pd.Series({int(n): v for n, v in saved["relative_target"].items()}),
                             saved["draft_cost_ratio"],
                             None if relative_draft is None else pd.Series({int(n): v for n, v in relative_draft.items()}),
                             saved.get("draft_prefill_ratio", 0.0))
        shape = saved.get("tree_shape")
        return cls(saved["calibration_prompts"], saved["draft_agreement"], costs,
                   HybridSettings(**saved["hybrid_settings"]),
                   *(pd.DataFrame(saved[name]) for name in ("hybrid_grid", "table", "recommended")),
                   [tuple(node) for node in shape] if shape else None,
                   pd.DataFrame(saved["tree_grid"]) if saved.get("tree_grid") else None, saved.get("rank_acceptance"))


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
    picked: Picked | None = None  # the draft picker's predictions, checked against the measured rows
    per_category: pd.DataFrame | None = None  # per (category, which): our best, the hybrid, transformers' best, the pick
    trees: pd.DataFrame | None = None  # per (category, source): tree ÷ chain, measured and predicted
    suffix: pd.DataFrame | None = None  # per category: our suffix decoding against arctic-inference's
    token_views: object = None  # one prompt per kind, every method's text coloured by token origin (HTML)
    names: dict | None = None  # method name -> its few words for narrow tables and figures (`words.short_names`)


SUMMARY_COLUMNS = ["speedup", "speedup_low", "speedup_high", "prompts", "tokens_per_second",
                   "tokens_per_target_forward", "agreement"]


def by_category(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (category, method): the per-token speedup over AR with its 95% interval and prompt count,
    tokens per target forward and agreement. No single method wins on every kind of text."""
    frames = [metrics.summary(group, baseline=lineups.TARGET_AR)[SUMMARY_COLUMNS].reset_index().assign(category=category)
              for category, group in rows.groupby("category", sort=False)]
    return pd.concat(frames, ignore_index=True).rename(columns={"decoder": "method"})


def focus_category(rows: pd.DataFrame) -> str:
    """The category the headline speaks of: code when there is code, else the first one."""
    return "code" if (rows.category == "code").any() else rows.category.iloc[0]


def the_draft_model_pair(methods: list[Method], k: int, schedule: str) -> tuple[str, str]:
    """The names of our draft-model decoder and transformers' assisted generation at `k` with
    `schedule`: the pair the headline compares."""
    def named(implementation: str) -> str:
        return next(m.name for m in methods if m.source is not None and m.source.kind == "draft model"
                    and m.implementation == implementation and m.source.k == k and m.source.schedule == schedule)
    return named("ours"), named("transformers")


def constant_k_of(methods: list[Method], k_values: list[int]) -> dict[str, int]:
    """Our draft-model decoders with a constant k among `k_values`, by name: the k sweep's points."""
    return {m.name: m.source.k for m in methods if m.implementation == "ours" and m.source is not None
            and m.source.kind == "draft model" and m.source.schedule == "constant" and m.source.k in k_values}


def is_hybrid(rows: pd.DataFrame) -> pd.Series:
    return rows.source_kind == "hybrid"


def picked_vs_measured(predicted: pd.DataFrame, same_prompts: pd.DataFrame, all_rows: pd.DataFrame) -> pd.DataFrame:
    """The picker's per-category predictions (from held-out calibration prompts, and on the line-up's
    own prompts) beside the measured speedup of the same source (the line-up's rows, or the k
    sweep's on its prompts) with its interval, and each prediction's relative error. A prediction
    and a measurement are of the same source when their source records are equal."""
    speed = metrics.speedups(all_rows, lineups.TARGET_AR)
    described = all_rows.drop_duplicates("decoder").set_index("decoder")
    source_of = {decoder: source_from_columns(line, line.implementation) for decoder, line in described.iterrows()}
    same = same_prompts.set_index(["category", "source"]).predicted_speedup
    records = []
    for _, line in predicted.iterrows():
        wanted = source_from_columns(line, line.implementation)
        if wanted is None:  # a prediction always describes its source: a missing one must not match AR's rows
            raise ValueError(f"the picker's line {line.source!r} has no source record (columns {source_columns_named}): "
                             "delete the run's picker.json, made by an older version of the kit, and run again")
        decoders = [decoder for decoder, source in source_of.items() if source == wanted]
        measured = speed[(speed.category == line.category) & speed.decoder.isin(decoders)]
        found = metrics.over_prompts(measured.groupby("prompt_id").speedup.median())
        records.append({"predicted_same_prompts": same.get((line.category, line.source), float("nan")),
                        "measured_as": measured.decoder.iloc[0] if len(measured) else None,
                        **found.columns(), "measured_prompts": found.prompts})
    measured_columns = pd.DataFrame(records).drop(columns="prompts")
    table = pd.concat([predicted.reset_index(drop=True), measured_columns], axis=1)
    table["error"] = table.predicted_speedup / table.speedup - 1
    table["error_same_prompts"] = table.predicted_same_prompts / table.speedup - 1
    return table


source_columns_named = list(source_columns(None))


def per_category(tables: Tables) -> pd.DataFrame:
    """Per category, one line for each of: our fastest lossless method, the hybrid, transformers'
    fastest (measured, with intervals), and the picker's recommendation (`predicted_speedup`, and
    its measured speedup where the line-up ran it)."""
    described = tables.rows.drop_duplicates("decoder")[["decoder", "implementation", "lossless", "source_kind"]]
    lines = tables.by_category.merge(described, left_on="method", right_on="decoder")
    lines = lines[lines.lossless & (lines.method != lineups.TARGET_AR)]
    records = []
    for category, group in lines.groupby("category", sort=False):
        for which, part in (("our best", group[group.implementation == "ours"]), ("hybrid", group[is_hybrid(group)]),
                            ("transformers' best", group[group.implementation == "transformers"])):
            if len(part):
                best = part.loc[part.speedup.idxmax()]
                records.append({"category": category, "which": which, "method": best.method,
                                **Speedup.from_line(best).columns()})
        if tables.picked is not None:
            chosen = tables.picked.recommended.set_index("category").loc[category]
            measured = tables.picked.table[(tables.picked.table.category == category)
                                           & (tables.picked.table.source == chosen.source)].iloc[0]
            records.append({"category": category, "which": "picker's pick", "method": chosen.source,
                            "speedup": measured.speedup, "speedup_low": measured.speedup_low,
                            "speedup_high": measured.speedup_high, "prompts": measured.measured_prompts,
                            "predicted_speedup": chosen.predicted_speedup})
    return pd.DataFrame(records)


def hybrid_targets(tables: Tables, floor: float = 0.97) -> pd.DataFrame:
    """Per category, the hybrid's two targets, measured:
    - against the fastest single lossless method (ours or transformers'): hybrid ÷ that method, per
      prompt side by side (geometric mean, 95% interval); met ("at least the best within the
      interval") when the interval reaches 1, i.e. the hybrid is not shown slower;
    - where nothing helps (no single method's interval lies above 1): the hybrid's speedup over AR,
      met when it is at least `floor`.
    Empty when no hybrid ran."""
    hybrid_rows = is_hybrid(tables.rows)
    if not hybrid_rows.any():
        return pd.DataFrame()
    hybrid = tables.rows[hybrid_rows].decoder.iloc[0]
    singles = set(tables.rows[~hybrid_rows & tables.rows.lossless & (tables.rows.decoder != lineups.TARGET_AR)].decoder)
    records = []
    for category, group in tables.by_category.groupby("category", sort=False):
        single = group[group.method.isin(singles)]
        best = single.loc[single.speedup.idxmax()]
        mine = group[group.method == hybrid].iloc[0]
        ratio = metrics.mean_speedup(tables.rows[tables.rows.category == category], hybrid, best.method)
        nothing_helps = bool((single.speedup_low <= 1).all())
        records.append({"category": category, "best single method": best.method,
                        "hybrid / best": ratio.value, "low": ratio.low, "high": ratio.high, "prompts": ratio.prompts,
                        "hybrid prompts": int(mine.prompts),
                        "not shown slower": bool(ratio.high >= 1), "nothing helps": nothing_helps,
                        "hybrid over AR": mine.speedup, "hybrid low": mine.speedup_low, "hybrid high": mine.speedup_high,
                        "floor": floor, "at least the floor": bool(mine.speedup >= floor) if nothing_helps else None})
    return pd.DataFrame(records).set_index("category")


def hybrid_sources(rows: pd.DataFrame) -> pd.DataFrame:
    """Per category: the share of steps the hybrid candidate source spent on each source (empty
    when no hybrid ran)."""
    hybrid = rows[is_hybrid(rows)]
    if hybrid.empty:
        return pd.DataFrame()
    steps = pd.DataFrame([extras.get("sources", {}) for extras in hybrid.extras], index=hybrid.category.values)
    steps = steps.fillna(0).groupby(level=0, sort=False).sum()
    return steps.div(steps.sum(axis=1), axis=0)


def focus_numbers(tables: Tables, category: str | None = None) -> dict[str, Speedup]:
    """Our draft-model decoder over AR, and over transformers' assisted generation, on `category`."""
    rows = tables.rows[tables.rows.category == (category or tables.focus)]
    return {"speedup_vs_ar": metrics.mean_speedup(rows, tables.ours, lineups.TARGET_AR),
            "ours_vs_theirs": metrics.mean_speedup(rows, tables.ours, tables.theirs)}


def fastest(by_category: pd.DataFrame, category: str) -> pd.Series:
    """The line of the fastest method other than AR on `category`."""
    lines = by_category[(by_category.category == category) & (by_category.method != lineups.TARGET_AR)]
    return lines.sort_values("speedup").iloc[-1]


def control_mismatches(control: pd.DataFrame) -> pd.DataFrame:
    """The fp32 samples of declared-lossless methods that differ from AR greedy (empty = all exact)."""
    return control[control.lossless & ~control.full_match.astype(bool)]


def tree_vs_chain(rows: pd.DataFrame, by_category: pd.DataFrame, picked: Picked | None = None) -> pd.DataFrame:
    """Per (category, source kind) with a tree method in the rows: the tree's per-token speedup over
    our chain of the same source (the one with the tree's confidence stop, else the first in line-up
    order), paired per prompt (geometric mean, 95%
    interval, prompts), each one's tokens per target forward, and with a picker the predicted ratio
    (its predicted speedups of the two, from the held-out calibration prompts). What a method is
    comes from the rows' source columns."""
    described = rows.drop_duplicates("decoder")
    source_of = {line.decoder: source_from_columns(line, line.implementation) for _, line in described.iterrows()}
    ours = [name for name, line in zip(described.decoder, described.implementation) if line == "ours"]
    forwards = by_category.set_index(["category", "method"]).tokens_per_target_forward
    records = []
    for tree in [name for name in ours if source_of[name] is not None and source_of[name].tree is not None]:
        kind = source_of[tree].kind
        chains = [name for name in ours if source_of[name] is not None and source_of[name].kind == kind
                  and source_of[name].tree is None]
        if not chains:
            continue
        # the chain with the tree's confidence stop where there is one (the adaptive draft for the sized tree)
        chain = next((name for name in chains if source_of[name].confidence_threshold
                      == source_of[tree].confidence_threshold), chains[0])
        speed = metrics.speedups(rows[rows.decoder.isin([tree, chain])], chain)
        for category, group in speed[speed.decoder == tree].groupby("category", sort=False):
            ratio = metrics.over_prompts(group.groupby("prompt_id").speedup.median())
            records.append({"category": category, "source_kind": kind, "tree": tree, "chain": chain,
                            **ratio.columns(),
                            "tree_tokens_per_forward": forwards.get((category, tree), float("nan")),
                            "chain_tokens_per_forward": forwards.get((category, chain), float("nan")),
                            "predicted": predicted_ratio(picked, category, source_of[tree], source_of[chain])})
    return pd.DataFrame(records)


def predicted_ratio(picked: Picked | None, category: str, tree, chain) -> float:
    """The picker's predicted speedup of `tree` over that of `chain` (source records) in `category`."""
    if picked is None:
        return float("nan")
    lines = picked.table[picked.table.category == category]
    predicted = {}
    for _, line in lines.iterrows():
        predicted[source_from_columns(line, line.implementation)] = line.predicted_speedup
    return predicted.get(tree, float("nan")) / predicted.get(chain, float("nan"))


def suffix_vs_peer(rows: pd.DataFrame) -> pd.DataFrame:
    """Per category, for each suffix-decoding method of a peer's (arctic-inference's suffix tree) and ours
    with the same settings: tokens per target forward of each (the accepted tokens a step, plus the
    target's own), ours ÷ theirs paired per prompt (geometric mean, 95% interval), and ours ÷ theirs in
    speed. Empty when no peer ran."""
    described = rows.drop_duplicates("decoder")
    source_of = {line.decoder: source_from_columns(line, line.implementation) for _, line in described.iterrows()}
    records = []
    for peer, source in source_of.items():
        if source is None or source.kind != "suffix" or source.implementation == "ours":
            continue
        ours = next((name for name, other in source_of.items() if other == replace(source, implementation="ours")), None)
        if ours is None:
            continue
        for category, group in rows[rows.decoder.isin([ours, peer])].groupby("category", sort=False):
            per_prompt = group.pivot_table(index="prompt_id", columns="decoder", values="tokens_per_target_forward",
                                           aggfunc="median").dropna()
            forwards = metrics.over_prompts(per_prompt[ours] / per_prompt[peer])
            speed = metrics.mean_speedup(group, ours, peer)
            records.append({"category": category, "ours": ours, "peer": peer,
                            "ours_tokens_per_forward": metrics.geometric_mean(per_prompt[ours]),
                            "peer_tokens_per_forward": metrics.geometric_mean(per_prompt[peer]),
                            **forwards.columns("forward_ratio"), **speed.columns("speed_ratio")})
    return pd.DataFrame(records)
