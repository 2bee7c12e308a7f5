"""The typed records every layer reads (method, candidate source, speedup) and the words they
become: each test names the plausible bug it catches."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdec_lab import metrics, words
from specdec_lab.experiments import lineups
from specdec_lab.method import (CandidateSource, HybridSettings, LookaheadConfig, Method, SuffixSettings, Weights,
                                source_columns, source_from_columns)
from specdec_lab.metrics import Speedup
from specdec_lab.runs import bench


@pytest.mark.parametrize("source", [
    lineups.draft_source(5, "heuristic", 0.4), lineups.draft_source(3),
    lineups.prompt_lookup_source(10), lineups.prompt_lookup_source(10, "latest"),
    lineups.prompt_lookup_source(10, implementation="transformers"),
    lineups.hybrid_source(5, 10, HybridSettings(0.3, False)),
    lineups.hybrid_source(5, 10, HybridSettings(0.9, True), cost_sized=True, suffix_k=16,
                          suffix=SuffixSettings(spec_factor=4.0)),
    CandidateSource("lookahead", lookahead=LookaheadConfig(5, 3, pool_from_prompt=True)),
    CandidateSource("jacobi", block_size=16, init="prompt_tokens")])
def test_a_source_survives_the_round_trip_through_a_frame(source):
    """Catches a field dropped from the columns, a whole number read back as a float, a missing value
    read back as NaN (NaN != NaN: the picker's predictions would never meet their measurements)."""
    frame = pd.DataFrame([source_columns(source), source_columns(None)])  # a None beside: columns become floats
    assert source_from_columns(frame.iloc[0], source.implementation) == source
    assert source_from_columns(frame.iloc[1], "ours") is None


def test_sources_that_propose_differently_are_different_records():
    """Catches an identity that ignores a setting: a hybrid with other settings, or our prompt lookup
    and transformers', would be joined to each other's measurements."""
    assert lineups.hybrid_source(5, 10, HybridSettings(0.6, True)) != lineups.hybrid_source(5, 10, HybridSettings(0.3, True))
    assert lineups.prompt_lookup_source(10) != lineups.prompt_lookup_source(10, implementation="transformers")
    # the hybrid with suffix decoding in prompt lookup's place is another source
    assert lineups.hybrid_source(5, 10, HybridSettings()) != lineups.hybrid_source(5, 10, HybridSettings(), suffix_k=16)
    assert lineups.draft_source(5, "heuristic", 0.4) != lineups.draft_source(5, "heuristic", 0.0)


def test_records_refuse_unknown_values_and_a_mismatched_implementation():
    with pytest.raises(ValueError, match="schedule 'adaptive'"):
        lineups.draft_source(5, "adaptive")
    with pytest.raises(ValueError, match="kind 'medusa'"):
        CandidateSource("medusa")
    with pytest.raises(ValueError, match="give both the same implementation"):
        Method("m", print, lossless=True, role="speculative", implementation="ours",
               source=lineups.prompt_lookup_source(4, implementation="transformers"))


def test_lookahead_config_defaults_g_to_w_and_counts_its_pass():
    """Catches G defaulting to something other than W, and the pass size missing the current token."""
    config = LookaheadConfig.from_mapping({"window": 5, "ngram_size": 3})
    assert config.candidates == 5 and config.tokens_per_pass == 1 + (5 + 5) * 2
    assert config.label() == "W=5 N=3 G=5"
    assert LookaheadConfig(4, 2, 1, pool_from_prompt=True).label() == "W=4 N=2 G=1 + prompt n-grams"
    assert lineups.lookahead_name({"window": 5, "ngram_size": 3}) == "Lookahead W=5 N=3 G=5 (base)"


def test_method_labels_give_every_row_the_same_columns():
    """Catches rows of AR and of a speculative method with different columns (a frame of both then
    holds NaN where a table expects None, or misses a column)."""
    ar = Method("ar", print, lossless=True, role="target AR", weights=Weights("target", "nf4"))
    spec = Method("spec", print, lossless=True, role="speculative", source=lineups.draft_source(4),
                  weights=Weights("target", "none", "int4-wo", False))
    assert set(ar.labels()) == set(spec.labels())
    assert ar.labels()["quantization"] == "nf4" and ar.labels()["source_kind"] is None
    assert spec.labels()["k"] == 4 and spec.labels()["draft_quantization"] == "int4-wo"


def test_over_prompts_is_a_geometric_mean_with_its_interval():
    """Catches an arithmetic mean (2.5 here, not 2.0), a NaN that spoils the mean, and a prompt count
    that leaves out a prompt whose value is missing (every prompt measured is counted, as before)."""
    found = metrics.over_prompts([1.0, 4.0, float("nan")])
    assert found.value == pytest.approx(2.0) and found.prompts == 3
    assert found.low <= found.value <= found.high and found.aggregate == "geometric mean over prompts"
    assert math.isnan(metrics.over_prompts([3.0]).low)  # one prompt says nothing about the spread


def test_a_speedup_is_read_from_and_written_to_table_columns():
    line = pd.Series({"vs_llama_cpp": 1.5, "vs_llama_cpp_low": 1.2, "vs_llama_cpp_high": 1.9, "prompts": 4.0})
    found = Speedup.from_line(line, "vs_llama_cpp")
    assert found == Speedup(1.5, 1.2, 1.9, 4)
    assert found.columns() == {"speedup": 1.5, "speedup_low": 1.2, "speedup_high": 1.9, "prompts": 4}


def test_interval_words_and_markdown_tables():
    assert words.interval(Speedup(1.523, 1.31, 1.744, 10)) == "1.52x (95% CI 1.31-1.74, 10 prompts)"
    assert words.interval(Speedup(0.9, float("nan"), float("nan"), 1)) == "0.90x (1 prompt, no interval)"
    assert words.interval(Speedup(0.9, float("nan"), float("nan"), 1), compact=True) == "0.90 (1 prompt, no interval)"
    frame = pd.DataFrame({"method": ["a", "b"], "speedup": [Speedup(2.0, 1.5, 2.5, 3), 1.0],
                          "tokens/s": [12.345, float("nan")]})
    assert words.markdown_table(frame, {"tokens/s": ".1f", "speedup": ".2f"}).splitlines() == [
        "| method | speedup | tokens/s |", "|---|---|---|",
        "| a | 2.00x (95% CI 1.50-2.50, 3 prompts) | 12.3 |", "| b | 1.00 | - |"]
    assert words.bullets(["x", "y"]) == "- x\n- y"
    assert words.interval(Speedup(1.523, 1.31, 1.744, 10), compact=True) == "1.52 (1.31-1.74, 10 prompts)"
    assert words.interval(Speedup(1.523, 1.31, 1.744, 10), compact=True, prompts=False) == "1.52 (1.31-1.74)"
    assert words.markdown_table(pd.DataFrame({"x": ["1.52 (1.31-1.74)"]}), {"x": ".2f"}).endswith("| 1.52 (1.31-1.74) |")


def test_profile_sentence_lists_exactly_the_parameters_that_differ():
    """Catches a sentence that states this run's sizes from anywhere but its parameters."""
    config = {"profile": "cpu", "results_dir": "results/cpu", "num_prompts": 5, "max_new_tokens": 32, "k": 5}
    full = {**config, "profile": "cpu-full", "results_dir": "results/cpu-full", "num_prompts": 10}
    text = words.profile_sentence(config, "cpu-full", full)
    assert "`num_prompts`: 5 here, 10 in `cpu-full`" in text and "max_new_tokens" not in text and "differ in 1 parameter:" in text
    assert words.profile_sentence(full, "cpu-full", full) == "This run uses the `cpu-full` profile."
    assert "no parameter file" in words.profile_sentence(config, "cpu-full", {})


def test_the_environment_names_the_cpu_and_its_kernel_flags(tmp_path):
    """Catches a result recorded with "x86_64" only: the same code runs 2.6x apart on two CPUs."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert bench.cpu_model(str(cpuinfo)) == {"cpu_model": "AMD EPYC 9R14", "cpu_flags": ["avx512_bf16", "avx512f", "avx2"]}
    assert bench.cpu_model(str(tmp_path / "missing")) == {"cpu_model": None, "cpu_flags": None}
