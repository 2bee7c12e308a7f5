"""The analysis of the experiment modules, on synthetic rows (no model runs): what the notebooks'
cells used to compute inline, now functions that can be wrong and are tested."""

from __future__ import annotations

import pandas as pd
import pytest

from specdec_lab import data, quality
from specdec_lab.cllm import train
from specdec_lab.experiments import (cllm, cllm_tables, cllm_words, common, lineups, speculative_tables,
                                     speculative_words, summary)
from specdec_lab.method import HybridSettings, Method, source_columns
from specdec_lab.runs import outputs


def row(decoder, prompt_id="p", repeat=0, tokens=(1, 2, 3), wall_time_s=1.0, target_forwards=3, **extra):
    return dict(decoder=decoder, prompt_id=prompt_id, repeat=repeat, tokens=list(tokens), wall_time_s=wall_time_s,
                target_forwards=target_forwards, **extra)


# --- 02: focus category and the fp32 control ------------------------------------------------------

def test_focus_category_is_code_when_present_else_the_first():
    assert speculative_tables.focus_category(pd.DataFrame({"category": ["writing", "code"]})) == "code"
    assert speculative_tables.focus_category(pd.DataFrame({"category": ["writing", "math"]})) == "writing"


def test_fp32_control_flags_a_declared_lossless_method_that_disagrees():
    control = pd.DataFrame([
        row(lineups.TARGET_AR, lossless=True, full_match=True),
        row("speculative k=3 (ours)", lossless=True, full_match=True),
        row("prompt lookup k=5 (ours)", lossless=True, full_match=False),  # a bug: declared lossless, differs
        row("draft-then-score (blog; not lossless)", lossless=False, full_match=False),  # allowed to differ
    ])
    assert list(speculative_tables.control_mismatches(control).decoder) == ["prompt lookup k=5 (ours)"]
    assert "1 fp32 samples differ" in speculative_words.control_findings(control)
    assert "agree exactly" in speculative_words.control_findings(control[control.decoder != "prompt lookup k=5 (ours)"])


# --- 02: the draft picker's predictions matched to the measured rows ------------------------------

def test_picker_predictions_are_matched_to_the_rows_that_measured_the_same_source():
    """Catches a record that never matches (a None schedule read back as NaN, a k read back as a
    float), a source matched to the peer's row, to the wrong category, or to a hybrid with other
    settings."""
    from specdec_lab.experiments import picker

    measured = {  # decoder: (its source, wall time of 8 tokens; AR takes 1.0 s)
        "spec adaptive": (lineups.draft_source(5, "heuristic", 0.4), 0.5),
        "assisted adaptive": (lineups.draft_source(5, "heuristic", 0.4, "transformers"), 0.25),
        "lookup ours": (lineups.prompt_lookup_source(10), 0.2),
        "lookup theirs": (lineups.prompt_lookup_source(10, implementation="transformers"), 0.4),
        "hybrid": (lineups.hybrid_source(5, 10, HybridSettings()), 0.8),
    }
    rows = [row(lineups.TARGET_AR, p, tokens=range(8), wall_time_s=1.0, implementation="ours", category="code",
                **source_columns(None)) for p in ("a", "b")]
    rows += [row(name, p, tokens=range(8), wall_time_s=wall, implementation=source.implementation, category="code",
                 **source_columns(source)) for name, (source, wall) in measured.items() for p in ("a", "b")]
    predictions = pd.DataFrame([
        {"source": name, **source_columns(source), "implementation": source.implementation, "prompt_id": "c",
         "category": "code", "tokens_per_target_forward": 2.0, "predicted_speedup": 2.2}
        for name, source in [("draft adaptive", lineups.draft_source(5, "heuristic", 0.4)),
                             ("lookup", lineups.prompt_lookup_source(10)),
                             ("lookup, their rule", lineups.prompt_lookup_source(10, implementation="transformers")),
                             ("hybrid", lineups.hybrid_source(5, 10, HybridSettings())),
                             ("hybrid, other settings", lineups.hybrid_source(5, 10, HybridSettings(0.3, False))),
                             ("draft k=3", lineups.draft_source(3))]])
    predicted = picker.per_category(predictions)
    same_prompts = predicted.assign(predicted_speedup=1.8)
    table = speculative_tables.picked_vs_measured(predicted, same_prompts, pd.DataFrame(rows)).set_index("source")
    assert table.measured_as.dropna().to_dict() == {"draft adaptive": "spec adaptive", "lookup": "lookup ours",
                                                    "lookup, their rule": "lookup theirs", "hybrid": "hybrid"}
    assert table.measured_prompts["hybrid, other settings"] == 0
    assert table.measured_prompts["draft k=3"] == 0  # not in the line-up
    assert table.speedup["draft adaptive"] == pytest.approx(2.0) and table.measured_prompts["draft adaptive"] == 2
    assert table.error["draft adaptive"] == pytest.approx(0.1)
    assert table.error_same_prompts["lookup"] == pytest.approx(1.8 / 5.0 - 1)


# --- 02: the hybrid's targets ------------------------------------------------------------------------

def test_hybrid_targets_compare_with_the_best_single_method_and_the_floor_where_nothing_helps():
    """Catches the hybrid compared with itself or with a lossy method, and the floor judged where
    something does help."""
    from types import SimpleNamespace

    from specdec_lab import metrics

    walls = {  # decoder: (source kind, lossless, wall time of 8 tokens per (category, prompt); AR takes 1.0 s)
        "lookup": ("prompt lookup", True, {"code": [0.25, 0.3, 0.2], "qa": [1.0, 1.1, 0.9]}),
        "draft": ("draft model", True, {"code": [0.8, 0.7, 0.9], "qa": [1.2, 0.9, 1.05]}),
        "draft-then-score": (None, False, {"code": [0.1] * 3, "qa": [0.1] * 3}),
        "hybrid": ("hybrid", True, {"code": [0.24, 0.28, 0.2], "qa": [1.0, 1.02, 1.05]}),
    }
    rows = []
    for category in ("code", "qa"):
        for i in range(3):
            prompt = f"{category}-{i}"
            rows.append(row(lineups.TARGET_AR, prompt, tokens=range(8), wall_time_s=1.0, source_kind=None,
                            lossless=True, category=category))
            rows += [row(name, prompt, tokens=range(8), wall_time_s=wall[category][i], source_kind=kind,
                         lossless=lossless, category=category) for name, (kind, lossless, wall) in walls.items()]
    rows = metrics.add_agreement(pd.DataFrame(rows), lineups.TARGET_AR).assign(
        acceptance_rate=0.5, peak_memory_bytes=2**20, time_to_first_token_s=0.1, tokens_per_target_forward=1.0)
    rows["tokens_per_second"] = 8 / rows.wall_time_s
    rows["ms_per_token"] = 1000 * rows.wall_time_s / 8
    tables = SimpleNamespace(rows=rows, by_category=speculative_tables.by_category(rows))
    targets = speculative_tables.hybrid_targets(tables)
    assert targets["best single method"].to_dict() == {"code": "lookup", "qa": "lookup"}
    assert targets.loc["code", "hybrid / best"] == pytest.approx((0.25 * 0.3 * 0.2 / (0.24 * 0.28 * 0.2)) ** (1 / 3))
    assert targets["nothing helps"].to_dict() == {"code": False, "qa": True}
    assert targets.loc["code", "at least the floor"] is None
    assert targets.loc["qa", "hybrid over AR"] == pytest.approx((1 / (1.0 * 1.02 * 1.05)) ** (1 / 3))
    assert bool(targets.loc["qa", "at least the floor"])  # 0.98x >= 0.97x
    text = speculative_words.hybrid_findings(targets)
    assert "No single method is shown to help here" in text and "**met**" in text
    assert speculative_words.hybrid_findings(targets.assign(**{"at least the floor": [None, False]})).count("**missed**") == 1


def test_tree_vs_chain_pairs_each_tree_with_our_chain_of_its_source_per_prompt():
    """Catches a tree compared with another source's chain, with transformers' chain, or with AR, and
    the ratio taken of means instead of paired per prompt; the prediction is the ratio of the picker's.
    What each decoder is comes from its rows' source columns."""
    from types import SimpleNamespace

    from specdec_lab import metrics
    from specdec_lab.method import TreeSettings

    lookup_tree = TreeSettings(8, 3)
    described = {lineups.TARGET_AR: ("ours", None),
                 "draft chain": ("ours", lineups.draft_source(5, "heuristic", 0.4)),
                 "lookup chain": ("ours", lineups.prompt_lookup_source(10)),
                 "lookup (transformers)": ("transformers", lineups.prompt_lookup_source(10, implementation="transformers")),
                 "lookup tree": ("ours", lineups.prompt_lookup_tree_source(10, lookup_tree))}
    walls = {lineups.TARGET_AR: [1.0, 1.0], "draft chain": [0.9, 0.8], "lookup chain": [0.5, 0.4],
             "lookup (transformers)": [0.2, 0.2], "lookup tree": [0.4, 0.5]}  # the tree: 1.25x then 0.8x the chain's
    rows = pd.DataFrame([row(name, f"c{i}", tokens=range(8), wall_time_s=wall[i], category="code",
                             implementation=described[name][0], **source_columns(described[name][1]))
                         for name, wall in walls.items() for i in range(2)])
    rows = rows.assign(tokens_per_target_forward=1.0, ms_per_token=lambda f: 1000 * f.wall_time_s / 8)
    by_category = pd.DataFrame({"category": ["code", "code"], "method": ["lookup tree", "lookup chain"],
                                "tokens_per_target_forward": [2.5, 2.0]})
    predictions = pd.DataFrame([{"category": "code", "source": s, "predicted_speedup": v, "implementation": "ours",
                                 **source_columns(src)}
                                for s, v, src in (("chain", 2.0, lineups.prompt_lookup_source(10)),
                                                  ("tree", 3.0, lineups.prompt_lookup_tree_source(10, lookup_tree)))])
    table = speculative_tables.tree_vs_chain(rows, by_category, SimpleNamespace(table=predictions))
    assert len(table) == 1  # no draft tree in the rows: no line for the draft chain
    line = table.iloc[0]
    assert (line.tree, line.chain, line.prompts) == ("lookup tree", "lookup chain", 2)
    assert line.speedup == pytest.approx(metrics.geometric_mean([1.25, 0.8]))
    assert (line.tree_tokens_per_forward, line.chain_tokens_per_forward, line.predicted) == (2.5, 2.0, 1.5)
    assert "misses 1.15x" in speculative_words.tree_findings(SimpleNamespace(picked=None, trees=table))


def test_suffix_vs_peer_pairs_ours_with_the_peer_of_the_same_settings_per_prompt():
    """Catches our suffix tree compared with our path (not the peer), with a peer of other settings, and the
    tokens-per-forward ratio taken of means instead of paired per prompt."""
    from specdec_lab.method import SuffixSettings

    settings = SuffixSettings()
    described = {lineups.TARGET_AR: ("ours", None),
                 "suffix tree (ours)": ("ours", lineups.suffix_source(8, True, settings)),
                 "suffix path (ours)": ("ours", lineups.suffix_source(8, False, settings)),
                 "suffix tree (arctic)": ("arctic-inference", lineups.suffix_source(8, True, settings, "arctic-inference")),
                 "suffix tree 16 (arctic)": ("arctic-inference",
                                             lineups.suffix_source(16, True, settings, "arctic-inference"))}
    forwards = {lineups.TARGET_AR: [1, 1], "suffix tree (ours)": [4.0, 1.0], "suffix path (ours)": [9, 9],
                "suffix tree (arctic)": [2.0, 2.0], "suffix tree 16 (arctic)": [5, 5]}
    rows = pd.DataFrame([row(name, f"c{i}", tokens=range(8), wall_time_s=1.0 / forwards[name][i], category="code",
                             implementation=described[name][0], tokens_per_target_forward=forwards[name][i],
                             **source_columns(described[name][1]))
                         for name in described for i in range(2)])
    rows = rows.assign(ms_per_token=lambda f: 1000 * f.wall_time_s / 8)
    table = speculative_tables.suffix_vs_peer(rows).set_index("peer")
    line = table.loc["suffix tree (arctic)"]
    assert line.ours == "suffix tree (ours)" and line.prompts == 2
    assert line.forward_ratio == pytest.approx(1.0)  # 2x then 0.5x, paired: not (4 + 1) / (2 + 2)
    assert (line.ours_tokens_per_forward, line.peer_tokens_per_forward) == (pytest.approx(2.0), pytest.approx(2.0))
    assert list(table.index) == ["suffix tree (arctic)"]  # no ours of k=16: no line for that peer
    assert "at least as many" in speculative_words.suffix_findings(table.reset_index())


# --- 04: loop counting, the Jacobi cost ratio, the findings, the training config --------------------

def test_looping_answers_counts_each_prompt_once():
    loop = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    rows = pd.DataFrame([row(lineups.CLLM_JACOBI, "a", 0, loop), row(lineups.CLLM_JACOBI, "a", 1, loop),
                         row(lineups.CLLM_JACOBI, "b", 0, list(range(30))), row(lineups.BASE_JACOBI, "c", 0, loop)])
    assert cllm_tables.looping_answers(rows, lineups.CLLM_JACOBI) == 1


def test_ms_per_decode_forward_leaves_the_prefill_out_and_pools_samples():
    # AR: 0.9 s after a 0.1 s prefill over 9 decode forwards, then 2.5 s over 29 forwards: 3.4 s / 38
    # Jacobi: a 0.2 s prefill, then 4 forwards in 0.8 s; a one-forward sample (all in the prefill) adds none
    rows = pd.DataFrame([row("AR", wall_time_s=1.0, time_to_first_token_s=0.1, target_forwards=10),
                         row("AR", repeat=1, wall_time_s=3.0, time_to_first_token_s=0.5, target_forwards=30),
                         row("Jacobi", wall_time_s=1.0, time_to_first_token_s=0.2, target_forwards=5),
                         row("Jacobi", repeat=1, wall_time_s=0.3, time_to_first_token_s=0.3, target_forwards=1)])
    per_forward = cllm_tables.ms_per_decode_forward(rows)
    assert per_forward["AR"] == pytest.approx(1000 * 3.4 / 38) and per_forward["Jacobi"] == pytest.approx(200.0)


def test_a_forward_is_set_beside_t_of_n_at_exactly_the_n_it_fed():
    # T(n) in ms at the n the forwards fed; AR fed 1 token a forward, Jacobi 8 then 2 (mean T = (30 + 12) / 2)
    curve = pd.DataFrame({"n": [1, 2, 8], "ms_fit": [10.0, 12.0, 30.0]})
    rows = pd.DataFrame([
        row(lineups.BASE_AR, wall_time_s=0.55, time_to_first_token_s=0.1, target_forwards=4, forward_tokens=[1, 1, 1]),
        row("Jacobi", wall_time_s=0.5, time_to_first_token_s=0.08, target_forwards=3, forward_tokens=[8, 2]),
        row("speculative", wall_time_s=0.5, time_to_first_token_s=0.1, target_forwards=3, forward_tokens=[])])
    assert cllm_tables.forward_sizes(rows) == [1, 2, 8]
    check = cllm_tables.forward_cost_check(rows, curve)
    assert list(check.index) == [lineups.BASE_AR, "Jacobi"]  # a method that did not record its forwards is left out
    assert check.curve_ms[lineups.BASE_AR] == pytest.approx(10.0) and check.forward_over_curve[lineups.BASE_AR] == pytest.approx(15.0)
    assert check.curve_ms["Jacobi"] == pytest.approx(21.0) and check.largest_forward["Jacobi"] == 8
    assert check.ms_per_decode_forward["Jacobi"] == pytest.approx(210.0)
    assert check.forward_over_curve["Jacobi"] == pytest.approx(10.0)
    assert check.mean_tokens_per_forward_fed["Jacobi"] == pytest.approx(5.0)
    # the curve's shape at AR's measured step: 210 ms against 21 ms * (150 ms / 10 ms)
    assert check.over_curve_at_ar_step["Jacobi"] == pytest.approx(210.0 / (21.0 * 15.0))
    assert check.over_curve_at_ar_step[lineups.BASE_AR] == pytest.approx(1.0)
    without_ar = cllm_tables.forward_cost_check(rows[rows.decoder != lineups.BASE_AR], curve)
    assert without_ar.over_curve_at_ar_step.isna().all()


def test_forward_check_findings_name_the_parallel_decoders_above_the_curve():
    check = pd.DataFrame({"mean_tokens_per_forward_fed": [1.0, 9.5, 20.0], "largest_forward": [1, 16, 21],
                          "ms_per_decode_forward": [12.0, 22.0, 40.0], "curve_ms": [10.0, 20.0, 30.0],
                          "forward_over_curve": [1.2, 1.1, 1.333]}, index=[lineups.BASE_AR, "Jacobi", "Lookahead"])
    text = cllm_words.forward_check_findings(check, "m (bf16)")
    assert "- Jacobi: 9.5 tokens a forward on average (at most 16), 22.0 ms against T(n) 20.0 ms: **1.10x**." in text
    assert text.endswith("1 of 2 parallel decoders cost more than 10% above T(n) at their n: Lookahead.")
    assert cllm_words.forward_check_findings(check.drop("Lookahead"), "m").endswith(
        "Every parallel decoder's forward is within 10% of T(n) at its n.")  # AR's own 1.2 is the loop, not judged


def test_the_forward_check_verdict_reads_the_curve_at_ar_s_step_when_the_machine_drifted():
    # the machine ran 25% slower during the rows than during the curve: AR 1.25x, Jacobi 1.30x of the curve as timed
    check = pd.DataFrame({"mean_tokens_per_forward_fed": [1.0, 9.5], "largest_forward": [1, 16],
                          "ms_per_decode_forward": [12.5, 26.0], "curve_ms": [10.0, 20.0],
                          "forward_over_curve": [1.25, 1.3], "over_curve_at_ar_step": [1.0, 1.04]},
                         index=[lineups.BASE_AR, "Jacobi"])
    text = cllm_words.forward_check_findings(check, "m")
    assert "26.0 ms against T(n) 20.0 ms: **1.30x** (1.04x at AR's step)." in text
    assert text.endswith("Every parallel decoder's forward is within 10% of T(n) scaled to AR's step at its n.")
    slower = check.assign(over_curve_at_ar_step=[1.0, 1.2])
    assert cllm_words.forward_check_findings(slower, "m").endswith(
        "1 of 1 parallel decoders cost more than 10% above T(n) scaled to AR's step at their n: Jacobi.")


def test_the_learning_trend_reads_the_later_half_of_training():
    curve = pd.DataFrame({"step": [0, 16, 32, 48, 64], "tokens_per_target_forward": [1.05, 1.3, 1.2, 1.3, 1.4],
                          "exact_match": 0.5, "prompts": 4, "recipe": "lr 3e-05, AR weight 10"})
    other = curve.assign(recipe="lr 1e-05, AR weight 10", tokens_per_target_forward=[1.05, 1.0, 1.0, 1.0, 1.0])
    trend = cllm_tables.learning_trend(curve, goal=2.0)
    # the line through (32, 1.2), (48, 1.3), (64, 1.4): +0.1 per 16 steps, 0.6 to go after step 64
    assert (trend.first, trend.last, trend.last_step) == (1.05, 1.4, 64)
    assert trend.slope_per_100_steps == pytest.approx(0.625) and trend.steps_to_goal == pytest.approx(96.0)
    text = cllm_words.learning_curve_findings(pd.concat([other, curve]), "lr 3e-05, AR weight 10")  # that recipe's
    assert "With lr 3e-05, AR weight 10, Jacobi tokens per forward went from **1.05** (the base model) to **1.40** after 64 steps" in text
    assert "+0.62 per 100 steps" in text
    assert "after about 96 more steps" in text
    flat = curve.assign(tokens_per_target_forward=[1.05, 1.3, 1.3, 1.3, 1.3])
    assert cllm_tables.learning_trend(flat).steps_to_goal is None
    assert "more steps of this recipe would not reach 2.0" in cllm_words.learning_curve_findings(flat, flat.recipe[0])
    assert cllm_tables.learning_trend(curve, goal=1.4).steps_to_goal == 0.0
    assert cllm_tables.learning_trend(curve.head(1)) is None


def test_extra_memory_is_a_drafts_weights_plus_its_peak_above_the_baselines():
    table = pd.DataFrame({"peak_memory_mb": [100.0, 130.0, 90.0]}, index=["AR", "draft", "CLLM"])
    extra = cllm_tables.extra_memory(table, "AR", {"draft": 50 * 2**20})
    assert extra.to_dict() == {"AR": 0.0, "draft": 80.0, "CLLM": 0.0}


def test_train_config_takes_the_notebook_parameters_by_name(monkeypatch):
    params = {"train_steps": 7, "learning_rate": 1e-4, "grad_accumulation": 2, "states_per_step": 3,
              "ar_weight": 5.0, "consistency_weight": 2.0, "consistency": "local", "consistency_target": "hard",
              "mixed_precision": "bf16", "checkpoint_every": 4, "seed": 9, "model": "ignored", "repeats": 2,
              "learning_curve_prompts": 0}
    config = cllm.train_config(params)
    assert config == train.TrainConfig(steps=7, learning_rate=1e-4, grad_accumulation=2, states_per_step=3,
                                       ar_weight=5.0, consistency_weight=2.0, consistency="local",
                                       consistency_target="hard", mixed_precision="bf16", checkpoint_every=4, seed=9)
    assert cllm.train_config(params | {"learning_curve_prompts": 3}).snapshots  # a learning curve keeps them
    for device, dot_products, resolved in (("cpu", True, "bf16"), ("cpu", False, "no"), ("cuda", False, "bf16")):
        monkeypatch.setattr(cllm.cpu_kernels, "BF16_DOT_PRODUCTS", dot_products)
        auto = params | {"mixed_precision": "auto", "device": device}
        assert cllm.train_config(auto).mixed_precision == resolved, (device, dot_products)
    assert not cllm.answer_config(params | {"learning_curve_prompts": 3, "sft_steps": 2, "sft_learning_rate": 1e-3,
                                            "sft_answers_per_step": 1}).snapshots  # not the fine-tuning before it


def test_learning_curve_table_reads_each_recipe_and_step_from_its_first_repeat():
    key = quality.AnswerKey("final-number exact match", {"a": "1", "b": "2"}, quality.answer_is_correct, "answers")
    answers = pd.Series({"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})  # the base model's greedy answers
    fast, slow = "lr 3e-05, AR weight 10", "lr 1e-05, AR weight 10"
    point = lambda decoder, prompt, recipe, step, **extra: row(decoder, prompt, recipe=recipe, step=step,  # noqa: E731
                                                              folder=f"{recipe}/{step}", **extra)
    loop = [9, 8, 7, 6, 5, 4, 3, 2] * 3
    rows = pd.DataFrame([
        *(point(lineups.BASE_JACOBI, p, recipe, 0, text=f"#### {gold}", tokens=answers[p], nll_per_token=0.2,
                tokens_per_target_forward=tpf)
          for recipe in (fast, slow) for p, gold, tpf in (("a", 1, 1.0), ("b", 5, 1.2))),
        point("Jacobi (CLLM, fast, after 4 steps)", "a", fast, 4, text="#### 1", tokens=[1, 2, 9, 9], nll_per_token=0.3,
              tokens_per_target_forward=1.5),
        point("Jacobi (CLLM, fast, after 4 steps)", "b", fast, 4, text="#### 2", tokens=loop, nll_per_token=0.5,
              tokens_per_target_forward=1.9),
        point("Jacobi (CLLM, fast, after 4 steps)", "b", fast, 4, repeat=1, text="#### 9", tokens=[0],
              nll_per_token=9.0, tokens_per_target_forward=9.0),
        point("Jacobi (CLLM, slow, after 4 steps)", "a", slow, 4, text="#### 7", tokens=[1, 2, 3, 4], nll_per_token=0.2,
              tokens_per_target_forward=1.1),
        point("Jacobi (CLLM, slow, after 4 steps)", "b", slow, 4, text="#### 2", tokens=[5, 6, 7, 8],
              nll_per_token=0.2, tokens_per_target_forward=1.3)])
    curve = cllm_tables.learning_curve_table(rows, key, answers)
    assert list(zip(curve.recipe, curve.step)) == [(fast, 0), (slow, 0), (fast, 4), (slow, 4)]
    assert curve.tokens_per_target_forward.tolist() == pytest.approx([1.1, 1.1, 1.7, 1.2])  # repeat 1 left out
    assert curve.exact_match.tolist() == [0.5, 0.5, 1.0, 0.5]
    assert curve.agreement.tolist() == pytest.approx([1.0, 1.0, (0.5 + 0.0) / 2, 1.0])
    assert curve.nll_per_token.tolist() == pytest.approx([0.2, 0.2, 0.4, 0.2])
    assert curve.looping.tolist() == [0, 0, 1, 0] and curve.prompts.tolist() == [2, 2, 2, 2]
    assert curve.folder.tolist() == [f"{fast}/0", f"{slow}/0", f"{fast}/4", f"{slow}/4"]
    assert cllm_tables.learning_curve_table(rows, None, answers).exact_match.isna().all()  # no answer key: no accuracy


def learning_curves(*points) -> pd.DataFrame:
    """(recipe, step, tokens per forward, NLL of the base's answers, looping answers) -> a learning curve."""
    return pd.DataFrame([{"recipe": recipe, "step": step, "tokens_per_target_forward": tpf, "nll_per_token": nll,
                          "looping": looping, "folder": f"{recipe}/{step}"}
                         for recipe, step, tpf, nll, looping in points])


def test_the_cllm_is_the_checkpoint_that_fixes_most_tokens_a_forward_while_keeping_the_text():
    curve = learning_curves(("fast", 0, 1.1, 0.20, 0), ("slow", 0, 1.1, 0.20, 0),
                            ("fast", 16, 1.5, 0.28, 0), ("fast", 32, 1.9, 0.45, 0),  # drifted past 0.20 + 0.1
                            ("slow", 16, 1.3, 0.22, 0), ("slow", 32, 1.6, 0.29, 0), ("slow", 48, 1.7, 0.25, 1))  # loops
    choice = cllm_tables.chosen_checkpoint(curve, max_nll_rise=0.1)
    assert (choice.recipe, choice.step, choice.folder, choice.kept_the_text) == ("slow", 32, "slow/32", True)
    assert choice.nll_limit == pytest.approx(0.30)
    # a wider allowance takes the faster, more drifted one; ties go to the earlier step
    assert cllm_tables.chosen_checkpoint(curve, max_nll_rise=0.3).step == 32
    tie = learning_curves(("r", 0, 1.0, 0.2, 0), ("r", 8, 1.4, 0.2, 0), ("r", 16, 1.4, 0.2, 0))
    assert cllm_tables.chosen_checkpoint(tie, 0.1).step == 8
    # none kept the text: the least drifted is taken, and the choice says so
    drifted = learning_curves(("r", 0, 1.0, 0.2, 0), ("r", 8, 1.4, 0.6, 0), ("r", 16, 2.4, 0.9, 0))
    choice = cllm_tables.chosen_checkpoint(drifted, 0.1)
    assert (choice.step, choice.kept_the_text) == (8, False)


def test_the_choice_is_said_with_its_numbers():
    curve = learning_curves(("fast", 0, 1.1, 0.20, 0), ("fast", 16, 1.5, 0.28, 0)).assign(prompts=4, agreement=[1.0, 0.4])
    tables = synthetic_cllm_tables()
    tables.learning_curve, tables.choice = curve, cllm_tables.chosen_checkpoint(curve, 0.1)
    text = cllm_words.choice_findings(tables, {"max_nll_rise": 0.1})
    for expected in ("read on 4 held-out prompts", "1 recipe trained (fast)", "within 0.10 nats a token of the base's "
                     "own (0.200, so at most 0.300)", "**fast, after 16 steps**: 1.50 tokens per forward (base 1.10), "
                     "NLL 0.280, agreement with the base's text 40%."):
        assert expected in text, expected
    assert cllm_words.headline(tables)["CLLM taken at (by its learning curves)"] == "fast, step 16"
    tables.choice = cllm_tables.chosen_checkpoint(curve.assign(nll_per_token=[0.2, 0.9]), 0.1)
    assert "**No trained checkpoint kept it.**" in cllm_words.choice_findings(tables, {"max_nll_rise": 0.1})
    assert cllm_words.headline(tables)["CLLM taken at (by its learning curves)"].endswith("the least drifted)")


def test_recipes_are_one_training_run_each_on_the_shared_parameters():
    params = {"train_steps": 7, "learning_rate": 1e-4, "ar_weight": 5.0, "learning_curve_prompts": 2,
              "training_recipes": [{"learning_rate": 3e-5}, {"ar_weight": 20.0}]}
    configs = cllm.recipes(params)
    assert [(c.learning_rate, c.ar_weight, c.steps) for c in configs] == [(3e-5, 5.0, 7), (1e-4, 20.0, 7)]
    assert [c.recipe() for c in configs] == ["lr 3e-05, AR weight 5", "lr 0.0001, AR weight 20"]
    assert cllm.recipes(params | {"training_recipes": []}) == [cllm.train_config(params)]


def test_the_learning_curves_read_held_out_prompts_the_comparison_never_uses():
    params = {"prompt_set": "gsm-symbolic", "held_out_fraction": 0.3, "seed": 0, "eval_prompts": 8,
              "learning_curve_prompts": 4}
    train_side, compared, validation = cllm.split(params)
    assert len(compared) == 8 and len(validation) == 4
    assert not {p.id for p in compared} & {p.id for p in validation}
    assert not {p.group for p in train_side} & {p.group for p in [*compared, *validation]}
    with pytest.raises(ValueError, match="eval_prompts = 8 and learning_curve_prompts = 100000 need 100008 held-out"):
        cllm.split(params | {"learning_curve_prompts": 100_000})


def test_block_table_reads_jacobi_rows_only():
    stats = {"block_size": 4, "init": "repeat_last", "blocks": [{"iterations": 3, "fast_forward": 1, "stationary": 0}]}
    rows = pd.DataFrame([row(lineups.BASE_JACOBI, jacobi=stats, role="parallel"),
                         row("Lookahead W=5 N=3 G=5 (base)", jacobi=None, role="parallel")])
    blocks = cllm_tables.block_table(rows)
    assert list(blocks.decoder) == [lineups.BASE_JACOBI] and list(blocks.iterations) == [3]


def sql_key(gold: dict[str, str]) -> quality.AnswerKey:
    return quality.AnswerKey("SQL exact match", gold, quality.sql_exact_match, "the gold SQL")


def test_accuracy_counts_each_prompt_once_against_its_gold():
    gold = {"a": "SELECT 1 FROM t", "b": "SELECT 2 FROM t"}
    rows = pd.DataFrame([row(lineups.BASE_AR, "a", text="```sql\nselect 1 from t\n```"),
                         row(lineups.BASE_AR, "b", text="SELECT 3 FROM t"),
                         row(lineups.BASE_AR, "b", repeat=1, text="SELECT 2 FROM t"),  # a later repeat: not counted
                         row(lineups.CLLM_JACOBI, "a", text="SELECT 1 FROM t;"),
                         row(lineups.CLLM_JACOBI, "b", text="SELECT 2 FROM t")])
    table = cllm_tables.accuracy(rows, sql_key(gold))
    assert table.exact_match.to_dict() == {lineups.BASE_AR: 0.5, lineups.CLLM_JACOBI: 1.0}
    assert table.prompts.to_dict() == {lineups.BASE_AR: 2, lineups.CLLM_JACOBI: 2}


def test_paired_answers_count_the_prompts_one_method_gets_right_and_the_other_wrong():
    gold = {"a": "SELECT 1 FROM t", "b": "SELECT 2 FROM t", "c": "SELECT 3 FROM t", "d": "SELECT 4 FROM t",
            "e": "SELECT 5 FROM t"}
    rows = pd.DataFrame([row(lineups.BASE_AR, "a", text="SELECT 1 FROM t"), row(lineups.CLLM_JACOBI, "a", text="SELECT 1 FROM t"),
                         row(lineups.BASE_AR, "b", text="SELECT 2 FROM t"), row(lineups.CLLM_JACOBI, "b", text="SELECT 9 FROM t"),
                         row(lineups.BASE_AR, "c", text="SELECT 9 FROM t"), row(lineups.CLLM_JACOBI, "c", text="SELECT 3 FROM t"),
                         row(lineups.BASE_AR, "d", text="SELECT 9 FROM t"), row(lineups.CLLM_JACOBI, "d", text="SELECT 9 FROM t"),
                         row(lineups.BASE_AR, "e", text="SELECT 5 FROM t"), row(lineups.CLLM_JACOBI, "e", text="SELECT 9 FROM t"),
                         row(lineups.CLLM_JACOBI, "d", repeat=1, text="SELECT 4 FROM t")])  # a later repeat: not counted
    assert cllm_tables.paired_answers(rows, sql_key(gold), lineups.BASE_AR, lineups.CLLM_JACOBI) == {
        "both": 1, "only_first": 2, "only_second": 1, "neither": 1}


def curves() -> pd.DataFrame:
    """T(n)/T(1) of a model where tokens are nearly free (flat) and one where they are not (steep)."""
    n = [1, 8, 16, 32]
    return pd.concat([pd.DataFrame({"n": n, "relative_to_one": [1.0, 1.1, 1.3, 1.6], "model": "flat", "dtype": "bf16"}),
                      pd.DataFrame({"n": n, "relative_to_one": [1.0, 1.7, 2.0, 3.0], "model": "steep", "dtype": "fp32"})])


def test_break_even_is_the_cost_of_the_tokens_one_pass_carries():
    table = cllm_tables.break_even_table(curves(), 16, [{"window": 5, "ngram_size": 3, "candidates": 5},
                                                 {"window": 15, "ngram_size": 5, "candidates": 15}])
    be = table.set_index(["model", "method"]).break_even_tokens_per_forward
    assert be["flat (bf16)", "Jacobi, block of 16"] == pytest.approx(1.3)
    assert be["steep (fp32)", "Jacobi, block of 8"] == pytest.approx(1.7)
    # a pass of 1 + (5 + 5)(3 - 1) = 21 tokens, linear between T(16) and T(32)
    assert be["flat (bf16)", "Lookahead W=5 N=3 G=5"] == pytest.approx(1.3 + 5 / 16 * 0.3)
    assert pd.isna(be["flat (bf16)", "Lookahead W=15 N=5 G=15"])  # 121 tokens: beyond the curve, not extrapolated


def test_cllm_pick_takes_the_largest_block_that_can_pay():
    table = cllm_tables.break_even_table(curves(), 16, [])
    pick = cllm_tables.cllm_pick(table, reachable=1.5)
    assert (pick.model, pick.tokens_per_pass) == ("flat (bf16)", 16)
    assert cllm_tables.cllm_pick(table, reachable=1.05) is None
    assert cllm_tables.cllm_pick(table, reachable=3.0).model == "flat (bf16)"  # block 32 on both: the cheaper one


def synthetic_cllm_tables() -> cllm_tables.Tables:
    names = [lineups.BASE_AR, lineups.BASE_JACOBI, lineups.CLLM_JACOBI]
    table = pd.DataFrame({"tokens_per_target_forward": [1.0, 1.05, 1.4], "speedup": [1.0, 0.5, 0.7],
                          "agreement": [1.0, 1.0, 0.25], "ms_per_decode_forward": [40.0, 80.0, 80.0],
                          "speedup_low": [1.0, 0.4, 0.6], "speedup_high": [1.0, 0.6, 0.8], "prompts": [2, 2, 2]},
                         index=names)
    both = pd.DataFrame({"prompts": ["trained on"] * 2 + ["held out"] * 2,
                         "prompt_id": ["t1", "t2", "h1", "h2"]})
    return cllm_tables.Tables(
        train_set=[], held_out_set=["h1", "h2"], collected={"training_prompts": 9, "degenerate_removed": 1},
        losses=pd.DataFrame({"step": [1, 2, 3]}), cllm_folder=None, rows=pd.DataFrame([row(lineups.CLLM_JACOBI, "h1"),
                                                                                       row(lineups.CLLM_JACOBI, "h2")]),
        table=table, blocks=pd.DataFrame(),
        block_stats=pd.DataFrame({"iterations_per_block": [7.5, 5.0]}, index=names[1:]),
        seen_and_held_out=both,
        tokens_per_forward_by_prompts=pd.DataFrame({"trained on": [1.1, 1.6]}, index=names[1:]),
        nll=pd.DataFrame({"model": ["base", "CLLM"], "nll_per_token": [0.7, 1.4]}), looping=1,
        cost_curves=curves(), break_even=cllm_tables.break_even_table(curves(), 16, []), cllm_step=3)


def test_cllm_findings_say_what_the_tables_hold():
    text = cllm_words.findings(synthetic_cllm_tables(), {"block_size": 16, "dtype": "float32", "device": "cpu"})
    for expected in ("On 2 held-out prompts", "**1.05**", "after 3 training steps on 9 prompts", "(1 looping",
                     "**1.40**", "7.5 vs 5.0 iterations", "On 2 of its training prompts it makes 1.60 (base 1.10)",
                     "costs 2.00x an AR step", "0.50x for the base model and 0.70x for the CLLM", "25%",
                     "from 0.700 to 1.400", "1 of the CLLM's 2 held-out answers loop"):
        assert expected in text, expected
    cost = cllm_words.cost_findings(synthetic_cllm_tables(), {"model": "steep", "dtype": "fp32", "block_size": 16})
    assert "costs **2.00x** an AR step of steep (fp32)" in cost and "favour **flat (bf16)** with blocks of **16**" in cost
    assert "This profile trains steep all the same" in cost
    favoured = cllm_words.cost_findings(synthetic_cllm_tables(), {"model": "flat", "dtype": "bf16", "block_size": 16})
    assert favoured.endswith("This profile trains that model.")
    headline = cllm_words.headline(synthetic_cllm_tables())
    assert headline["Jacobi tokens/forward, CLLM on training prompts"] == 1.6
    assert headline["Jacobi (CLLM) speedup over AR (per token)"] == "0.70x (95% CI 0.60-0.80, 2 prompts)"


def test_math_accuracy_reads_the_final_number_of_each_answer():
    key = quality.AnswerKey("final-number exact match", {"a": "12", "b": "3.5"}, quality.answer_is_correct,
                            "the worked solutions")
    rows = pd.DataFrame([row(lineups.BASE_AR, "a", text="6 + 6 = 12\n#### 12"),
                         row(lineups.BASE_AR, "b", text="7 / 2 = 3.5, so 4 boxes\n#### 4"),
                         row(lineups.CLLM_JACOBI, "a", text="6 + 6 = 12, then 12 - 1 = 11"),  # no ####: its last number
                         row(lineups.CLLM_JACOBI, "b", text="#### 3.50")])
    assert cllm_tables.accuracy(rows, key).exact_match.to_dict() == {lineups.BASE_AR: 0.5, lineups.CLLM_JACOBI: 0.5}
    assert cllm_tables.paired_answers(rows, key, lineups.BASE_AR, lineups.CLLM_JACOBI) == {
        "both": 0, "only_first": 1, "only_second": 1, "neither": 0}


def test_accuracy_names_the_pretrained_model_when_the_base_was_fine_tuned_first():
    tables = synthetic_cllm_tables()
    tables.answer_key = sql_key({})
    tables.accuracy = pd.DataFrame({"exact_match": [0.5, 0.2, 0.4], "prompts": [20, 20, 20]},
                                       index=[lineups.BASE_AR, lineups.PRETRAINED_AR, lineups.CLLM_JACOBI])
    assert cllm_words.headline(tables)["SQL exact match, pretrained / base / CLLM"] == "0.20 / 0.50 / 0.40 (20 prompts)"
    text = cllm_words.findings(tables, {"block_size": 16, "dtype": "bfloat16", "device": "cpu", "max_new_tokens": 64,
                                  "model": "m", "sft_steps": 100, "sft_answers_per_step": 8})
    assert ("Task quality (SQL exact match): 50% of the held-out prompts are answered right by the base model and "
            "40% by the CLLM") in text
    assert ("m after 100 steps of fine-tuning (8 answers each) on the gold SQL of the training side; before them "
            "it matched 20%") in text
    tables.accuracy = tables.accuracy.drop(lineups.PRETRAINED_AR)
    assert cllm_words.headline(tables)["SQL exact match, base / CLLM"] == "0.50 / 0.40 (20 prompts)"
    tables.accuracy_pairs = {"both": 7, "only_first": 3, "only_second": 1, "neither": 9}
    text = cllm_words.findings(tables, {"block_size": 16, "dtype": "bfloat16", "device": "cpu", "max_new_tokens": 64,
                                  "model": "m", "sft_steps": 0})
    assert "the base model answers 3 right that the CLLM gets wrong and the CLLM 1 the other way" in text
    assert "one prompt is 5 points of accuracy here" in text


def test_cllm_findings_and_headline_report_lookahead_on_the_cllm_when_it_ran():
    tables = synthetic_cllm_tables()
    assert "Lookahead decoding of the CLLM" not in cllm_words.findings(tables, {"block_size": 16, "dtype": "float32",
                                                                         "device": "cpu"})
    name, base_name = lineups.cllm_lookahead_names([{"window": 5, "ngram_size": 3}])
    assert (name, base_name) == ("Lookahead W=5 N=3 G=5 (CLLM)", "Lookahead W=5 N=3 G=5 (base)")
    tables.table.loc[name] = {"tokens_per_target_forward": 1.8, "speedup": 1.2, "agreement": 0.25, "ms_per_decode_forward": 60.0,
                              "speedup_low": 1.1, "speedup_high": 1.3, "prompts": 2}
    tables.table.loc[base_name] = {"tokens_per_target_forward": 1.4, "speedup": 0.9, "agreement": 1.0,
                                   "ms_per_decode_forward": 60.0, "speedup_low": 0.8, "speedup_high": 1.0, "prompts": 2}
    tables.cllm_lookahead, tables.base_lookahead = name, base_name
    text = cllm_words.findings(tables, {"block_size": 16, "dtype": "float32", "device": "cpu"})
    assert ("Lookahead decoding of the CLLM (Lookahead W=5 N=3 G=5 (CLLM)) makes **1.80** tokens per forward (the base "
            "model 1.40 at the same W, N, G) at 1.50x") in text
    assert "**1.20x (95% CI 1.10-1.30, 2 prompts)** AR" in text
    headline = cllm_words.headline(tables)
    assert headline[f"{name}: tokens/forward"] == 1.8
    assert headline[f"{name}: speedup over AR (per token)"] == "1.20x (95% CI 1.10-1.30, 2 prompts)"


def test_reference_findings_say_whether_the_best_parallel_method_pays():
    tables = synthetic_cllm_tables()
    tables.reference_table = pd.DataFrame(
        {"tokens_per_target_forward": [1.0, 1.3, 1.5], "ms_per_decode_forward": [100.0, 120.0, 125.0],
         "speedup": [1.0, 1.08, 1.2], "speedup_low": [1.0, 0.95, 1.05], "speedup_high": [1.0, 1.2, 1.3],
         "prompts": [3, 3, 3], "agreement": [1.0, 1.0, 1.0], "extra_memory_mb": [0.0, 3.0, 400.0]},
        index=[lineups.BASE_AR, "Lookahead A", "Lookahead B"])
    tables.reference_precision = "bf16 int4-wo"  # the path `reference_dtype: auto` chose
    text = cllm_words.reference_findings(tables, {"reference_model": "big", "reference_dtype": "auto", "max_new_tokens": 32})
    assert text.startswith("Untrained big (bf16 int4-wo), 3 held-out prompts, 32 tokens:")
    assert ("- Lookahead A: **1.30** tokens per forward at 1.20x the time of an AR step: **1.08x (95% CI 0.95-1.20, "
            "3 prompts)** AR, agreement with AR greedy 1.00, 3 MB of memory beyond AR's.") in text
    assert "The best, Lookahead B, pays here" in text
    tables.reference_table.loc["Lookahead B", "speedup_low"] = 0.99
    assert "does not pay beyond the noise" in cllm_words.reference_findings(tables, {"reference_model": "big",
                                                                               "reference_dtype": "bf16",
                                                                               "max_new_tokens": 32})


# --- the summary: declared properties, ranked within an experiment ---------------------------------

def test_summary_lines_carry_each_methods_declared_properties():
    methods = [Method("AR", print, lossless=True, role="target AR"),
               Method("blog", print, lossless=False, role="lossy")]
    table = pd.DataFrame({"speedup": [1.0, 3.0]}, index=pd.Index(["AR", "blog"], name="decoder"))
    lines = common.summary_lines(table, methods)
    assert lines.to_dict("list") == {"method": ["AR", "blog"], "speedup": [1.0, 3.0], "lossless": [True, False],
                                     "role": ["target AR", "lossy"]}
    with pytest.raises(ValueError, match="not in the line-up"):
        common.summary_lines(table, methods[:1])


def test_fastest_lossless_ranks_within_each_experiment_by_the_declared_property(tmp_path):
    lines = pd.DataFrame({
        "method": ["AR", "spec", "blog (fast, not lossless)", "AR", "jacobi", "cllm (fast, fine-tuned)"],
        "lossless": [True, True, False, True, True, False],
        "role": ["target AR", "speculative", "lossy", "target AR", "parallel", "parallel"],
        "speedup": [1.0, 1.5, 2.5, 1.0, 0.6, 0.9], "agreement": [1.0, 1.0, 0.5, 1.0, 1.0, 0.04]})
    lines = lines.assign(speedup_low=lines.speedup - 0.1, speedup_high=lines.speedup + 0.1, prompts=10)
    for name, part in (("02_speculative", lines.iloc[:3]), ("04_cllm", lines.iloc[3:])):
        outputs.write_summary(tmp_path, name, part, params_id=summary.current_params_id("smoke", name))
    tables = summary.run({"results_dir": str(tmp_path), "profile": "smoke"})
    assert tables.stale == []
    best = tables.fastest_lossless.set_index("experiment").method
    assert best.to_dict() == {"02_speculative": "spec", "04_cllm": "jacobi"}
    assert outputs.read_headline(tmp_path, "06_summary") == {
        "fastest lossless method in 02_speculative": "spec: 1.50x (95% CI 1.40-1.60, 10 prompts)",
        "fastest lossless method in 04_cllm": "jacobi: 0.60x (95% CI 0.50-0.70, 10 prompts)"}
    assert "| 02_speculative | blog (fast, not lossless) | no | 2.50 (2.40-2.60) | 10 |" in summary.markdown_table(str(tmp_path))


def test_the_summary_leaves_out_results_made_with_other_parameters(tmp_path):
    line = pd.DataFrame({"method": ["spec"], "lossless": [True], "role": ["speculative"], "speedup": [1.5],
                         "speedup_low": [1.2], "speedup_high": [1.8], "prompts": [10], "agreement": [1.0]})
    outputs.write_summary(tmp_path, "02_speculative", line, params_id=summary.current_params_id("smoke", "02_speculative"))
    outputs.write_summary(tmp_path, "03_quantized", line, params_id="made-with-older-parameters")
    tables = summary.run({"results_dir": str(tmp_path), "profile": "smoke"})
    assert tables.stale == ["03_quantized"] and set(tables.table.experiment) == {"02_speculative"}
    assert "03_quantized" in summary.findings(tables)


def test_write_summary_needs_the_declared_properties(tmp_path):
    with pytest.raises(ValueError, match="lossless"):
        outputs.write_summary(tmp_path, "01_baseline", pd.DataFrame({"method": ["AR"], "speedup": [1.0]}))


# --- the per-step overhead check (static cache, torch.compile) --------------------------------------

def test_static_cache_loop_makes_the_dynamic_loops_tokens():
    """Catches a static-cache loop that drifts from the DynamicCache loop (a prefill that misses a
    prompt token, a cache shared between runs): every variant must generate the same text."""
    from tiny import tiny_llama

    from specdec_lab.experiments import overhead

    # peaked weights: a random model at the default init is nearly uniform and repeats one token
    table = overhead.overhead_table(tiny_llama(weight_std=0.3), [3, 14, 15, 9, 2, 6], steps=16, compile_step=False)
    assert list(table.variant) == ["dynamic cache, eager (the kit's decoders)", "static cache, eager"]
    assert table.same_tokens.all() and (table.ms_per_step > 0).all()
    assert table.vs_dynamic.iloc[0] == 1.0


def test_per_category_names_our_best_the_hybrid_theirs_and_the_pick_with_measured_intervals():
    """Catches our best taken from transformers' rows (theirs is faster here), a lossy method
    counted as a best, the pick's measurement read from another source, and a Markdown table whose
    columns lose their order."""
    from types import SimpleNamespace

    from specdec_lab import metrics

    walls = {"lookup": ("ours", "prompt lookup", True, [0.5, 0.4]), "hybrid": ("ours", "hybrid", True, [0.6, 0.6]),
             "assisted": ("transformers", "draft model", True, [0.25, 0.3]),
             "blog": ("ours", None, False, [0.1, 0.1])}
    rows = [row(lineups.TARGET_AR, p, tokens=range(8), wall_time_s=1.0, implementation="ours", source_kind=None,
                lossless=True, category="code") for p in ("a", "b")]
    rows += [row(name, p, tokens=range(8), wall_time_s=wall[i], implementation=impl, source_kind=kind,
                 lossless=lossless, category="code")
             for name, (impl, kind, lossless, wall) in walls.items() for i, p in enumerate(("a", "b"))]
    rows = metrics.add_agreement(pd.DataFrame(rows), lineups.TARGET_AR).assign(
        acceptance_rate=0.5, peak_memory_bytes=2**20, time_to_first_token_s=0.1, tokens_per_target_forward=1.0)
    rows["tokens_per_second"], rows["ms_per_token"] = 8 / rows.wall_time_s, 1000 * rows.wall_time_s / 8
    picked = SimpleNamespace(
        recommended=pd.DataFrame({"category": ["code"], "source": ["lookup k=10"], "predicted_speedup": [2.1]}),
        table=pd.DataFrame({"category": ["code", "code"], "source": ["draft k=2", "lookup k=10"],
                            "speedup": [1.1, 2.2], "speedup_low": [1.0, 2.0], "speedup_high": [1.2, 2.4],
                            "measured_prompts": [2, 2]}))
    tables = SimpleNamespace(rows=rows, by_category=speculative_tables.by_category(rows), picked=picked)
    lines = speculative_tables.per_category(tables).set_index("which")
    assert lines.method.to_dict() == {"our best": "lookup", "hybrid": "hybrid", "transformers' best": "assisted",
                                      "picker's pick": "lookup k=10"}
    assert lines.speedup["our best"] == pytest.approx((2 * 2.5) ** 0.5)
    assert (lines.speedup["picker's pick"], lines.predicted_speedup["picker's pick"]) == (2.2, 2.1)
    table = speculative_words.per_category_markdown(speculative_tables.per_category(tables)).splitlines()
    assert table[0] == "| kind of text | our best | hybrid | transformers' best | picker's pick |"
    assert table[2].endswith("| lookup k=10: predicted 2.10x, measured 2.20x (95% CI 2.00-2.40, 2 prompts) |")
