"""The token views: each token's text as it reads in the whole, every coloured token one the decoder
counted (accepted tokens per step sum to the tokens coloured as accepted), escaping, the Jacobi grid,
the per-kind views built from result rows, and the picture Chromium draws of them."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pandas as pd
import pytest
from tokenizers import Tokenizer, decoders, models as token_models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from test_provenance import COPY, DRAFT, REPETITIVE, TARGET_MODEL
from tiny import PROMPT
from specdec_lab import token_view
from specdec_lab.decoders import autoregressive, jacobi, speculative
from specdec_lab.decoders.candidates import DraftModelCandidates, PromptLookupCandidates
from specdec_lab.method import CandidateSource, Method
from specdec_lab.result import CORRECTION, DRAFT_MODEL, PROMPT_LOOKUP, TARGET
from specdec_lab.runs.bench import result_row

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
IN_CI = os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE (as Qwen's and SmolLM's): one character may span several tokens."""
    tokenizer = Tokenizer(token_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    text = ["def héllo(wörld):\n    return wörld ✓ < & >"] * 20
    tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


class WordTokenizer:
    """Token i reads "w<i> ": enough to see which token went where."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"w{i} " for i in ids)


def test_pieces_read_as_the_whole_text_even_across_multibyte_characters(byte_level):
    text = "def héllo(wörld):\n    return wörld ✓ 日本"  # 日本: never seen in training, a token per byte
    tokens = byte_level.encode(text)
    pieces = token_view.token_pieces(byte_level, tokens)
    assert len(pieces) == len(tokens) and "".join(pieces) == byte_level.decode(tokens) == text
    assert sum(piece == "" for piece in pieces) >= 1  # a half-character token shows on the token completing it


def spans(html: str) -> list[tuple[str, str]]:
    """(background colour, tooltip) of every coloured token."""
    return re.findall(r'<span class="tk[^"]*" style="background:(#[0-9a-f]{6})" title="([^"]*)"', html)


@pytest.mark.parametrize("source", [lambda: DraftModelCandidates(DRAFT, 3), lambda: PromptLookupCandidates(4)])
def test_the_accepted_colour_covers_exactly_the_tokens_the_decoder_counted_accepted(source):
    result = speculative.generate(TARGET_MODEL, source(), REPETITIVE, 40, stop_ids=[])
    coloured = spans(token_view.TokenText.of("m", result, WordTokenizer()).html())
    assert len(coloured) == len(result.tokens)
    accepted = [colour for colour, _ in coloured if colour in (token_view.COLOURS[DRAFT_MODEL], token_view.COLOURS[PROMPT_LOOKUP])]
    corrections = [colour for colour, _ in coloured if colour == token_view.COLOURS[CORRECTION]]
    assert len(accepted) == sum(result.accepted_per_step) > 0
    assert len(corrections) == sum(a < p for a, p in zip(result.accepted_per_step, result.proposed_per_step)) > 0
    steps = [int(re.match(r"step (\d+)", tooltip).group(1)) for _, tooltip in coloured]
    assert steps == result.token_steps


def test_a_token_that_looks_like_markup_is_shown_not_run():
    text = token_view.TokenText("m", ["<script>", "&", '"'], [TARGET] * 3, [0, 1, 2])
    shown = text.html()
    assert "<script>" not in shown and "&lt;script&gt;" in shown and "&amp;" in shown


def test_the_legend_names_only_the_origins_that_occur():
    views = token_view.TokenViews("t", [token_view.TokenText("m", ["a", "b"], [TARGET, CORRECTION], [0, 1])])
    legend = re.search(r'<div class="tv-legend">(.*?)</div>', views.html()).group(1)
    legend = html.unescape(legend)
    assert token_view.MEANING[CORRECTION] in legend and token_view.MEANING[DRAFT_MODEL] not in legend


def test_a_text_without_labels_is_plain_text():
    shown = token_view.TokenText("peer", ["a", "b"], [], []).html()
    assert "ab" in shown and 'class="tk' not in shown


def test_the_jacobi_grid_shows_each_iteration_and_what_was_certain_by_then():
    result = jacobi.generate(COPY, PROMPT, 14, block_size=7, stop_ids=[], record_states=True)
    trace = result.jacobi.traces[0]
    grid = token_view.trajectory_html(trace, WordTokenizer())
    rows = re.findall(r"<tr>(.*?)</tr>", grid)
    assert len(rows) == len(trace.states) + 1  # every iteration, then the fixed point
    certain = token_view.COLOURS[DRAFT_MODEL]
    fixed = 0
    for row, fixed_now in zip(rows, trace.fixed_per_iteration):
        assert row.count(f"background:{certain}") >= fixed + 1  # fixed ones plus the open part's first
        fixed += fixed_now
    assert rows[-1].count(f"background:{certain}") == len(trace.fixed_point)


def method(name, decode, role, source=None, lossless=True):
    return Method(name, decode, lossless=lossless, role=role, source=source)


def test_views_from_rows_show_one_prompt_per_kind_with_short_labels_and_notes():
    """Labels come from the methods' records, the notes from the rows; the peer's loop (no labels) is left out."""
    ar = method("target AR (ours)", lambda p: autoregressive.generate(TARGET_MODEL, p, 16, stop_ids=[]), "target AR")
    spec = method("a long display name", lambda p: speculative.generate(TARGET_MODEL, DraftModelCandidates(DRAFT, 3), p, 16,
                                                                         stop_ids=[]),
                  "speculative", CandidateSource("draft model", k=3, schedule="constant"))
    peer = method("peer", lambda p: autoregressive.generate(TARGET_MODEL, p, 16, stop_ids=[]), "target AR")
    rows = []
    for kind, prompt_id, prompt in (("code", "c1", REPETITIVE), ("code", "c2", PROMPT), ("chat", "h1", PROMPT)):
        for m in (ar, spec, peer):
            row = result_row(m(prompt), WordTokenizer(), **m.labels(), prompt_id=prompt_id, category=kind, repeat=0)
            if m is peer:
                row.update(token_origins=[], token_steps=[], implementation="transformers")
            rows.append(row)
    shown = token_view.views_of_rows(pd.DataFrame(rows), WordTokenizer())._repr_html_()
    assert re.findall(r"<caption>(.*?)</caption>", shown) == ["code: prompt c1", "chat: prompt h1"]
    labels = re.findall(r'<td class="tv-label">([^<]*)<small>([^<]*)</small>', shown)
    assert [label for label, _ in labels] == ["AR", "draft k=3"] * 2
    assert all(html.unescape(note).endswith("AR's text") for label, note in labels if label != "AR")


@pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason="headless Chromium is not installed (.ci/run installs it)")
def test_chromium_draws_the_colours_and_the_legend(tmp_path):
    """A screenshot of a view: the draft's green and the correction's red are on the page, and the
    rendered DOM holds the legend."""
    assert CHROMIUM is not None, "CI=true but headless Chromium is missing: .ci/run must install it"
    from PIL import Image

    result = speculative.generate(TARGET_MODEL, DraftModelCandidates(DRAFT, 3), REPETITIVE, 40, stop_ids=[])
    page = tmp_path / "view.html"
    page.write_text(f"<html><body>{token_view.TokenViews('t', [token_view.TokenText.of('draft', result, WordTokenizer())]).html()}"
                    "</body></html>")
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
              f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,400"]
    shot = tmp_path / "view.png"
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    colours = {"#%02x%02x%02x" % rgb for _, rgb in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24)}
    assert {token_view.COLOURS[DRAFT_MODEL], token_view.COLOURS[CORRECTION]} <= colours
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    assert token_view.MEANING[DRAFT_MODEL] in html.unescape(dom) and 'class="tv-legend"' in dom
