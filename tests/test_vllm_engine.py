"""Notebook 03's vLLM part: its tables on synthetic rows (the speedups paired in each configuration's own run,
vLLM's speculation over its AR through the shared baseline, acceptance by position from vLLM's counters, the
kit's fastest against vLLM's fastest), its records and parameters; and, where `make vllm` and `make llama-cpp`
were run, the part end to end on SmolLM2-135M."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdec_lab import params
from specdec_lab.decoders import llama_cpp_peer, vllm_peer
from specdec_lab.experiments import engines_words, lineups, vllm_engine
from specdec_lab.experiments.engines import PEER_AR, EngineTables
from specdec_lab.method import NO_WEIGHTS, CandidateSource, source_columns

NGRAM = CandidateSource("prompt lookup", "vllm", k=5, max_ngram=3)
VLLM_AR, VLLM_NGRAM = "vLLM AR (float32)", "vLLM ngram k=5 (float32)"
KIT_SAME = vllm_engine.kit_ar_label("float32")


def row(decoder, prompt_id, category, wall_time_s, run, tokens=range(8), source=None, engine="vllm", role="target AR",
        implementation="vllm", extras=None, accepted=(), proposed=()):
    tokens = list(tokens)
    return {"decoder": decoder, "prompt_id": prompt_id, "repeat": 0, "category": category, "tokens": tokens,
            "wall_time_s": wall_time_s, "time_to_first_token_s": 0.0, "num_tokens": len(tokens),
            "ms_per_token": 1000 * wall_time_s / len(tokens), "tokens_per_second": len(tokens) / wall_time_s,
            "peak_memory_bytes": None, "tokens_per_target_forward": 1.0, "acceptance_rate": 0.0,
            "accepted_per_step": list(accepted), "proposed_per_step": list(proposed), "engine": engine, "role": role,
            "implementation": implementation, "lossless": True, "extras": extras or {}, "vllm_run": run,
            **source_columns(source), **NO_WEIGHTS}


def peer(prompt_id, category, seconds, run):
    return row(PEER_AR, prompt_id, category, seconds, run, engine="llama.cpp", implementation="llama.cpp")


def vllm_rows() -> pd.DataFrame:
    """Two code prompts and one chat prompt. llama.cpp's AR takes 1 s in every run (the shared baseline);
    vLLM's AR 4 s on each prompt; its n-gram speculation 2 s on code prompt "a", 1 s on "b" (2x and 4x its AR)
    and 4 s on chat, where it parts from vLLM's AR text after 4 tokens. Its counters: 3 drafts of 5 tokens on
    "a", the first two accepted whole and the third up to its 2nd token; none on chat."""
    counters = {"a": {"vllm_drafts": 3, "vllm_draft_tokens": 15, "vllm_accepted": 12,
                      "vllm_accepted_per_position": [3, 3, 2, 2, 2]},
                "b": {"vllm_drafts": 1, "vllm_draft_tokens": 5, "vllm_accepted": 5,
                      "vllm_accepted_per_position": [1, 1, 1, 1, 1]},
                "c": {"vllm_drafts": 2, "vllm_draft_tokens": 10, "vllm_accepted": 0,
                      "vllm_accepted_per_position": [0, 0, 0, 0, 0]}}
    rows = []
    for prompt, category, ngram_s in (("a", "code", 2.0), ("b", "code", 1.0), ("c", "chat", 4.0)):
        kit_tokens = [0, 1, 2, 3, 4, 5, 7, 7] if prompt == "b" else range(8)  # parts from vLLM's at token 7 on "b"
        rows += [peer(prompt, category, 1.0, "AR"), row(VLLM_AR, prompt, category, 4.0, "AR"),
                 row(KIT_SAME, prompt, category, 3.0, "AR", tokens=kit_tokens, engine="transformers", implementation="ours"),
                 peer(prompt, category, 1.0, "ngram"),
                 row(VLLM_NGRAM, prompt, category, ngram_s, "ngram", source=NGRAM, role="speculative",
                     tokens=[0, 1, 2, 3, 9, 9, 9, 9] if prompt == "c" else range(8), extras=counters[prompt])]
    return pd.DataFrame(rows)


def test_each_configuration_is_paired_with_llama_cpp_in_its_own_run():
    per_kind = vllm_engine.per_kind_table(vllm_rows(), KIT_SAME).set_index(["category", "decoder"])
    assert per_kind.loc[("code", VLLM_AR)].speedup == pytest.approx(0.25)
    assert per_kind.loc[("code", VLLM_NGRAM)].speedup == pytest.approx(math.sqrt(0.5 * 1.0))  # geometric mean
    assert per_kind.loc[("code", VLLM_NGRAM)].prompts == 2
    assert per_kind.loc[("chat", VLLM_NGRAM)].agreement_with_vllm_ar == pytest.approx(0.5)
    assert per_kind.loc[("code", VLLM_NGRAM)].agreement_with_vllm_ar == 1.0
    assert per_kind.loc[("code", VLLM_AR)].agreement_with_kit_ar == pytest.approx((1 + 6 / 8) / 2)
    assert KIT_SAME not in per_kind.index.get_level_values(1)  # the kit's AR is the reference, not a vLLM line
    assert per_kind.loc[("code", VLLM_NGRAM)].acceptance == pytest.approx(17 / 20)  # accepted / drafted, pooled
    assert math.isnan(per_kind.loc[("code", VLLM_AR)].acceptance)


def test_vllms_ar_is_checked_against_the_kits_ar_on_the_same_weights():
    same = vllm_engine.same_weights_table(vllm_rows(), KIT_SAME).set_index("prompt_id")
    assert pd.isna(same.loc["a"].position) and same.loc["a"].agreement == 1.0
    assert same.loc["b"].position == 6 and (same.loc["b"].vllm_token, same.loc["b"].kit_token) == (6, 7)
    speed = vllm_engine.vllm_ar_over_kit_ar(vllm_rows(), KIT_SAME)
    assert speed.value == pytest.approx(3.0 / 4.0) and speed.prompts == 3


def test_speculation_over_vllms_ar_is_the_quotient_of_the_two_runs_ratios():
    """Per prompt (ngram / llama.cpp) / (vLLM AR / llama.cpp): 2x and 4x on code, 1x on chat. Reading the
    n-gram run's ratio alone would say 0.5x and 1x; pairing the wrong prompts would mix 2x with 1x."""
    table = vllm_engine.over_ar_table(vllm_rows()).set_index("category")
    assert table.loc["code"].speedup_over_vllm_ar == pytest.approx(math.sqrt(2.0 * 4.0))
    assert table.loc["code"].prompts == 2
    assert table.loc["chat"].speedup_over_vllm_ar == pytest.approx(1.0)
    assert list(table.vllm_run) == ["ngram", "ngram"]


def test_acceptance_by_position_reads_vllms_counters_as_conditional_rates():
    """Position 1 over the drafts (4 of 6 accepted), position i over the drafts whose first i - 1 tokens were
    accepted: 4 reached position 2 and all 4 were accepted there; of the 4 at position 3, 3 were."""
    table = vllm_engine.vllm_acceptance_by_position(vllm_rows()).set_index("position")
    assert table.loc[1].acceptance == pytest.approx(4 / 6) and table.loc[1].steps == 6
    assert table.loc[2].acceptance == pytest.approx(4 / 4)
    assert table.loc[3].acceptance == pytest.approx(3 / 4) and table.loc[3].steps == 4
    assert table.loc[5].acceptance == pytest.approx(3 / 3)


def test_the_kits_acceptance_stands_beside_vllms_for_the_same_kind_of_source_on_the_same_prompts():
    rows = vllm_rows()
    lookup = CandidateSource("prompt lookup", k=5, match="longest")
    kit_rows = pd.DataFrame([row("lookup (ours)", "a", "code", 1.0, None, source=lookup, role="speculative",
                                 implementation="ours", engine="llama.cpp", accepted=[2, 0], proposed=[3, 3]),
                             row("lookup (ours)", "z", "code", 1.0, None, source=lookup, role="speculative",
                                 implementation="ours", engine="llama.cpp", accepted=[0], proposed=[3]),
                             row("draft (ours)", "a", "code", 1.0, None, source=CandidateSource("draft model", k=4),
                                 role="speculative", implementation="ours", engine="llama.cpp", accepted=[1], proposed=[4])])
    table = vllm_engine.acceptance_table(rows, kit_rows)
    assert set(table.decoder) == {VLLM_NGRAM, "lookup (ours)"}  # no vLLM draft model ran: the kit's draft stays out
    ours = table[table.decoder == "lookup (ours)"].set_index("position")
    assert ours.loc[1].steps == 2  # prompt "z" is not one vLLM ran


def kit_tables(rows: pd.DataFrame) -> EngineTables:
    """Part 4's tables as far as the vLLM part reads them: the kit's rows (its hybrid 3x over llama.cpp's AR on
    "a", 1.5x on "b", and 2x on a prompt vLLM did not run) and its choice per kind."""
    kit_rows = []
    for prompt, hybrid_s in (("a", 1 / 3), ("b", 2 / 3), ("z", 0.5)):
        kit_rows += [peer(prompt, "code", 1.0, None),
                     row("hybrid (ours)", prompt, "code", hybrid_s, None, engine="llama.cpp", implementation="ours",
                         role="speculative", source=CandidateSource("hybrid", k=4))]
    best = pd.DataFrame([{"category": "code", "best": "hybrid (ours)"}, {"category": "chat", "best": None}])
    return EngineTables(pd.DataFrame(kit_rows), None, best, None, None, None, None, None, "torch", "torch")


def test_the_kits_fastest_is_read_on_the_prompts_vllm_ran():
    rows = vllm_rows()
    versus = vllm_engine.versus_kit_table(vllm_engine.per_kind_table(rows, KIT_SAME), kit_tables(rows),
                                          rows).set_index("category")
    code = versus.loc["code"]
    assert code.kit_speedup == pytest.approx(math.sqrt(3.0 * 1.5)) and code.kit_prompts == 2  # not prompt "z"
    assert code.vllm == VLLM_NGRAM and code.vllm_speedup == pytest.approx(math.sqrt(0.5))
    assert code.kit_over_vllm == pytest.approx(math.sqrt(4.5) / math.sqrt(0.5))
    assert code.vllm_ar_speedup == pytest.approx(0.25)
    assert "chat" not in versus.index  # no configuration of the kit equalled its AR there
    words = engines_words.kit_versus_vllm_sentences(versus.reset_index())
    assert "at least as fast as vLLM's fastest speculation, vLLM ngram k=5" in words[0]
    long = vllm_engine.versus_kit_long(versus.reset_index())
    assert len(long) == 2 and set(long.prompts) == {2}


def test_vllms_dtype_follows_the_cpus_bf16_hardware():
    assert vllm_engine.vllm_dtype("auto", ["avx2"]) == "float32"
    assert vllm_engine.vllm_dtype("auto", ["avx512_bf16", "avx512f", "avx2"]) == "bfloat16"
    assert vllm_engine.vllm_dtype("auto", ["amx_bf16"]) == "bfloat16"
    assert vllm_engine.vllm_dtype("bfloat16", ["avx2"]) == "bfloat16"


def test_the_configurations_are_source_records_vllm_runs_as_configs():
    from specdec_lab.experiments.vllm_export import config_of

    sources = vllm_engine.sources(["ngram", "draft_model", "suffix"], lookup_k=5, draft_k=4, suffix_k=16)
    assert list(sources) == ["AR", "ngram", "draft_model", "suffix"] and sources["AR"] is None
    assert config_of(sources["ngram"], None)[0] == {"method": "ngram", "num_speculative_tokens": 5,
                                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert config_of(sources["ngram"], None)[1] is None  # vLLM's own rule: nothing approximated
    assert config_of(sources["draft_model"], "/folder")[0] == {"method": "draft_model", "model": "/folder",
                                                               "num_speculative_tokens": 4}
    assert config_of(sources["suffix"], None)[0]["num_speculative_tokens"] == 16
    assert all(source.implementation == "vllm" for source in list(sources.values())[1:])


def test_a_vllm_method_runs_only_vllms_own_speculation(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("SPECDEC_VLLM_PYTHON", str(python))
    engine = vllm_peer.StartedOnFirstUse("folder")  # starts nothing until asked
    assert engine.peer is None
    method = lineups.vllm(engine, NGRAM, 8, VLLM_NGRAM)
    assert (method.engine, method.implementation, method.role) == ("vllm", "vllm", "speculative")
    with pytest.raises(ValueError, match="implementation must be 'vllm'"):
        lineups.vllm(engine, CandidateSource("prompt lookup", k=5), 8, "ours")


def test_the_vllm_part_needs_the_engines_part():
    found = params.problems("03_quantized", {"vllm": True, "engines": False})
    assert any("set engines: true" in problem for problem in found)
    found = params.problems("03_quantized", {"vllm_methods": ["ngram", "eagle"], "vllm_dtype": "float16"})
    assert any("'eagle'" in problem for problem in found) and any("vllm_dtype" in problem for problem in found)
    found = params.problems("03_quantized", {"vllm": True, "vllm_prompts": 3, "engine_prompts": 2})
    assert any("vllm_prompts = 3 exceeds engine_prompts = 2" in problem for problem in found)
    found = params.problems("05_batch", {"vllm": True, "vllm_methods": ["ngram"], "prompt_lookup_k": 0})
    assert any("set prompt_lookup_k >= 1" in problem for problem in found)


needs_both = pytest.mark.skipif(not (vllm_peer.available() and llama_cpp_peer.available()),
                                reason="the vLLM part needs `make vllm` and `make llama-cpp`")


@needs_both
def test_the_vllm_part_end_to_end_on_a_tiny_model(tmp_path):
    """SmolLM2-135M, AR and n-gram speculation on one code prompt and one chat prompt, beside llama.cpp's AR:
    in fp32 the speculation keeps vLLM's AR text, and each row sits in its configuration's run."""
    config = {**params.profile_values("03_quantized", "smoke"), "results_dir": str(tmp_path), "engines": True,
              "vllm": True, "vllm_methods": ["ngram"], "vllm_prompts": 1, "vllm_dtype": "float32",
              "engine_prompt_sets": ["humaneval", "mtbench"], "engine_max_new_tokens": 16, "warmup": 0, "repeats": 1}
    tables = vllm_engine.run(config)
    assert set(tables.rows.vllm_run) == {"AR", "ngram"} and len(tables.rows) == 10  # the kit's AR in the AR run
    assert tables.same_weights.position.isna().all()  # fp32: vLLM's AR text is the kit's
    assert (tables.per_kind.agreement_with_vllm_ar == 1.0).all()
    assert set(tables.over_vllm_ar.category) == {"code", "chat"} and tables.errors.empty
    assert tables.dtype == "float32" and (tmp_path / "03_quantized" / "vllm.jsonl").is_file()
    # vLLM's own counters of each n-gram call (test_vllm_peer checks them on suffix decoding)
    counted = [extras for extras in tables.rows[tables.rows.role == "speculative"].extras if "vllm_drafts" in extras]
    assert counted and sum(extras["vllm_drafts"] for extras in counted) > 0
    for extras in counted:
        assert 0 <= extras["vllm_accepted"] <= extras["vllm_draft_tokens"] <= config["prompt_lookup_k"] * extras["vllm_drafts"]
        assert sum(extras["vllm_accepted_per_position"]) == extras["vllm_accepted"]


# --- notebook 05: vLLM on the same batches ---------------------------------------------------------------

KIT_AR = lineups.BATCHED_AR


def batch_row(decoder, prompt_id, batch_size, group, seconds, run, role="target AR"):
    tokens = list(range(8))
    engine = "transformers" if decoder == KIT_AR else "vllm"
    return {"decoder": decoder, "prompt_id": prompt_id, "batch_size": batch_size, "repeat": 0, "group": group,
            "tokens": tokens, "num_tokens": len(tokens), "wall_time_s": seconds, "time_to_first_token_s": float("nan"),
            "extras": {"batch_wall_time_s": seconds}, "role": role, "engine": engine, "vllm_run": run,
            "implementation": "ours" if engine == "transformers" else "vllm"}


def batch_rows() -> pd.DataFrame:
    """Batches of 1 ("a", "b") and one batch of 2. The kit's batched AR takes 1 s a batch of 1 and 1.5 s the
    batch of 2 in both runs; vLLM's AR 2 s and 2 s; its n-gram speculation 1 s and 4 s: 2x its AR at batch 1,
    0.5x at batch 2."""
    rows = []
    for run, name, single_s, pair_s in (("AR", VLLM_AR, 2.0, 2.0), ("ngram", VLLM_NGRAM, 1.0, 4.0)):
        role = "target AR" if run == "AR" else "speculative"
        for group, prompt in enumerate(("a", "b")):
            rows += [batch_row(KIT_AR, prompt, 1, group, 1.0, run), batch_row(name, prompt, 1, group, single_s, run, role)]
        rows += [batch_row(KIT_AR, prompt, 2, 0, 1.5, run) for prompt in ("a", "b")]
        rows += [batch_row(name, prompt, 2, 0, pair_s, run, role) for prompt in ("a", "b")]
    return pd.DataFrame(rows)


def test_vllm_on_batches_is_paired_with_the_kits_batched_ar_in_each_run():
    table = vllm_engine.batch_table(batch_rows(), KIT_AR).set_index(["decoder", "batch_size"])
    assert KIT_AR not in table.index.get_level_values(0)
    assert table.loc[(VLLM_AR, 1)].speedup == pytest.approx(0.5) and table.loc[(VLLM_AR, 1)].batches == 2
    assert table.loc[(VLLM_AR, 2)].throughput == pytest.approx(16 / 2.0)  # 2 requests x 8 tokens in 2 s
    assert table.loc[(VLLM_AR, 2)].speedup == pytest.approx(0.75)
    assert table.loc[(VLLM_NGRAM, 2)].latency_speedup == pytest.approx(1.5 / 4.0)


def test_vllm_speculation_over_its_ar_on_batches_is_the_quotient_through_the_kits_ar():
    table = vllm_engine.batch_over_ar_table(batch_rows(), KIT_AR).set_index("batch_size")
    assert table.loc[1].speedup_over_vllm_ar == pytest.approx(2.0) and table.loc[1].batches == 2
    assert table.loc[2].speedup_over_vllm_ar == pytest.approx(0.5) and table.loc[2].batches == 1
    from specdec_lab.experiments import batch_words

    tables = vllm_engine.VllmBatchTables(batch_rows(), vllm_engine.batch_table(batch_rows(), KIT_AR), table.reset_index(),
                                         pd.DataFrame(columns=["configuration", "speculative_config", "error"]), "float32")
    text = batch_words.vllm_findings(tables)
    assert ("b=1: vLLM ngram k=5 (float32) makes 2.00x (95% CI 2.00-2.00, 2 batches) vLLM's AR's throughput: it pays"
            in text)
    # one batch has no interval: no verdict on it
    assert "b=2: vLLM ngram k=5 (float32) makes 0.50x (1 batch, no interval) vLLM's AR's throughput: it is not told apart" in text
    assert "b=1: vLLM AR (float32) makes 4.0 tokens/s over the batch, 0.50x (95% CI 0.50-0.50, 2 batches)" in text


@pytest.mark.skipif(not vllm_peer.available(), reason="vLLM is not installed: run `make vllm`")
def test_vllm_on_batches_end_to_end_on_a_tiny_model(tmp_path):
    """SmolLM2-135M in fp32, batches of 1 and 2 of two HumanEval prompts: vLLM's AR and n-gram speculation
    write the kit's batched AR text, each beside it in its own run."""
    from specdec_lab import data, models

    config = {**params.profile_values("05_batch", "smoke"), "results_dir": str(tmp_path), "vllm": True,
              "vllm_methods": ["ngram"], "vllm_dtype": "float32", "batch_sizes": [1, 2], "num_prompts": 2,
              "max_new_tokens": 12, "warmup": 0, "repeats": 1}
    target = models.load(config["target"], dtype="float32")
    prompts = data.load_prompts("humaneval", 2, seed=0)
    tables = vllm_engine.run_batches(config, lineups.batched_ar(target, 12), prompts, target.tokenizer)
    assert set(tables.table.batch_size) == {1, 2} and set(tables.table.vllm_run) == {"AR", "ngram"}
    kit = tables.rows[tables.rows.decoder == KIT_AR].drop_duplicates("prompt_id").set_index("prompt_id").tokens
    for row in tables.rows[tables.rows.engine == "vllm"].itertuples():
        assert row.tokens == kit[row.prompt_id]
    assert list(tables.over_vllm_ar.batch_size) == [1, 2]
