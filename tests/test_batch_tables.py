"""Notebook 05's numbers on synthetic rows with known answers, its cost model, and the batch runner
(batches cut from the prompts, one row per request, resumed whole)."""

import pandas as pd
import pytest

from specdec_lab import cost_model
from specdec_lab.data import Prompt
from specdec_lab.decoders import batched
from specdec_lab.experiments import batch_tables
from specdec_lab.method import Method
from specdec_lab.runs import bench, jsonl
from test_bench import Tokens
from tiny import tiny_llama

AR, SPEC = "AR (ours, batched)", "draft k=2 (batched)"


def request(decoder, batch_size, group, prompt, tokens, wall, batch_wall, forwards, kind=None, k=None, repeat=0,
            first_token=1.0):
    accepted = [1] * (forwards - 1) + [0] if kind else [0] * forwards
    return {"decoder": decoder, "batch_size": batch_size, "repeat": repeat, "group": group, "prompt_id": prompt,
            "tokens": tokens, "num_tokens": len(tokens), "wall_time_s": wall, "time_to_first_token_s": first_token,
            "tokens_per_target_forward": len(tokens) / forwards,
            "extras": {"batch_wall_time_s": batch_wall}, "role": "speculative" if kind else "target AR",
            "implementation": "ours", "source_kind": kind, "k": k, "lossless": True,
            "accepted_per_step": accepted, "proposed_per_step": [2] * forwards if kind else [0] * forwards}


def synthetic_rows():
    """Batch 1 (prompts p, q) and batch 2 (p and q together). At batch 1 the draft makes p's batch 2x AR's
    throughput and q's 4x (AR took 4 s and 8 s); at batch 2 the batch 1.25x (5 s against 4 s), with its
    requests' latencies 5/4 = 1.25x (p) and 5/2 = 2.5x (q, which the draft finished first). Its text at
    batch 2 parts from AR's on prompt q. Rows come shuffled: nothing may rely on their order."""
    text = {"p": [1, 2, 3, 4], "q": [5, 6, 7, 8]}
    ar_wall, spec_wall = {"p": 4.0, "q": 8.0}, {"p": 2.0, "q": 2.0}
    rows = []
    for group, prompt in enumerate("pq"):
        rows.append(request(AR, 1, group, prompt, text[prompt], ar_wall[prompt], ar_wall[prompt], 4))
        rows.append(request(SPEC, 1, group, prompt, text[prompt], spec_wall[prompt], spec_wall[prompt], 2, "draft model", 2))
    rows.append(request(AR, 2, 0, "p", text["p"], 5.0, 5.0, 4))
    rows.append(request(AR, 2, 0, "q", text["q"], 5.0, 5.0, 4))
    rows.append(request(SPEC, 2, 0, "p", text["p"], 4.0, 4.0, 2, "draft model", 2))
    rows.append(request(SPEC, 2, 0, "q", [5, 6, 9, 9], 2.0, 4.0, 2, "draft model", 2))
    return pd.DataFrame(rows).sample(frac=1, random_state=3).reset_index(drop=True)


def test_throughput_latency_and_agreement_from_known_rows():
    table = batch_tables.table(synthetic_rows(), AR).set_index(["decoder", "batch_size"])
    assert table.loc[(SPEC, 1)].speedup == pytest.approx((2.0 * 4.0) ** 0.5) and table.loc[(SPEC, 1)].batches == 2
    assert (table.loc[(SPEC, 1)].speedup_low, table.loc[(SPEC, 1)].speedup_high) == pytest.approx((2.0, 4.0))
    assert table.loc[(SPEC, 2)].speedup == pytest.approx(1.25) and table.loc[(SPEC, 2)].batches == 1
    assert table.loc[(AR, 2)].throughput == pytest.approx(8 / 5.0)
    # latency: request by request on the same batch, then one geometric mean per batch
    assert table.loc[(SPEC, 2)].latency_speedup == pytest.approx((1.25 * 2.5) ** 0.5)
    assert table.loc[(SPEC, 1)].latency_speedup == pytest.approx((2.0 * 4.0) ** 0.5)
    assert table.loc[(SPEC, 1)].tokens_per_forward == pytest.approx(2.0)
    # decode only: 3 tokens after the first, after the first forward's 1 s: AR 3/3 s (p) and 3/7 s (q), the draft 3/1 s
    assert table.loc[(SPEC, 1)].decode_speedup == pytest.approx((3.0 * 7.0) ** 0.5)
    # agreement is with the batch-1 AR text: q at batch 2 keeps 2 of 4 tokens
    assert table.loc[(SPEC, 2)].agreement == pytest.approx((1.0 + 0.5) / 2)
    assert table.loc[(SPEC, 2)].full_match_rate == pytest.approx(0.5)


def flat_costs(batches, n_max, target=100.0, draft=20.0):
    grid = lambda ms: pd.DataFrame([{"batch": b, "n": n, "ms": ms * b, "ms_fit": ms * b} for b in batches
                                    for n in range(1, n_max + 1)])
    return grid(target), grid(draft)[lambda g: g.n == 1]


def test_the_batch_cost_model_is_leviathans_on_a_flat_curve_and_sees_the_steep_one():
    target, draft = flat_costs([1], 5)
    curves, drafts = batch_tables.cost_curves(target), batch_tables.cost_curves(draft)
    assert cost_model.batch_speedup_from_costs(0.8, 4, curves, drafts, 1) == pytest.approx(
        cost_model.predicted_speedup(0.8, 4, 0.2))
    steep = {1: {1: 100.0, 3: 300.0}}
    assert cost_model.batch_speedup_from_costs(0.8, 2, steep, {1: {1: 20.0}}, 1) == pytest.approx(
        (1 + 0.8 + 0.64) * 100 / (300 + 2 * 20))
    with pytest.raises(ValueError, match="up to n = k \\+ 1 = 4"):
        cost_model.batch_speedup_from_costs(0.8, 3, steep, {1: {1: 20.0}}, 1)


def test_a_batchs_verify_width_is_what_its_rows_together_pay_for():
    """Each row adds its target token and its probabilities up to the width; the forward costs T_b(w + 1)
    whatever each row holds."""
    costs = {1: 1.0, 2: 1.5, 6: 3.5}
    sure = [1.0] * 5
    assert cost_model.batch_width_worth_verifying([sure], costs) == 5  # alone: 6 tokens for 3.5 steps
    # beside three rows with nothing to propose, its 5 tokens pay for 4 rows' columns: 9 tokens for
    # 3.5 steps against 4 for 1
    assert cost_model.batch_width_worth_verifying([sure, [], [], []], costs) == 0
    assert cost_model.batch_width_worth_verifying([sure] * 4, costs) == 5  # 24 tokens for 3.5
    # a short proposal counts its own tokens only: 2 rows, 1 + 5 and 1 + 1 tokens at width 5 (8 for
    # 3.5 steps), 1 + 1 each at width 1 (4 for 1.5): width 1; counted up to the width, width 5 would win
    assert cost_model.batch_width_worth_verifying([sure, [1.0]], costs) == 1
    assert cost_model.batch_width_worth_verifying([[0.2, 0.1], [0.3]], costs) == 0
    assert cost_model.batch_width_worth_verifying([[], []], costs) == 0


def test_best_k_and_the_crossover():
    # T_b(n) grows with b * n beyond 4 tokens: at batch 1 a long draft pays, at batch 2 a short one, at 4 none
    target = {b: {n: 100.0 * max(1.0, b * n / 4) for n in range(1, 6)} for b in (1, 2, 4)}
    draft = {b: {1: 10.0} for b in (1, 2, 4)}
    best = cost_model.best_k_per_batch(0.9, target, draft, [1, 2, 4])
    assert [best[b][0] for b in (1, 2)] == [4, 1] and best[4][1] < 1  # k shrinks as the batch grows
    assert cost_model.crossover_batch({b: ratio for b, (_, ratio) in best.items()}) == 4
    assert cost_model.crossover_batch({1: 1.5, 2: 1.1}) is None
    measured = pd.DataFrame({"batch_size": [1, 1, 2, 2], "k": [2, 4, 2, 4], "speedup": [1.3, 1.1, 0.9, 0.8],
                             "speedup_low": [1.2, 1.0, 0.8, 0.7], "speedup_high": [1.4, 1.2, 1.0, 0.9],
                             "decode_speedup": [1.5, 1.6, 1.1, 0.9], "decode_speedup_high": [1.6, 1.7, 1.2, 1.0],
                             "predicted": [1.2, 1.25, 0.95, 0.9]})
    chosen = batch_tables.best_k(measured).set_index("batch_size")
    assert chosen.loc[1].predicted_k == 4 and chosen.loc[1].measured_k == 2 and chosen.loc[2].measured == 0.9
    # at batch 2 the best k's point estimate is below 1 but its interval reaches 1.0: not shown to stop paying
    assert batch_tables.crossovers(batch_tables.best_k(measured)) == {"predicted": 2, "measured": None,
                                                                      "measured_point": 2, "decode": None}
    assert chosen.loc[1].decode_k == 4 and chosen.loc[2].decode == 1.1
    below = measured.assign(speedup_high=[1.4, 1.2, 0.95, 0.9])
    assert batch_tables.crossovers(batch_tables.best_k(below))["measured"] == 2


def test_the_drafts_alpha_pools_every_batch_size():
    rows = synthetic_rows()
    # each draft request: one step accepting 1 of 2 (a rejection), one accepting 0 of 2: 1 / (1 + 2)
    assert batch_tables.draft_alpha(rows) == pytest.approx(1 / 3)


PROMPTS = [Prompt(name, "code", f"1 {i + 5} {i + 6}") for i, name in enumerate("abcde")]


def test_batches_cut_every_prompt_once_per_repeat_and_reshuffle():
    units = bench.batch_units(PROMPTS, [1, 2, 4], repeats=2, seed=0)
    for repeat in (0, 1):
        for size, expected_groups in ((1, 5), (2, 2), (4, 1)):
            groups = [unit[3] for unit in units if unit[0] == size and unit[1] == repeat]
            assert len(groups) == expected_groups and all(len(g) == size for g in groups)
            ids = [p.id for g in groups for p in g]
            assert len(set(ids)) == len(ids)
    first = [[p.id for p in unit[3]] for unit in units if unit[0] == 2]
    assert first[:2] != first[2:]  # the second repeat pairs the prompts differently


def fake_batched(name, calls, fail_at=None):
    model = tiny_llama(0)

    def decode(batch):
        calls.append(len(batch))
        if fail_at is not None and len(calls) >= fail_at:
            raise KeyboardInterrupt("simulated interruption")
        return batched.generate_ar(model, batch, 3, stop_ids=[])
    return Method(name, decode, lossless=True, role="target AR")


def test_the_batch_runner_writes_a_row_per_request_and_resumes_whole_batches(tmp_path):
    out, calls = tmp_path / "runs.jsonl", []
    methods = [fake_batched("A", calls), fake_batched("B", calls, fail_at=4)]
    with pytest.raises(KeyboardInterrupt):
        bench.run_batches(methods, PROMPTS[:4], Tokens(), out, batch_sizes=[1, 2], warmup=0)
    written = jsonl.read(out)
    calls.clear()
    methods = [fake_batched("A", calls), fake_batched("B", calls)]
    rows = bench.run_batches(methods, PROMPTS[:4], Tokens(), out, batch_sizes=[1, 2], warmup=0)
    # 4 batches of 1 and 2 of 2, each method a row per request; the first batch finished before the
    # interruption and was not run again, the one it cut was run again whole
    assert len(rows) == 2 * (4 + 4) and sorted(rows.batch_size.unique()) == [1, 2]
    assert len(calls) == 2 * (6 - 1)
    assert jsonl.read(out)[: len(written)] == written
    assert set(rows.groupby(["batch_size", "repeat", "group"]).process.nunique()) == {1}
    with pytest.raises(ValueError, match="raise num_prompts"):
        bench.run_batches(methods, PROMPTS[:2], Tokens(), out, batch_sizes=[4])

