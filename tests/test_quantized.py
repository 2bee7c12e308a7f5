"""Notebook 03's experiment module: KV cache bytes, the footprint sweep, the speculative grid."""

from __future__ import annotations

import pytest

from specdec_lab import hardware, memory, metrics, models, quality
from specdec_lab.data import Prompt
from specdec_lab.decoders import autoregressive
from specdec_lab.decoders.backend import open_sequence
from specdec_lab.experiments import quantized, quantized_tables, quantized_words

pytest.importorskip("bitsandbytes")

PROMPT = [1, 5, 9, 14, 3, 22, 7]
VOCAB, HIDDEN, LAYERS, KV_HEADS, HEADS = 64, 64, 2, 2, 4  # tiny_llama: 2 layers, 4 heads, 2 KV heads


# --- memory -------------------------------------------------------------------------------------------------

def test_kv_cache_bytes_match_the_cache_shape(load):
    head_dim = HIDDEN // HEADS
    expected_fp32 = 2 * LAYERS * KV_HEADS * head_dim * 30 * 4
    assert hardware.kv_cache_bytes_at(load("target", "none").model, PROMPT, 30) == expected_fp32
    assert hardware.kv_cache_bytes_at(load("target", "torch-int8").model, PROMPT, 30) == expected_fp32
    assert hardware.kv_cache_bytes_at(load("target", "nf4", "bfloat16").model, PROMPT, 30) == expected_fp32 // 2


def test_kv_cache_bytes_at_equals_the_cache_after_a_generation(load):
    model = load("target", "none").model
    sequence = open_sequence(model)
    token = int(autoregressive.prefill(sequence, PROMPT).argmax())
    for _ in range(9):
        token = int(autoregressive.decode_one_token(sequence, token).argmax())
    assert memory.kv_cache_bytes(sequence.cache) == hardware.kv_cache_bytes_at(model, PROMPT, len(PROMPT) + 9)


# --- the notebook's runners ----------------------------------------------------------------------------------

PROMPTS = [Prompt("p1", "code", "t1 t5 t9 t14 t3"), Prompt("p2", "code", "t22 t7 t8 t2")]


def test_footprint_sweep_measures_and_resumes(folders, tmp_path):
    kwargs = dict(dtype="float32", device="cpu", double_quant=False, max_new_tokens=12, repeats=1, warmup=0,
                  out_dir=tmp_path, config={"test": 1})
    footprints, rows = quantized.footprint_sweep({"target": folders["target"]}, ["none", "nf4"], PROMPTS, **kwargs)
    table = quantized_tables.footprint_table(footprints, rows)
    by_name = table.set_index("quantization")
    assert by_name.loc["nf4", "weight_bytes"] < by_name.loc["none", "weight_bytes"]
    assert (table.kv_cache_bytes > 0).all() and (table.perplexity > 1).all()
    assert len(quantized_words.tradeoff_sentences(table)) == 1
    # speed ratios are taken side by side: both variants of a prompt ran in one process, interleaved
    assert (rows.groupby("prompt_id").process.nunique() == 1).all()
    per_prompt = rows.pivot_table(index="prompt_id", columns="quantization", values="ms_per_token")
    expected = metrics.geometric_mean(per_prompt["none"] / per_prompt["nf4"])
    assert by_name.loc["nf4", "speed_vs_unquantized"] == pytest.approx(expected)
    # agreement is measured against the unquantized model's output, not the variant's own
    none_tokens = rows[rows.quantization == "none"].set_index("prompt_id").tokens
    nf4 = rows[rows.quantization == "nf4"]
    scores = [quality.greedy_agreement(none_tokens[p], t).fraction for p, t in zip(nf4.prompt_id, nf4.tokens)]
    assert by_name.loc["nf4", "agreement"] == pytest.approx(sum(scores) / len(scores))
    def line_counts():
        return [(tmp_path / name).read_text().count("\n") for name in ("ar.jsonl", "footprints.jsonl")]
    before = line_counts()
    quantized.footprint_sweep({"target": folders["target"]}, ["none", "nf4"], PROMPTS, **kwargs)
    assert line_counts() == before == [2 * 1 * len(PROMPTS), 2]


def test_footprint_sweep_hands_its_variants_to_the_grid(folders, tmp_path, monkeypatch):
    pairs = ["none/nf4", "nf4/none"]
    variants = {}
    quantized.footprint_sweep({"target": folders["target"]}, ["none", "nf4", "int8"], PROMPTS[:1],
                              dtype="float32", device="cpu", double_quant=False, max_new_tokens=4, repeats=1,
                              warmup=0, out_dir=tmp_path, config={}, variants=variants)
    quantized.free_unneeded(variants, pairs, folders["target"], folders["draft"])
    assert set(variants) == {(folders["target"], "none"), (folders["target"], "nf4")}  # int8 was freed
    loads = []
    monkeypatch.setattr(quantized, "load_variant", lambda spec, name, *a, **kw: loads.append((spec, name)) or
                        models.load(spec, dtype="float32", quantization=name))
    quantized.speculative_grid(pairs, PROMPTS[:1], target=folders["target"], draft=folders["draft"],
                               dtype="float32", device="cpu", double_quant=False, k=2, max_new_tokens=4,
                               repeats=1, warmup=0, out=tmp_path / "spec.jsonl", config={}, variants=variants)
    assert sorted(loads) == sorted([(folders["draft"], "nf4"), (folders["draft"], "none")])  # each loaded once
    assert (folders["target"], "none") not in variants  # a target is freed after its group


def test_speculative_grid_is_lossless_for_quantized_drafts(folders, tmp_path):
    rows = quantized.speculative_grid(
        ["none/nf4", "none/self-int8", "nf4/none"], PROMPTS, target=folders["target"], draft=folders["draft"],
        dtype="float32", device="cpu", double_quant=False, k=3, max_new_tokens=12, repeats=1, warmup=0,
        out=tmp_path / "spec.jsonl", config={"test": 1})
    unquantized_ar = rows[rows.decoder == "target fp32 AR"]
    table = quantized_tables.speculative_table(rows, unquantized_reference=unquantized_ar).set_index("pair")
    assert list(table.index) == ["target fp32 · draft nf4", "target fp32 · self LLM.int8", "target nf4 · draft fp32"]
    assert (table.agreement_with_target == 1.0).all() and (table.full_match_rate == 1.0).all()
    acceptance = table.acceptance_rate
    assert acceptance["target fp32 · self LLM.int8"] > acceptance["target fp32 · draft nf4"]
    assert table.loc["target fp32 · draft nf4", "agreement_with_unquantized"] == 1.0
    assert (table.speedup > 0).all() and (table.prompts == len(PROMPTS)).all()
    # only a pair whose target is unquantized is declared lossless, and a quantized target's pair is
    # scored against the unquantized target's output, not only against its own quantized AR
    assert table.lossless.to_dict() == {"target fp32 · draft nf4": True, "target fp32 · self LLM.int8": True,
                                        "target nf4 · draft fp32": False}
    reference = unquantized_ar.set_index("prompt_id").tokens
    pair = rows[rows.decoder == "target nf4 · draft fp32"]
    scores = [quality.greedy_agreement(reference[p], t).fraction for p, t in zip(pair.prompt_id, pair.tokens)]
    assert table.loc["target nf4 · draft fp32", "agreement_with_unquantized"] == pytest.approx(sum(scores) / len(scores))


def test_grid_with_prompt_lookup_cost_curves_best_k_and_a_peer_in_the_same_run(folders, tmp_path, monkeypatch):
    """Prompt lookup runs on every target variant; T(n) is measured for every variant the grid uses;
    the best-k table reads them; every configuration is timed against the peer AR of the same run
    (here a stand-in for llama.cpp: our AR of the int4 copy, marked as the llama.cpp implementation)."""
    from specdec_lab.experiments import lineups
    from specdec_lab.method import Method

    stand_in = models.load(folders["target"], dtype="float32", quantization="int4-wo")

    def fake_llama_cpp_ar(engine, like, max_new_tokens, name="llama.cpp AR (GGUF as is)", weights=None):
        ar = lineups.ar(stand_in, max_new_tokens)
        return Method(name, ar.decode, lossless=False, role="target AR", implementation="llama.cpp")

    monkeypatch.setattr(lineups, "llama_cpp_ar", fake_llama_cpp_ar)
    pairs = ["none/int4-wo", "int8-wo/int4-wo"]
    specs = {"target": folders["target"], "draft": folders["draft"]}
    variants = {key: models.load(key[0], dtype="float32", quantization=key[1])
                for key in quantized.needed_variants(pairs, folders["target"], folders["draft"])}
    curves = quantized.cost_curves(variants, specs, "float32", [1, 2, 4, 8], repeats=1)
    assert set(curves.variant) == {"target fp32", "target int8 weight-only", "draft int4 weight-only"}
    assert (curves.ms > 0).all() and (curves[curves.n == 1].relative_to_one == 1.0).all()
    rows = quantized.speculative_grid(pairs, PROMPTS, dtype="float32", device="cpu", double_quant=False, k=3,
                                      max_new_tokens=12, repeats=1, warmup=0, out=tmp_path / "spec.jsonl",
                                      config={}, variants=variants, prompt_lookup_k=4, engine=object(),
                                      **{"target": folders["target"], "draft": folders["draft"]})
    assert (rows.groupby(["baseline", "prompt_id"]).process.nunique() == 1).all()  # one run per target variant
    reference = rows[rows.decoder == "target fp32 AR"]
    table = quantized_tables.speculative_table(rows, reference).set_index("pair")
    assert set(table.source) == {"draft model", "prompt lookup"}
    assert "target int8 weight-only · prompt lookup k=4 adaptive, longest match" in table.index
    assert (table.agreement_with_target == 1.0).all()  # fp32: lossless against each target's own AR
    best_k = quantized_tables.best_k_table(table.reset_index(), rows, curves).set_index("pair")
    assert set(best_k.index) == {"target fp32 · draft int4 weight-only", "target int8 weight-only · draft int4 weight-only"}
    t1 = curves[curves.n == 1].set_index("variant").ms
    assert best_k.target_T1_ms.to_dict() == {"target fp32 · draft int4 weight-only": t1["target fp32"],
                                             "target int8 weight-only · draft int4 weight-only":
                                                 t1["target int8 weight-only"]}
    assert (best_k.draft_T1_ms == t1["draft int4 weight-only"]).all()
    assert best_k.best_k.between(1, 7).all()  # k + 1 within the measured n (up to 8)
    versus = quantized_tables.versus_llama_cpp(rows, reference).set_index("configuration")
    assert len(versus) == 2 * 3  # per target variant: its AR, its pair, its prompt lookup
    per_prompt = rows[rows.baseline == "target fp32 AR"].pivot_table(index="prompt_id", columns="decoder",
                                                                      values="ms_per_token")
    expected = metrics.geometric_mean(per_prompt["llama.cpp AR (GGUF as is)"] / per_prompt["target fp32 AR"])
    fp32_ar = versus[versus.target == "fp32"].loc["target fp32 AR"]
    assert fp32_ar.vs_llama_cpp == pytest.approx(expected)
    best = quantized_tables.fastest_lossless(versus.reset_index())
    assert best.full_match_rate == 1.0 and best.vs_llama_cpp == versus[versus.full_match_rate == 1].vs_llama_cpp.max()
