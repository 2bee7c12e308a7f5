import math

import pandas as pd
import pytest

from specdec_lab import cost_model, metrics


def rows():
    """Two decoders, two prompts, two repeats; 'fast' takes half the time and diverges on prompt b."""
    records = []
    for prompt, category in (("a", "code"), ("b", "chat")):
        for repeat in (0, 1):
            base_time = 2.0 + repeat
            records.append(dict(decoder="ar", prompt_id=prompt, category=category, repeat=repeat,
                                tokens=[1, 2, 3, 4], wall_time_s=base_time, accepted_per_step=[0, 0, 0],
                                proposed_per_step=[0, 0, 0]))
            records.append(dict(decoder="fast", prompt_id=prompt, category=category, repeat=repeat,
                                tokens=[1, 2, 3, 4] if prompt == "a" else [1, 9, 3, 4], wall_time_s=base_time / 2,
                                accepted_per_step=[2, 0], proposed_per_step=[2, 2]))
    frame = pd.DataFrame(records)
    frame["tokens_per_second"] = frame.tokens.str.len() / frame.wall_time_s
    frame["ms_per_token"] = 1000 * frame.wall_time_s / frame.tokens.str.len()
    frame["time_to_first_token_s"] = 0.1
    frame["tokens_per_target_forward"] = 1.0
    frame["acceptance_rate"] = 0.5
    frame["peak_memory_bytes"] = 2**20
    return frame


def test_speedup_is_a_side_by_side_ratio():
    speed = metrics.speedups(rows(), "ar")
    assert set(speed[speed.decoder == "fast"].speedup) == {2.0}
    found = metrics.mean_speedup(rows(), "fast", "ar")
    assert (found.value, found.low, found.high, found.prompts) == (pytest.approx(2.0), pytest.approx(2.0),
                                                                   pytest.approx(2.0), 2)
    assert found.aggregate == "geometric mean over prompts"


def test_speedup_compares_time_per_generated_token_not_wall_time():
    """A method that stops after half the tokens in half the time is not faster per token (fault:
    wall-time ratios of runs of different length); its latency ratio says 2x, and the pair is counted."""
    frame = rows()
    short = frame.decoder == "fast"
    frame.loc[short, "tokens"] = frame.loc[short, "tokens"].map(lambda t: t[:2])
    frame.loc[short, "wall_time_s"] = frame.loc[frame.decoder == "ar", "wall_time_s"].to_numpy() / 2
    frame = frame.drop(columns=["ms_per_token", "tokens_per_second"])
    table = metrics.speedup_table(frame, "ar")
    assert table.loc["fast", "speedup"] == pytest.approx(1.0)
    assert table.loc["fast", "latency_ratio"] == pytest.approx(2.0)
    assert table.loc["fast", "pairs_of_other_length"] == 4 and table.loc["ar", "pairs_of_other_length"] == 0


def test_bootstrap_interval_over_prompts():
    low, high = metrics.bootstrap_interval([1.0, 2.0, 4.0, 8.0])
    assert low < metrics.geometric_mean([1.0, 2.0, 4.0, 8.0]) < high and 1.0 <= low and high <= 8.0
    assert (low, high) == metrics.bootstrap_interval([1.0, 2.0, 4.0, 8.0])  # seeded: reports reproduce
    assert all(math.isnan(v) for v in metrics.bootstrap_interval([3.0]))  # one prompt has no spread


def test_tokens_per_second_is_aggregated_like_the_speedup():
    """Both are geometric means over prompts, so with one repeat their ratio is the speedup (fault:
    a median tokens/s beside a geometric-mean speedup disagreed)."""
    frame = rows()[lambda r: r.repeat == 0].copy()
    frame.loc[(frame.decoder == "fast") & (frame.prompt_id == "b"), "wall_time_s"] *= 4  # 0.5x on prompt b
    frame["tokens_per_second"] = frame.tokens.str.len() / frame.wall_time_s
    frame["ms_per_token"] = 1000 * frame.wall_time_s / frame.tokens.str.len()
    table = metrics.summary(frame, "ar")
    ratio = table.loc["fast", "tokens_per_second"] / table.loc["ar", "tokens_per_second"]
    assert ratio == pytest.approx(table.loc["fast", "speedup"]) == pytest.approx(1.0)


def test_agreement_finds_the_first_divergence():
    agreed = metrics.add_agreement(rows(), "ar").set_index(["decoder", "prompt_id", "repeat"])
    assert agreed.loc[("fast", "a", 0)].full_match
    assert agreed.loc[("fast", "b", 0)].first_divergence == 1
    assert agreed.loc[("fast", "b", 0)].agreement == pytest.approx(0.25)


def test_summary_has_one_line_per_decoder():
    table = metrics.summary(rows(), "ar")
    assert table.loc["fast", "speedup"] == pytest.approx(2.0)
    assert table.loc["fast", "full_match_rate"] == pytest.approx(0.5)


def test_acceptance_by_position_is_the_per_position_rate():
    """Steps (accepted, proposed) = (2, 2) and (0, 2): position 1 is accepted in 1 of 2 steps; position
    2 is reached in 1 step and accepted there: 1.0 per position (the cumulative rate would say 0.5)."""
    table = metrics.acceptance_by_position(rows()[lambda r: r.decoder == "fast"]).set_index("position")
    assert table.loc[1, "acceptance"] == pytest.approx(0.5) and table.loc[2, "acceptance"] == pytest.approx(1.0)
    assert table.loc[2, "steps"] == 4  # one step per row reached position 2


def test_alpha_is_counted_from_the_tokens_actually_proposed():
    assert cost_model.acceptance_alpha([[2, 0]], [[2, 2]]) == pytest.approx(2 / 3)  # 2 accepted, 1 rejection
    # the last step proposed 1 token (the generation's end) and kept it: no rejection anywhere
    assert cost_model.acceptance_alpha([[3, 1]], [[3, 1]]) == 1.0


def test_leviathan_prediction():
    # a = 0.8, k = 4, c = 0.25: (1 - 0.8^5) / (0.2 * 2) = 1.6805
    assert cost_model.predicted_speedup(0.8, 4, 0.25) == pytest.approx((1 - 0.8**5) / (0.2 * 2.0))
    assert cost_model.predicted_speedup(1.0, 4, 0.0) == 5


def test_geometric_mean_ignores_missing_values():
    assert metrics.geometric_mean([2.0, 8.0, float("nan")]) == pytest.approx(4.0)
    assert math.isnan(metrics.geometric_mean([]))


def test_missing_baseline_is_named():
    with pytest.raises(ValueError, match="baseline decoder 'nope'"):
        metrics.speedups(rows(), "nope")


def test_decode_tokens_per_second_leaves_the_prefill_out():
    """Catches the prefill charged to the decode loop (tokens / wall time) and the first token
    counted as decoded: 4 tokens, the first after 3 s, the other 3 in the next 1.5 s."""
    rows = pd.DataFrame({"tokens": [[1, 2, 3, 4], [1]], "wall_time_s": [4.5, 1.0], "time_to_first_token_s": [3.0, 1.0]})
    decode = metrics.decode_tokens_per_second(rows)
    assert decode.iloc[0] == pytest.approx(2.0)
    assert math.isnan(decode.iloc[1])  # one token: nothing was decoded after the prefill


def test_the_compact_table_reads_short_names_one_interval_cell_and_counts():
    import pandas as pd
    from specdec_lab import words

    table = pd.DataFrame({"speedup": [1.234, 0.9, float("nan")], "speedup_low": [1.1, float("nan"), float("nan")],
                          "speedup_high": [1.37, float("nan"), float("nan")], "prompts": [5.0, 1.0, 0.0],
                          "agreement": [0.98765, 1.0, 0.5]}, index=["a very long method name (ours)", "b", "c"])
    compact = words.compact_table(table, {"speedup": "speedup (95% CI)", "prompts": "prompts", "agreement": "agreement"},
                                  {"a very long method name (ours)": "a"})
    assert list(compact.index) == ["a", "b", "c"] and list(compact.columns) == ["speedup (95% CI)", "prompts", "agreement"]
    assert list(compact["speedup (95% CI)"]) == ["1.23 (1.10-1.37)", "0.90", "-"]
    assert list(compact.prompts) == [5, 1, 0] and list(compact.agreement) == [0.99, 1.0, 0.5]


def test_short_names_tell_methods_apart_by_their_records():
    import pandas as pd
    from specdec_lab import words
    from specdec_lab.method import CandidateSource, Method, Weights, source_columns

    def row(name, source, implementation="ours", role="speculative", weights=Weights()):
        return {"decoder": name, "implementation": implementation, "role": role, "engine": "transformers",
                **source_columns(source), **weights.columns()}
    draft = CandidateSource("draft model", k=5, schedule="heuristic")
    rows = pd.DataFrame([row("target AR (ours)", None, role="target AR"),
                         row("ours, long", draft), row("theirs, long", CandidateSource("draft model", "transformers", k=5, schedule="heuristic"), "transformers"),
                         row("pair nf4", draft, weights=Weights(quantization="nf4", draft_quantization="none")),
                         row("pair int8", draft, weights=Weights(quantization="int8", draft_quantization="none"))])
    names = words.short_names(rows)
    assert names["target AR (ours)"] == "AR" and names["theirs, long"] == "draft k=5 adaptive · transformers"
    assert names["pair nf4"] == "draft k=5 adaptive · nf4/none" and names["pair int8"] == "draft k=5 adaptive · int8/none"
    assert len(set(names.values())) == len(names)
