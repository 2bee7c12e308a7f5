"""Notebook 03's tables on synthetic rows (no model runs): each test names the plausible bug it catches."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdec_lab import cost_model, metrics
from specdec_lab.experiments import quantized_tables as qt
from specdec_lab.experiments import quantized_words
from specdec_lab.experiments.lineups import draft_source, prompt_lookup_source
from specdec_lab.method import NO_WEIGHTS, source_columns


def row(decoder, prompt_id, wall_time_s, tokens=range(8), repeat=0, first_token_s=0.2, **labels):
    tokens = list(tokens)
    return {"decoder": decoder, "prompt_id": prompt_id, "repeat": repeat, "category": "code", "tokens": tokens,
            "wall_time_s": wall_time_s, "time_to_first_token_s": first_token_s, "num_tokens": len(tokens),
            "ms_per_token": 1000 * wall_time_s / len(tokens), "tokens_per_second": len(tokens) / wall_time_s,
            "peak_memory_bytes": 2**20, "tokens_per_target_forward": 1.0, "acceptance_rate": 0.0,
            "accepted_per_step": [], "proposed_per_step": [], **{**source_columns(None), **NO_WEIGHTS, **labels}}


def ar_rows() -> pd.DataFrame:
    """Two prompts; nf4 is 2x faster on "a" and 1.25x on "b", and differs from unquantized after 4 tokens on "b"."""
    rows = []
    for prompt, none_s, nf4_s in (("a", 1.0, 0.5), ("b", 1.0, 0.8)):
        rows.append(row("target bf16", prompt, none_s, model_role="target", quantization="none", role="target AR",
                        lossless=True, implementation="ours"))
        nf4_tokens = range(8) if prompt == "a" else [0, 1, 2, 3, 9, 9, 9, 9]
        rows.append(row("target nf4", prompt, nf4_s, tokens=nf4_tokens, model_role="target", quantization="nf4",
                        role="target AR", lossless=False, implementation="ours"))
    return pd.DataFrame(rows)


def footprints() -> pd.DataFrame:
    return pd.DataFrame([
        {"model_role": "target", "quantization": q, "variant": f"target {q}", "label": q, "weight_bytes": w,
         "bytes_read_per_token": w, "kv_cache_bytes": 2**20, "kv_cache_tokens": 40, "perplexity": p}
        for q, w, p in (("none", 4 * 2**20, 10.0), ("nf4", 2**20, 11.0))])


def test_footprint_table_compares_each_variant_with_the_same_model_unquantized():
    """Catches a speed ratio taken the wrong way round or as a mean of wall times, agreement scored
    against the variant itself, and a roofline fraction computed from tokens/s with the prefill."""
    table = qt.footprint_table(footprints(), ar_rows(), bandwidth=8 * 2**20).set_index("quantization")
    assert table.speed_vs_unquantized["nf4"] == pytest.approx(math.sqrt(2.0 * 1.25))  # geometric mean per prompt
    assert table.speed_vs_unquantized["none"] == pytest.approx(1.0)
    assert table.weights_vs_unquantized["nf4"] == pytest.approx(0.25)
    assert table.agreement["nf4"] == pytest.approx((1.0 + 4 / 8) / 2) and table.agreement["none"] == 1.0
    # decoding alone: 7 tokens after the first in wall - 0.2 s
    decode = metrics.geometric_mean([7 / 0.3, 7 / 0.6])
    assert table.decode_tokens_per_second["nf4"] == pytest.approx(decode)
    assert table.fraction_of_bound["nf4"] == pytest.approx(decode / 8.0)  # 8 MB/s over 1 MB a token


def grid_rows() -> pd.DataFrame:
    """One target variant's group: AR, a draft pair, our prompt lookup and llama.cpp's AR."""
    pair = {"model_role": "target", "quantization": "none", "draft_quantization": "int4-wo", "self_draft": False}
    rows = []
    for prompt in ("a", "b"):
        rows.append(row("target bf16 AR", prompt, 1.0, role="target AR", lossless=True, implementation="ours",
                        model_role="target", quantization="none"))
        rows.append(row("target bf16 · draft int4", prompt, 0.5, role="speculative", lossless=True,
                        implementation="ours", accepted_per_step=[3, 1, 0], proposed_per_step=[4, 4, 2],
                        **source_columns(draft_source(4)), **pair))
        rows.append(row("lookup", prompt, 0.25, role="speculative", lossless=True, implementation="ours",
                        tokens=range(8) if prompt == "a" else [0, 1, 5, 5, 5, 5, 5, 5],
                        accepted_per_step=[2], proposed_per_step=[5], **source_columns(prompt_lookup_source(5)),
                        model_role="target", quantization="none"))
        rows.append(row("llama.cpp AR", prompt, 0.4, role="target AR", lossless=False, implementation="llama.cpp"))
    return qt.label_pairs(pd.DataFrame(rows), "none", "bfloat16", baseline="target bf16 AR")


def test_label_pairs_reads_each_rows_weights():
    """Catches a draft label taken from another row or given to rows that are no pair."""
    rows = grid_rows().drop_duplicates("decoder").set_index("decoder")
    assert rows.draft["target bf16 · draft int4"] == "int4 weight-only"
    assert rows.draft[["lookup", "llama.cpp AR", "target bf16 AR"]].isna().all()
    assert (rows.target == "bf16").all() and (rows.baseline == "target bf16 AR").all()


def test_speculative_table_pools_acceptance_and_leaves_llama_cpp_out():
    """Catches acceptance averaged per step instead of pooled, a speedup against llama.cpp's AR, and
    llama.cpp's row counted as one of our sources."""
    unquantized = grid_rows()[lambda r: r.decoder == "target bf16 AR"]
    table = qt.speculative_table(grid_rows(), unquantized).set_index("pair")
    assert set(table.index) == {"target bf16 · draft int4", "lookup"}
    assert table.acceptance_rate["target bf16 · draft int4"] == pytest.approx(4 / 10)  # per step: (3/4 + 1/4 + 0) / 3
    assert table.speedup["target bf16 · draft int4"] == pytest.approx(2.0)
    assert table.speedup["lookup"] == pytest.approx(4.0) and table.k["lookup"] == 5
    assert table.source.to_dict() == {"target bf16 · draft int4": "draft model", "lookup": "prompt lookup"}
    assert table.agreement_with_unquantized["lookup"] == pytest.approx((1.0 + 2 / 8) / 2)


def test_versus_llama_cpp_and_the_fastest_configuration_that_was_exact():
    """Catches the ratio inverted, llama.cpp compared with itself, and a fastest pick that is not
    exact on every prompt."""
    versus = qt.versus_llama_cpp(grid_rows()).set_index("configuration")
    assert "llama.cpp AR" not in versus.index
    assert versus.vs_llama_cpp["target bf16 AR"] == pytest.approx(0.4)  # llama.cpp: 0.4 s for the same 8 tokens
    assert versus.vs_llama_cpp["lookup"] == pytest.approx(1.6)
    best = qt.fastest_lossless(versus.reset_index())
    assert best.configuration == "target bf16 · draft int4"  # lookup is faster but left the AR text on "b"


def test_best_k_reads_the_pairs_own_curves():
    """Catches the draft's cost read from the target's curve and alpha counted from another pair
    (the cost model itself has its known-answer tests in test_statistics)."""
    rows = grid_rows()
    table = qt.speculative_table(rows, rows[rows.decoder == "target bf16 AR"])
    curves = pd.DataFrame([{"variant": variant, "n": n, "ms": ms} for variant, costs in
                           (("target bf16", {1: 100.0, 2: 105.0, 4: 110.0, 8: 150.0}),
                            ("draft int4 weight-only", {1: 20.0, 2: 21.0, 4: 22.0, 8: 30.0})) for n, ms in costs.items()])
    best_k = qt.best_k_table(table, rows, curves).set_index("pair").loc["target bf16 · draft int4"]
    alpha = cost_model.acceptance_alpha([[3, 1, 0]] * 2, [[4, 4, 2]] * 2)
    assert best_k.alpha == pytest.approx(alpha)
    assert (best_k.target_T1_ms, best_k.draft_T1_ms) == (100.0, 20.0)
    target_ms = curves[curves.variant == "target bf16"].set_index("n").ms
    assert best_k.predicted_at_k_run == pytest.approx(cost_model.predicted_speedup_from_costs(alpha, 4, target_ms, 20.0))
    assert best_k.best_k == cost_model.best_k_from_costs(alpha, target_ms, 20.0)[0]


def test_tradeoff_sentences_say_what_each_quantization_saves_and_costs():
    """Catches the verdict computed from the wrong sign of the weight change."""
    table = qt.footprint_table(footprints(), ar_rows())
    (sentence,) = quantized_words.tradeoff_sentences(table)
    assert "75% smaller" in sentence and "saves weight memory and is faster" in sentence
