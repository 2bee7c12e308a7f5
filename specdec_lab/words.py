"""How numbers become text: a speedup with its interval, a bullet list, a Markdown table, and the
sentence that says what a profile's run measured. Every sentence of the notebooks that states a
number gets it from here, computed from rows or parameters, never typed."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from specdec_lab.method import short_label, source_from_columns
from specdec_lab.metrics import Speedup


def interval(speedup: Speedup, unit: str = "x", compact: bool = False, prompts: bool = True) -> str:
    """'1.52x (95% CI 1.31-1.74, 10 prompts)'; in a table column that says what it holds (compact),
    '1.52 (1.31-1.74, 10 prompts)', or '1.52 (1.31-1.74)' beside a prompts column."""
    count = f", {speedup.prompts} prompt{'s' * (speedup.prompts != 1)}" if prompts else ""
    if speedup.low != speedup.low:  # NaN: fewer than 2 prompts say nothing about the spread
        return f"{speedup.value:.2f}{'' if compact else unit} ({speedup.prompts} prompt{'s' * (speedup.prompts != 1)}, no interval)"
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


def short_names(rows: pd.DataFrame) -> dict[str, str]:
    """Each method's (`decoder`) few words for narrow tables and figures, from its record's columns
    (`method.short_label`); where two methods would read alike, their weights or engine are added, and
    where they still would, the full name stays. The full names stay in the CSV files and the code twin."""
    first = rows.drop_duplicates("decoder").set_index("decoder")
    names = {decoder: short_label(source_from_columns(row, row.implementation), row.role, row.implementation)
             for decoder, row in first.iterrows()}
    for extra in (_weights_words, lambda row: row.get("engine", "")):
        counts = pd.Series(list(names.values())).value_counts()
        names = {decoder: f"{name} · {extra(first.loc[decoder])}" if counts[name] > 1 and extra(first.loc[decoder])
                 else name for decoder, name in names.items()}
    counts = pd.Series(list(names.values())).value_counts()
    return {decoder: decoder if counts[name] > 1 else name for decoder, name in names.items()}


def _weights_words(row) -> str:
    quantization, draft = row.get("quantization"), row.get("draft_quantization")
    if isinstance(draft, str):
        return f"{quantization}/{draft}"
    model = row.get("model_role")
    return " ".join(value for value in (model if model not in (None, "target") else None,
                                        quantization if quantization not in (None, "none") else None)
                    if isinstance(value, str))


def compact_table(table: pd.DataFrame, columns: Mapping[str, str], names: Mapping[str, str] | None = None,
                  label: str | None = None) -> pd.DataFrame:
    """A table narrow enough to read without scrolling sideways: one line per row of `table`, named by
    its `label` column (default: the index) through `names` (the short names), then each of `columns`
    {column: heading}, numbers to 2 digits. A column with `_low` and `_high` siblings (an interval)
    becomes one "value (low-high)" cell. The full table stays in the code twin and the CSV files."""
    labels = table[label] if label is not None else table.index.to_series()
    compact = pd.DataFrame(index=pd.Index([(names or {}).get(name, name) for name in labels], name=label or "method"))
    for column, heading in columns.items():
        if column not in table:
            continue
        values = table[column]
        if f"{column}_low" in table and f"{column}_high" in table:
            compact[heading] = [_value_and_interval(value, low, high) for value, low, high in
                                zip(values, table[f"{column}_low"], table[f"{column}_high"])]
        elif pd.api.types.is_float_dtype(values) and values.dropna().apply(float.is_integer).all():
            compact[heading] = values.astype("Int64").to_numpy()  # counts read as counts
        else:
            compact[heading] = values.round(2).to_numpy() if pd.api.types.is_float_dtype(values) else values.to_numpy()
    return compact


def _value_and_interval(value, low, high) -> str:
    """"1.23 (1.10-1.37)"; the value alone where there is no interval (one prompt), "-" without a value."""
    if value is None or math.isnan(value):
        return "-"
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return f"{value:.2f}"
    return f"{value:.2f} ({low:.2f}-{high:.2f})"
