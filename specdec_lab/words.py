"""How numbers become text: a speedup with its interval, a bullet list, a Markdown table, and the
sentence that says what a profile's run measured. Every sentence of the notebooks that states a
number gets it from here, computed from rows or parameters, never typed."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from specdec_lab.metrics import Speedup


def interval(speedup: Speedup, unit: str = "x", compact: bool = False, prompts: bool = True) -> str:
    """'1.52x (95% CI 1.31-1.74, 10 prompts)'; in a table column that says what it holds (compact),
    '1.52 (1.31-1.74, 10 prompts)', or '1.52 (1.31-1.74)' beside a prompts column."""
    count = f", {speedup.prompts} prompt{'s' * (speedup.prompts != 1)}" if prompts else ""
    if compact:
        return f"{speedup.value:.2f} ({speedup.low:.2f}-{speedup.high:.2f}{count})"
    return f"{speedup.value:.2f}{unit} (95% CI {speedup.low:.2f}-{speedup.high:.2f}{count})"


def bullets(lines: Sequence[str]) -> str:
    """A Markdown bullet list."""
    return "\n".join("- " + line for line in lines)


Format = str | Callable[[object], str]


def cell(value, format: Format | None = None) -> str:
    """One table cell: NaN and None as '-', a Speedup as its interval, text as it is, numbers by
    `format` (a format spec like '.2f', or a function)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, Speedup):
        return interval(value)
    if isinstance(value, str):
        return value
    if callable(format):
        return format(value)
    return f"{value:{format}}" if format else str(value)


def markdown_table(frame: pd.DataFrame, formats: Mapping[str, Format] | None = None, index: bool = False) -> str:
    """`frame` as a Markdown table: its columns as they are named (with `index`, the index first),
    each cell by `formats[column]` (a format spec or a function; default str)."""
    formats = dict(formats or {})
    frame = frame.reset_index() if index else frame
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    for values in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(value, formats.get(column)) for column, value in
                                       zip(frame.columns, values)) + " |")
    return "\n".join(lines)


def profile_sentence(config: Mapping, other_profile: str, other: Mapping) -> str:
    """What this run's parameters are where another profile's differ, and the other's values: how a
    notebook says what `cpu-full` adds, from the two parameter files rather than from typed prose."""
    differing = [name for name in config if name not in ("profile", "results_dir") and other.get(name) != config[name]]
    if config.get("profile") == other_profile:
        return f"This run uses the `{other_profile}` profile."
    if not other:
        return f"The `{other_profile}` profile has no parameter file for this notebook."
    if not differing:
        return f"This run (profile `{config.get('profile')}`) has the same parameters as `{other_profile}`."
    changes = [f"`{name}`: {config[name]!r} here, {other.get(name)!r} in `{other_profile}`" for name in differing]
    return (f"This run (profile `{config.get('profile')}`) and `{other_profile}` differ in {len(differing)} "
            f"parameter{'s' * (len(differing) != 1)}:\n" + bullets(changes))
