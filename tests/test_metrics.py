import math

import pandas as pd
import pytest

from specdec_lab import metrics


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
    assert metrics.mean_speedup(rows(), "fast", "ar") == pytest.approx(2.0)


def test_agreement_finds_the_first_divergence():
    agreed = metrics.add_agreement(rows(), "ar").set_index(["decoder", "prompt_id", "repeat"])
    assert agreed.loc[("fast", "a", 0)].full_match
    assert agreed.loc[("fast", "b", 0)].first_divergence == 1
    assert agreed.loc[("fast", "b", 0)].agreement == pytest.approx(0.25)


def test_summary_has_one_line_per_decoder():
    table = metrics.summary(rows(), "ar")
    assert table.loc["fast", "speedup"] == pytest.approx(2.0)
    assert table.loc["fast", "full_match_rate"] == pytest.approx(0.5)


def test_acceptance_by_position():
    table = metrics.acceptance_by_position(rows()[lambda r: r.decoder == "fast"]).set_index("position")
    assert table.loc[1, "acceptance"] == pytest.approx(0.5) and table.loc[2, "acceptance"] == pytest.approx(0.5)


def test_leviathan_prediction_and_its_inverse():
    # a = 0.8, k = 4, c = 0.25: (1 - 0.8^5) / (0.2 * 2) = 1.6805
    assert metrics.predicted_speedup(0.8, 4, 0.25) == pytest.approx((1 - 0.8**5) / (0.2 * 2.0))
    assert metrics.predicted_speedup(1.0, 4, 0.0) == 5
    tokens_per_step = (1 - 0.7**4) / 0.3
    assert metrics.alpha_from_tokens_per_step(tokens_per_step, 3) == pytest.approx(0.7, abs=1e-6)


def test_geometric_mean_ignores_missing_values():
    assert metrics.geometric_mean([2.0, 8.0, float("nan")]) == pytest.approx(4.0)
    assert math.isnan(metrics.geometric_mean([]))


def test_missing_baseline_is_named():
    with pytest.raises(ValueError, match="baseline decoder 'nope'"):
        metrics.speedups(rows(), "nope")
