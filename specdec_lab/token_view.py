"""The text itself, token by token, coloured by where each token came from (`result` origins): what
the draft, prompt lookup, a tree branch, a lookahead n-gram or a Jacobi iteration proposed and the
target accepted, what the target wrote itself, and where it corrected a rejected proposal.

Plain HTML and inline CSS, no JavaScript: the same object shows in JupyterLab (`_repr_html_`) and in
the exported reports, offline. Each token's tooltip (its `title`) names its step and origin; a thin
bar marks where each target forward's tokens begin.

    views = TokenViews("code", [TokenText.of("AR", result, tokenizer), ...])
    views                     # in a notebook cell
    trajectory_html(trace, tokenizer)   # one Jacobi block converging, iteration by iteration
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec_lab.method import short_label, source_from_columns
from specdec_lab.quality import common_prefix_length
from specdec_lab.result import (CORRECTION, DRAFT_MODEL, FAST_FORWARD, LOOKAHEAD_NGRAM, PROMPT_LOOKUP, PROPOSAL,
                                SIDE_BRANCH, STATIONARY, SUFFIX, TARGET, UNVERIFIED_DRAFT, BlockTrace)

# One colour per origin (light, so the text stays readable); a side branch keeps its source's colour
# under a dashed outline.
COLOURS = {
    TARGET: "#ffffff",
    CORRECTION: "#f7b2ad",
    DRAFT_MODEL: "#b5e3b0",
    PROMPT_LOOKUP: "#aecdf2",
    PROPOSAL: "#b5e3b0",
    LOOKAHEAD_NGRAM: "#d9c2f0",
    SUFFIX: "#f5c6e4",
    FAST_FORWARD: "#9fe0d6",
    STATIONARY: "#f8dc8c",
    UNVERIFIED_DRAFT: "#dddddd",
}
MEANING = {
    TARGET: "the target's own token",
    CORRECTION: "the target's token where a proposal was rejected",
    DRAFT_MODEL: "accepted from the draft model",
    PROMPT_LOOKUP: "accepted from prompt lookup",
    PROPOSAL: "accepted proposal",
    LOOKAHEAD_NGRAM: "accepted from lookahead's n-gram pool",
    SUFFIX: "accepted from suffix decoding (the prompt, or an earlier answer)",
    FAST_FORWARD: "Jacobi: fixed beyond the first token of an iteration (fast-forwarded)",
    STATIONARY: "Jacobi: right in an earlier iteration and unchanged since (stationary)",
    UNVERIFIED_DRAFT: "the draft's text, not verified by the target (not lossless)",
}
STYLE = """<style>
.tv { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; line-height: 1.9; }
.tv table { border-collapse: collapse; width: 100%; table-layout: fixed; }
.tv table td { vertical-align: top; padding: 3px 6px; border-bottom: 1px solid #e4e4e4; text-align: left !important; }
.tv td.tv-label { width: 15em; font-family: system-ui, sans-serif; font-size: 12px; color: #333; }
.tv td.tv-label small { color: #777; display: block; line-height: 1.3; }
.tv .tv-text { white-space: pre-wrap; word-break: break-word; }
.tv .tk { border-radius: 2px; padding: 0 1px; }
.tv .tk.step { box-shadow: -1.5px 0 0 #8a8a8a; margin-left: 1.5px; }
.tv .tk.side { outline: 1.5px dashed #444; outline-offset: -1.5px; }
.tv .tv-legend { font-family: system-ui, sans-serif; font-size: 12px; margin: 4px 0 6px; }
.tv .tv-legend span.tk { display: inline-block; min-width: 1.4em; border: 1px solid #bbb; margin: 0 3px 0 10px; }
.tv caption { text-align: left; font-family: system-ui, sans-serif; font-weight: 600; padding: 4px 0; }
.tv table.tv-grid { width: auto; table-layout: auto; }
.tv .tv-grid td { font-size: 12px; padding: 1px 3px; border: 1px solid #eee; white-space: pre; }
</style>"""


def token_pieces(tokenizer, tokens: Sequence[int]) -> list[str]:
    """Each token's text as it reads in the decoded whole (a multi-byte character split over tokens
    shows on the token that completes it)."""
    pieces, before = [], ""
    for end in range(1, len(tokens) + 1):
        text = tokenizer.decode(list(tokens[:end]), skip_special_tokens=False)
        if text.endswith("\ufffd"):  # a character's first bytes: it shows once its last byte arrives
            pieces.append("")
            continue
        same = len(os.path.commonprefix([before, text]))  # a tokenizer may rewrite the text's end as it grows
        pieces.append(text[same:])
        before = text
    return pieces


def _colour(origin: str) -> str:
    return COLOURS.get(origin.removesuffix(SIDE_BRANCH), "#e8e8e8")


def _visible(piece: str) -> str:
    """A piece as HTML; a lone newline gets a visible mark before it breaks the line."""
    return html.escape(piece).replace("\n", "↵\n")


@dataclass
class TokenText:
    """One method's text on one prompt, with each token's origin and step (empty: the method's loop
    cannot say, as a peer engine's own)."""

    label: str
    pieces: list[str]
    origins: list[str]
    steps: list[int]
    note: str = ""

    @classmethod
    def of(cls, label: str, result, tokenizer, note: str = "") -> "TokenText":
        """From a `GenerationResult` (or a result row: a mapping with its fields)."""
        get = result.get if hasattr(result, "get") else (lambda name: getattr(result, name))
        tokens = list(get("tokens"))
        return cls(label, token_pieces(tokenizer, tokens), list(get("token_origins") or []),
                   list(get("token_steps") or []), note)

    def html(self) -> str:
        if not self.origins:  # nothing recorded: plain text
            return f'<span class="tv-text">{_visible("".join(self.pieces))}</span>'
        spans, previous_step = [], None
        for index, (piece, origin, step) in enumerate(zip(self.pieces, self.origins, self.steps)):
            classes = ["tk"] + (["step"] if step != previous_step and index else []) + (
                ["side"] if origin.endswith(SIDE_BRANCH) else [])
            tooltip = f"step {step} · {origin} · token {index + 1}: {piece!r}"
            spans.append(f'<span class="{" ".join(classes)}" style="background:{_colour(origin)}" '
                         f'title="{html.escape(tooltip)}">{_visible(piece)}</span>')
            previous_step = step
        return f'<span class="tv-text">{"".join(spans)}</span>'


def legend_html(origins: Sequence[str]) -> str:
    """Swatches for the origins that occur, in a fixed order."""
    seen = {origin.removesuffix(SIDE_BRANCH) for origin in origins}
    items = [f'<span class="tk" style="background:{COLOURS[o]}">&nbsp;</span>{html.escape(MEANING[o])}'
             for o in COLOURS if o in seen]
    if any(origin.endswith(SIDE_BRANCH) for origin in origins):
        items.append('<span class="tk side">&nbsp;</span>a token tree\'s other branch (not its parent\'s first child)')
    items.append('<span class="tk step" style="border:none">&nbsp;</span>a new target forward (step)')
    return f'<div class="tv-legend">{"".join(items)}</div>'


@dataclass
class TokenViews:
    """Several methods' texts of one prompt, one row each, under one legend."""

    title: str
    texts: list[TokenText] = field(default_factory=list)

    def html(self) -> str:
        rows = "".join(f'<tr><td class="tv-label">{html.escape(text.label)}'
                       f'{f"<small>{html.escape(text.note)}</small>" if text.note else ""}</td>'
                       f'<td>{text.html()}</td></tr>' for text in self.texts)
        origins = [origin for text in self.texts for origin in text.origins]
        return (f'<div class="tv">{STYLE}<table><caption>{html.escape(self.title)}</caption>{rows}</table>'
                f'{legend_html(origins)}</div>')

    def _repr_html_(self) -> str:
        return self.html()


def trajectory_html(trace: BlockTrace, tokenizer, title: str = "One Jacobi block converging") -> str:
    """The block as fed to each iteration (a row each) and its fixed point (the last row): a token
    already certain (fixed, or the open part's first token, predicted from a certain context), a guess
    already right (it will stay), or a guess still wrong."""
    fixed_point = trace.fixed_point
    pieces = token_pieces(tokenizer, fixed_point)
    fixed_before, rows = 0, []
    for iteration, state in enumerate(trace.states):
        cells = []
        for position, token in enumerate(state[:len(fixed_point)]):
            right = token == fixed_point[position]
            colour = (COLOURS[DRAFT_MODEL] if position <= fixed_before else
                      COLOURS[STATIONARY] if right else "#f1f1f1")
            piece = pieces[position] if right else token_pieces(tokenizer, [token])[0]
            cells.append(f'<td style="background:{colour}" title="iteration {iteration + 1}, position {position + 1}">'
                         f'{_visible(piece)}</td>')
        rows.append(f'<tr><td class="tv-label">iteration {iteration + 1}</td>{"".join(cells)}</tr>')
        fixed_before += trace.fixed_per_iteration[iteration] if iteration < len(trace.fixed_per_iteration) else 0
    cells = "".join(f'<td style="background:{COLOURS[DRAFT_MODEL]}">{_visible(p)}</td>' for p in pieces)
    rows.append(f'<tr><td class="tv-label">fixed point</td>{cells}</tr>')
    legend = "".join(f'<span class="tk" style="background:{colour}">&nbsp;</span>{what}' for colour, what in (
        (COLOURS[DRAFT_MODEL], "certain"), (COLOURS[STATIONARY], "a guess already right, not yet fixed"),
        ("#f1f1f1", "a guess still wrong")))
    return (f'<div class="tv">{STYLE}<table class="tv-grid"><caption>{html.escape(title)}</caption>{"".join(rows)}'
            f'</table><div class="tv-legend">{legend}</div></div>')


class HTML:
    """A finished HTML string that notebooks display as it is."""

    def __init__(self, text: str):
        self.text = text

    def _repr_html_(self) -> str:
        return self.text


def _quantization(row) -> str:
    """The target's quantization; a method without a weights record runs the unquantized model."""
    quantization = row.get("quantization")
    return quantization if isinstance(quantization, str) else "none"


def weights_label(row) -> str:
    """"nf4", or "target nf4, draft int8" for a speculative pair."""
    draft = row.get("draft_quantization")
    return f"target {row.quantization}, draft {draft}" if isinstance(draft, str) else str(row.get("quantization"))


def views_of_rows(rows, tokenizer, title: str = "What each method wrote, token by token") -> HTML:
    """For each kind of text, its first prompt: every method whose rows label their tokens (the kit's
    decoders; peers' own loops cannot say), in the rows' order, each noting its tokens per target
    forward and where its text parts from the kit's AR on the same engine, if it does. The engine is
    named where the rows run on more than one."""
    show_engine = rows.engine.nunique() > 1
    show_weights = any(column in rows and rows[column].nunique() > 1 for column in ("quantization", "draft_quantization"))
    first = rows[rows.repeat == 0]
    parts = [f'<div class="tv">{STYLE}<p><b>{html.escape(title)}</b>: one prompt of each kind. Hover a token '
             f'for its step and origin.</p></div>']
    for kind in dict.fromkeys(first.category):
        prompt_rows = first[first.prompt_id == first[first.category == kind].prompt_id.iloc[0]]
        ours_ar = prompt_rows[(prompt_rows.role == "target AR") & (prompt_rows.implementation == "ours")]
        # AR's text on each engine and target weights
        reference = {(row.engine, _quantization(row)): list(row.tokens) for _, row in ours_ar.iterrows()}
        texts = []
        for _, row in prompt_rows.iterrows():
            if not isinstance(row.get("token_origins"), list) or not row["token_origins"]:
                continue
            label = short_label(source_from_columns(row, row.implementation), row.role, row.implementation)
            if isinstance(row.get("model_role"), str) and row.model_role != "target":
                label += f" · {row.model_role}"  # another model's text (the CLLM's)
            if show_engine:
                label += f" · {row.engine}"
            if show_weights:
                label += f" · {weights_label(row)}"
            note = f"{row.tokens_per_target_forward:.2f} tokens/forward" if row.target_forwards else "no target forward"
            own_ar = reference.get((row.engine, _quantization(row)))
            if own_ar is not None and row.role != "target AR":
                same = common_prefix_length(list(row.tokens), own_ar)
                note += ("; AR's text" if same == len(own_ar) == len(row.tokens)
                         else f"; parts from AR's text at token {same + 1}")
            texts.append(TokenText.of(label, row, tokenizer, note))
        parts.append(TokenViews(f"{kind}: prompt {prompt_rows.prompt_id.iloc[0]}", texts).html())
    return HTML("".join(parts))
