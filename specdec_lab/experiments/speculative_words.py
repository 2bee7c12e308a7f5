"""Notebook 02 in words: each sentence reads its numbers from the tables (`speculative_tables`),
never from typed text."""

from __future__ import annotations

import pandas as pd

from specdec_lab import words
from specdec_lab.experiments import lineups
from specdec_lab.experiments.speculative_tables import Tables, control_mismatches, fastest, focus_numbers
from specdec_lab.metrics import Speedup


def headline(tables: Tables) -> dict:
    found = {}
    for category in tables.rows.category.unique():
        numbers = focus_numbers(tables, category)
        found[f"{tables.ours} over AR, {category}"] = words.interval(numbers["speedup_vs_ar"])
        found[f"{tables.ours} / {tables.theirs}, {category}"] = words.interval(numbers["ours_vs_theirs"])
    for name in tables.lossy:
        found[f"{name}: agreement with target greedy"] = round(float(tables.table.loc[name, "agreement"]), 3)
    return found


def findings(tables: Tables) -> str:
    text = ""
    for category in tables.rows.category.unique():
        numbers, best = focus_numbers(tables, category), fastest(tables.by_category, category)
        text += (f"- **{category}**: {tables.ours} runs at {words.interval(numbers['speedup_vs_ar'])} the speed of AR "
                 f"(per generated token), and {words.interval(numbers['ours_vs_theirs'])} the speed of "
                 f"{tables.theirs} (>1 = ours faster). Fastest here: {best.method}, "
                 f"{words.interval(Speedup.from_line(best))}.\n")
    for name in tables.lossy:
        text += (f"\n{name} reproduces {tables.table.loc[name, 'agreement']:.0%} of the target's greedy text on "
                 f"average (ours: {tables.table.loc[tables.ours, 'agreement']:.0%}): its speed comes from returning "
                 "another model's text.")
    return text


def per_category_markdown(per_category: pd.DataFrame) -> str:
    """`speculative_tables.per_category` as a Markdown table: a row per kind of text, a column per
    line (our best, the hybrid, transformers' best, the picker's pick), each cell the method and its
    measured speedup with its interval."""
    def cell(line) -> str:
        measured = words.interval(Speedup.from_line(line)) if line.prompts else "not in the line-up"
        if pd.notna(line.get("predicted_speedup")):
            return f"{line.method}: predicted {line.predicted_speedup:.2f}x, measured {measured}"
        return f"{line.method}: {measured}"

    cells = per_category.assign(cell=[cell(line) for _, line in per_category.iterrows()])
    wide = cells.pivot(index="category", columns="which", values="cell")
    wide = wide.loc[list(dict.fromkeys(per_category.category)), list(dict.fromkeys(per_category.which))]
    return words.markdown_table(wide.rename_axis(index="kind of text", columns=None), index=True)


def hybrid_findings(targets: pd.DataFrame) -> str:
    """The hybrid's targets in words, one line per category."""
    lines = []
    for category, row in targets.iterrows():
        ratio = Speedup(row["hybrid / best"], row.low, row.high, int(row.prompts))
        line = (f"**{category}**: hybrid ÷ {row['best single method']} = {words.interval(ratio)}, side by side: "
                + ("**not shown slower than the best single method** (the interval reaches 1)" if row["not shown slower"]
                   else "**below the best single method**"))
        if row["nothing helps"]:
            over_ar = Speedup(row["hybrid over AR"], row["hybrid low"], row["hybrid high"], int(row["hybrid prompts"]))
            line += (f". No single method is shown to help here (every interval reaches 1); the hybrid runs at "
                     f"{words.interval(over_ar)} AR: " + ("**met**" if row["at least the floor"] else "**missed**")
                     + f" (target ≥ {row.floor}x)")
        lines.append(line + ".")
    return words.bullets(lines)


def picker_findings(tables: Tables, tolerance: float = 0.15) -> str:
    """Per category: the pick and how far the predictions landed from the measured speedups."""
    lines = []
    for category, group in tables.picked.table.groupby("category", sort=False):
        chosen = tables.picked.recommended.set_index("category").loc[category]
        checked = group.dropna(subset=["speedup"])
        within = (checked.error.abs() <= tolerance).sum()
        within_same = (checked.error_same_prompts.abs() <= tolerance).sum()
        worst = checked.loc[checked.error.abs().idxmax()] if len(checked) else None
        lines.append(f"**{category}**: the picker recommends **{chosen.source}** (predicted "
                     f"{chosen.predicted_speedup:.2f}x over AR). Of the {len(checked)} sources the line-up measured, "
                     f"{within} are predicted within {tolerance:.0%} from the held-out calibration prompts and "
                     f"{within_same} on the line-up's own prompts"
                     + (f"; the furthest from held-out prompts is {worst.source}: predicted "
                        f"{worst.predicted_speedup:.2f}x, measured {worst.speedup:.2f}x ({worst.error:+.0%}), "
                        f"{worst.predicted_same_prompts:.2f}x on the same prompts." if worst is not None else "."))
    return words.bullets(lines)


def control_findings(control: pd.DataFrame) -> str:
    mismatched = control_mismatches(control)
    if mismatched.empty:
        return "**All lossless methods agree exactly in fp32.**"
    return f"**{len(mismatched)} fp32 samples differ from AR greedy**: " + ", ".join(sorted(set(mismatched.decoder)))


def texts_markdown(tables: Tables) -> str:
    """The first prompt's texts, one block per method, for reading side by side."""
    return "\n\n".join(f"**{name}**\n\n```\n{text[:600]}\n```" for name, text in tables.texts.items())


def tree_findings(tables: Tables, gain: float = 1.15) -> str:
    """The token trees in words: how the picker sized the draft tree, then per source kind and kind of
    text the tree's speedup over the chain, and whether it reaches `gain` (the issue's target)."""
    lines = []
    picked = tables.picked
    if picked is not None and picked.tree_shape:
        depth = max(lineups.tree_depth(picked.tree_shape), 1)
        verify = picked.costs.verify(len(picked.tree_shape) + 1)
        lines.append(f"The picker sized the draft tree at {len(picked.tree_shape)} nodes, depth {depth}, from the "
                     f"draft's per-rank acceptance (teacher-forced: "
                     f"{', '.join(f'rank {r + 1}: {a:.2f}' for r, a in enumerate(picked.rank_acceptance or []))}) "
                     f"and this machine's T(n): verifying its {len(picked.tree_shape) + 1} tokens costs "
                     f"{verify:.2f} AR steps."
                     + (" That tree is a chain: no branch is expected to accept enough to pay for the tokens it adds "
                        "to the verification." if depth == len(picked.tree_shape) else ""))
    for _, row in tables.trees.iterrows():
        ratio = Speedup.from_line(row)
        predicted = f"; the picker predicted {row.predicted:.2f}x" if pd.notna(row.predicted) else ""
        verdict = "reaches" if ratio.value >= gain else "misses"
        lines.append(f"**{row.category}, {row.source_kind}**: the tree runs at {words.interval(ratio)} the speed of "
                     f"the chain ({row.tree_tokens_per_forward:.2f} against {row.chain_tokens_per_forward:.2f} tokens "
                     f"per target forward){predicted}: it {verdict} {gain:.2f}x.")
    return words.bullets(lines)


def suffix_findings(suffix: pd.DataFrame) -> str:
    """Our suffix decoding against arctic-inference's, per kind of text: tokens per target forward (the
    issue's target: ours at least as many) and speed."""
    lines = []
    for _, row in suffix.iterrows():
        forwards, speed = Speedup.from_line(row, "forward_ratio"), Speedup.from_line(row, "speed_ratio")
        verdict = "at least as many" if forwards.value >= 1 else "fewer"
        lines.append(f"**{row.category}**: ours makes {row.ours_tokens_per_forward:.2f} tokens per target forward, "
                     f"arctic-inference's {row.peer_tokens_per_forward:.2f}: {words.interval(forwards)} as many "
                     f"({verdict}), at {words.interval(speed)} its speed.")
    return words.bullets(lines)
