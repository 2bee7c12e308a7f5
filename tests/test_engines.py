"""Every decoder on both engines: transformers, and llama.cpp running the same tiny models written
to GGUF (tiny.save_gguf). Lossless on an engine means that engine's own greedy output, token for
token; the bug-catching checks of the decoder tests run on llama.cpp's cache and masks too."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tiny import PROMPT, copy_llama, on_llama_cpp, tiny_llama
from specdec_lab.decoders import autoregressive, draft_then_score, jacobi, lookahead, speculative
from specdec_lab.decoders.backend import engine, open_sequence, stop_token_ids, vocab_size
from specdec_lab.decoders.candidates import Candidates, DraftModelCandidates, HybridCandidates, PromptLookupCandidates
from specdec_lab.decoders.lookahead import lookahead_mask
from specdec_lab.models import llama_cpp
from specdec_lab.sampling import GREEDY

needs_llama_cpp = pytest.mark.skipif(not llama_cpp.available(),
                                     reason="llama-cpp-python is not installed: `make llama-cpp` (CI installs it)")
ENGINES = ["transformers", pytest.param("llama.cpp", marks=needs_llama_cpp)]

MODELS = {  # built once; written to GGUF once per engine fixture
    "target": lambda: tiny_llama(seed=0),
    "draft": lambda: tiny_llama(seed=1, layers=1),
    "small": lambda: tiny_llama(0, vocab_size=16, hidden=32, weight_std=0.3, eos_token_id=None),  # repeats itself
    "copy": lambda: copy_llama(lag=3),  # reads positions from the cache: an entry too many or too few shows
}


@pytest.fixture(scope="module")
def torch_models():
    return {name: make() for name, make in MODELS.items()}


@pytest.fixture(scope="module", params=ENGINES)
def on(request, torch_models, tmp_path_factory):
    """on(name): the model called `name` on this module's engine."""
    if request.param == "transformers":
        return lambda name: torch_models[name]
    engines = {name: on_llama_cpp(model, tmp_path_factory.mktemp(name)) for name, model in torch_models.items()}
    return lambda name: engines[name]


def ar(model, prompt=PROMPT, max_new_tokens=40):
    return autoregressive.generate(model, prompt, max_new_tokens, stop_ids=[]).tokens


# --- the engine itself ------------------------------------------------------------------------------------

@needs_llama_cpp
def test_the_gguf_file_is_the_same_model(torch_models, tmp_path):
    """The converter writes what transformers computes (q and k rows permuted for llama.cpp's rope):
    logits agree within llama.cpp's f16 KV cache rounding, and the greedy texts are the same."""
    for name in ("target", "copy"):
        model = torch_models[name]
        engine_model = on_llama_cpp(model, tmp_path / name)
        ours = open_sequence(engine_model).forward(PROMPT)
        with torch.inference_mode():
            theirs = model(torch.tensor([PROMPT])).logits[0]
        assert (ours - theirs).abs().max() < 0.02 * theirs.abs().max(), name
        assert ar(engine_model) == ar(model), name
    assert engine(engine_model) == "llama.cpp" and vocab_size(engine_model) == model.config.vocab_size


def test_crop_rolls_the_cache_back(on):
    """A forward after a crop equals a fresh pass over the kept tokens: a crop that left the rolled-
    back entries in place would shift the copy model's positions and change its logits."""
    model = on("copy")
    sequence = open_sequence(model)
    sequence.forward(PROMPT + [20, 21, 22])
    sequence.crop(len(PROMPT))
    assert sequence.length == len(PROMPT)
    after_crop = sequence.forward([23], keep=1)[-1]
    fresh = open_sequence(model).forward(PROMPT + [23], keep=1)[-1]
    assert torch.allclose(after_crop, fresh, atol=1e-4)


@pytest.mark.parametrize("keep, rows", [(1, [9]), (3, [7, 8, 9]), (0, list(range(10))), ([0, 4], [0, 4]),
                                        ([4, 0], [4, 0]), ([4, 4], [4, 4]), ([-1, 2], [9, 2])])
def test_keep_selects_the_rows(on, keep, rows):
    model = on("target")
    every = open_sequence(model).forward(PROMPT + [20, 21])
    kept = open_sequence(model).forward(PROMPT + [20, 21], keep=keep)
    assert torch.allclose(kept, every[rows], atol=1e-4)


def test_masked_forward_gives_each_query_only_what_it_sees(on):
    """Each query of a lookahead pass (input, window levels, candidate n-grams) gets the logits of a
    plain causal pass over exactly the tokens its mask row shows, at their positions. A window token
    that saw its neighbour column, or a candidate that saw another candidate, would differ."""
    model = on("target")
    levels, candidates, inputs = [[10, 11, 12], [13, 14, 15]], [(20, 21), (30,)], [5, 6]
    sequence = open_sequence(model)
    sequence.forward(PROMPT)
    cached = sequence.length
    visible = lookahead_mask(cached, len(inputs), levels, candidates)
    tokens = [*inputs, *(t for level in levels for t in level), *(t for c in candidates for t in c)]
    current = cached + len(inputs) - 1
    positions = [cached, cached + 1, *(current + offset for offset in lookahead.window_positions(levels)),
                 current + 1, current + 2, current + 1]
    logits = sequence.forward(tokens, positions=positions, visible=visible)
    sequence.crop(cached + len(inputs))
    continued = sequence.forward([7], keep=1)[-1]  # the branches are gone: as if only the input had been fed
    for query in range(len(tokens)):
        seen = [i for i in range(len(tokens)) if visible[query, cached + i]]
        assert [positions[i] for i in seen] == list(range(cached, cached + len(seen))), "a branch is a causal chain"
        plain = open_sequence(model).forward(PROMPT + [tokens[i] for i in seen], keep=1)[-1]
        assert torch.allclose(logits[query], plain, atol=1e-3), query
    assert torch.allclose(continued, open_sequence(model).forward(PROMPT + inputs + [7], keep=1)[-1], atol=1e-3)


@needs_llama_cpp
def test_llama_cpp_refuses_what_it_cannot_do(torch_models, tmp_path):
    model = on_llama_cpp(torch_models["target"], tmp_path)
    first = open_sequence(model)
    first.forward(PROMPT)
    second = open_sequence(model)  # one KV cache per loaded file: the first sequence is gone
    with pytest.raises(RuntimeError, match="replaced by a newer one.*load the file twice"):
        first.forward([5])
    second.forward(PROMPT)
    visible = torch.ones(2, len(PROMPT) + 2, dtype=torch.bool)
    visible[0, -1] = False  # causal...
    visible[1, -2] = False  # ...but query 1 skips query 0 and sees position 9 after the cache's 7
    with pytest.raises(ValueError, match="positions a query sees.*without gaps"):
        second.forward([5, 6], positions=[len(PROMPT), len(PROMPT) + 1], visible=visible)
    levels = [[10, 11], [12, 13]]  # the input, then window token (0, 0) are causal; (0, 1) is not seen by (1, 0)
    positions = [len(PROMPT), *(len(PROMPT) + offset for offset in lookahead.window_positions(levels))]
    second.forward([5, 10, 11, 12, 13], positions=positions, visible=lookahead_mask(len(PROMPT), 1, levels, []))
    with pytest.raises(RuntimeError, match="masked forward's tokens are still in the cache"):
        second.forward([7])
    with pytest.raises(ValueError, match="causal part only"):
        second.crop(len(PROMPT) + 3)
    assert second.length == len(PROMPT) + 2
    fresh = open_sequence(on_llama_cpp(torch_models["target"], tmp_path / "fresh")).forward(PROMPT + [5, 10, 7], keep=1)
    assert torch.allclose(second.forward([7], keep=1), fresh, atol=1e-4)  # the input and w00 stayed, nothing else


@needs_llama_cpp
def test_a_failed_masked_forward_leaves_the_cache_as_it_was(torch_models, tmp_path):
    """A token id past the vocabulary makes llama_decode fail after the prefix was copied into the
    branches' sequence ids: those copies and any written cell must go, or a later pass would see them."""
    model = on_llama_cpp(torch_models["target"], tmp_path)
    sequence = open_sequence(model)
    sequence.forward(PROMPT)
    levels = [[10, 11], [12, 13]]
    positions = [len(PROMPT), *(len(PROMPT) + offset for offset in lookahead.window_positions(levels))]
    mask = lookahead_mask(len(PROMPT), 1, levels, [])
    with pytest.raises(RuntimeError, match="llama_decode failed"):
        sequence.forward([5, 10, 11, 12, vocab_size(model) + 5], positions=positions, visible=mask)
    assert sequence.length == len(PROMPT)
    shorter = len(PROMPT) - 3  # stale branch ids on the prefix's last cells would keep them alive past a crop
    sequence.crop(shorter)
    positions = [shorter, *(shorter + offset for offset in lookahead.window_positions(levels))]
    mask = lookahead_mask(shorter, 1, levels, [])
    logits = sequence.forward([5, 10, 11, 12, 13], positions=positions, visible=mask)
    reference = open_sequence(on_llama_cpp(torch_models["target"], tmp_path / "ref"))
    reference.forward(PROMPT[:shorter])
    assert torch.allclose(logits, reference.forward([5, 10, 11, 12, 13], positions=positions, visible=mask), atol=1e-4)
    sequence.crop(shorter)
    too_many = lookahead_mask(shorter, 1, [], [(t,) for t in range(llama_cpp.MAX_SEQUENCES)])
    with pytest.raises(ValueError, match="off the causal path needs more than"):
        sequence.forward([5] * (1 + llama_cpp.MAX_SEQUENCES), positions=[shorter] + [shorter + 1] * llama_cpp.MAX_SEQUENCES,
                         visible=too_many)


# --- every decoder: lossless against its engine's own greedy output --------------------------------------

@pytest.mark.parametrize("k", [1, 3, 8])
def test_speculative_with_a_draft_equals_ar(on, k):
    result = speculative.generate(on("target"), DraftModelCandidates(on("draft"), k), PROMPT, 48, stop_ids=[])
    assert result.tokens == ar(on("target"), max_new_tokens=48)
    assert result.draft_forwards > 0


@needs_llama_cpp
def test_a_draft_on_the_other_engine(torch_models, tmp_path):
    """The target on llama.cpp with a transformers draft, and the other way round."""
    target, draft = torch_models["target"], torch_models["draft"]
    target_engine, draft_engine = on_llama_cpp(target, tmp_path / "t"), on_llama_cpp(draft, tmp_path / "d")
    result = speculative.generate(target_engine, DraftModelCandidates(draft, 3), PROMPT, 40, stop_ids=[])
    assert result.tokens == ar(target_engine)
    result = speculative.generate(target, DraftModelCandidates(draft_engine, 3), PROMPT, 40, stop_ids=[])
    assert result.tokens == ar(target)


def test_the_target_drafting_for_itself_accepts_everything(on, torch_models, tmp_path):
    """Catches a bonus token from the wrong row or a draft cache not rolled back: with the target's
    own weights as the draft every proposal is accepted (llama.cpp: the file loaded twice)."""
    target = on("target")
    draft = on_llama_cpp(torch_models["target"], tmp_path) if engine(target) == "llama.cpp" else target
    result = speculative.generate(target, DraftModelCandidates(draft, 4), PROMPT, 40, stop_ids=[])
    assert result.tokens == ar(target)
    assert result.accepted_per_step == [4] * 8 and result.target_forwards == 8


def test_the_target_cache_keeps_the_accepted_prefix_only(on):
    target = on("target")
    free = ar(target, max_new_tokens=5)
    tokens = PROMPT + free[:1]
    sequence = open_sequence(target)
    autoregressive.prefill(sequence, PROMPT)
    wrong = (free[3] + 1) % vocab_size(target)
    accepted, token = speculative.speculative_step(sequence, tokens, Candidates([free[1], free[2], wrong, free[4]]),
                                                   GREEDY, None)
    assert (accepted, token) == (free[1:3], free[3]) and sequence.length == len(tokens) + len(accepted)
    cached = sequence.forward([token], keep=1)[-1]
    fresh = open_sequence(target).forward(tokens + free[1:3] + [token], keep=1)[-1]
    assert torch.allclose(cached, fresh, atol=1e-4)


@pytest.mark.parametrize("match", ["latest", "longest"])
def test_prompt_lookup_equals_ar(on, match):
    target, repetitive = on("small"), [t % 16 for t in PROMPT * 3]
    result = speculative.generate(target, PromptLookupCandidates(5, match=match), repetitive, 40, stop_ids=[])
    assert result.tokens == ar(target, repetitive)
    assert sum(result.accepted_per_step) > 0


def test_the_hybrid_equals_ar(on):
    target, prompt = on("target"), PROMPT * 3
    hybrid = HybridCandidates(on("draft"), k=3, prompt_lookup_k=5)
    result = speculative.generate(target, hybrid, prompt, 40, stop_ids=[])
    assert result.tokens == ar(target, prompt)


@pytest.mark.parametrize("block_size", [2, 5, 16])
def test_jacobi_equals_ar(on, block_size):
    for name in ("target", "copy"):
        model = on(name)
        assert jacobi.generate(model, PROMPT, 30, block_size=block_size, stop_ids=[]).tokens == ar(model, max_new_tokens=30)


def test_jacobi_fixes_several_tokens_an_iteration(on):
    """The copy model's fixed point is reached several tokens at a time; their cache entries are kept."""
    model = on("copy")
    result = jacobi.generate(model, PROMPT, 30, block_size=8, init="prompt_tokens", stop_ids=[])
    assert result.tokens == ar(model, max_new_tokens=30)
    assert result.tokens_per_target_forward > 1.5


@pytest.mark.parametrize("window, ngram_size, candidates, pool_from_prompt", [(5, 3, 5, False), (3, 2, 3, True),
                                                                              (4, 4, 2, False)])
def test_lookahead_equals_ar(on, window, ngram_size, candidates, pool_from_prompt):
    for name in ("small", "copy"):
        model = on(name)
        prompt = [t % 16 for t in PROMPT]
        result = lookahead.generate(model, prompt, 40, window=window, ngram_size=ngram_size, candidates=candidates,
                                    pool_from_prompt=pool_from_prompt, stop_ids=[])
        assert result.tokens == ar(model, prompt), name
    assert sum(result.accepted_per_step) > 0  # the copy model's n-grams are accepted


def test_draft_then_score_is_the_drafts_text_scored_by_the_target(on, torch_models):
    result = draft_then_score.generate(on("target"), on("draft"), PROMPT, 12, stop_ids=[])
    assert result.tokens == ar(on("draft"), max_new_tokens=12)
    reference = draft_then_score.generate(torch_models["target"], torch_models["draft"], PROMPT, 12, stop_ids=[])
    score = result.extras["target_mean_log_likelihood"]
    assert score == pytest.approx(reference.extras["target_mean_log_likelihood"], abs=0.02)


def test_stop_ids_come_from_the_model(on):
    assert 3 in stop_token_ids(on("target"))  # tiny_llama's EOS


# --- notebook 03's engines part, end to end on the zoo's smallest GGUF -------------------------------------

@needs_llama_cpp
def test_the_engines_experiment_compares_both_engines_per_kind(tmp_path):
    """SmolLM2-135M drafting for itself on both engines (llama.cpp on its Q4_1 file, torch on the
    path measured fastest), two kinds of text: every method has its rows, its speedup over
    llama.cpp's AR, its agreement with its own engine's AR, and the cost model its prediction."""
    from specdec_lab.experiments import engines, engines_words

    params = {"profile": "test", "results_dir": str(tmp_path / "results"), "target": "smollm2-135m-instruct",
              "draft": "smollm2-135m-instruct", "engine_prompt_sets": ["humaneval", "mtbench"], "engine_prompts": 2,
              "engine_max_new_tokens": 12, "engine_k": 3, "prompt_lookup_k": 4, "engine_cost_curve_n": [1, 2, 4, 9],
              "cost_curve_repeats": 1, "torch_path": "float32", "repeats": 1, "warmup": 0, "seed": 0,
              "cost_sized": True}
    tables = engines.run(params)
    names = set(tables.rows.decoder)
    assert len(names) == 10 and engines.PEER_AR in names
    assert set(tables.per_kind.category) == {"code", "chat"}
    assert set(tables.per_kind.engine) == {"transformers", "llama.cpp"}
    kit = tables.per_kind[tables.per_kind.implementation == "ours"]
    assert kit.agreement_with_engine_ar.notna().all() and (kit.prompts == 2).all()
    torch_rows = tables.per_kind[tables.per_kind.engine == "transformers"]
    assert (torch_rows.agreement_with_engine_ar == 1.0).all()  # fp32 torch: the decoders are exact
    assert set(tables.predicted.engine) == {"transformers", "llama.cpp"} and tables.predicted.predicted.gt(0).all()
    assert set(tables.curves.engine) == {"transformers", "llama.cpp"}
    assert len(tables.roofline) == 3 and tables.roofline.fraction_of_bound.between(0.01, 1.5).all()
    assert len(tables.best) == 2 and tables.torch_path == "torch fp32"
    assert tables.torch_ar_path == "torch fp32"  # a dtype given: the one path of both
    for sentence in [engines_words.paths_sentence(tables.dense_paths, tables.torch_path, tables.torch_ar_path),
                     *engines_words.roofline_sentences(tables.roofline),
                     *engines_words.cost_sentences(tables.curves), *engines_words.best_sentences(tables.best),
                     *engines_words.prediction_sentences(tables.predicted, tables.curves),
                     engines_words.differences_sentence(tables.first_differences, tables.per_kind, tables.torch_path)]:
        assert sentence and "nan" not in sentence, sentence


@needs_llama_cpp
def test_what_only_transformers_does_says_so(torch_models, tmp_path):
    from specdec_lab import hardware
    from specdec_lab.decoders import hf_peers

    model = on_llama_cpp(torch_models["target"], tmp_path)
    with pytest.raises(ValueError, match="transformers' generate needs a transformers model.*llama.cpp"):
        hf_peers.generate(model, PROMPT, 4)
    with pytest.raises(ValueError, match="KV cache bytes.*llama.cpp"):
        hardware.kv_cache_bytes_at(model, PROMPT, 10)


def test_the_prediction_prices_each_step_at_the_engines_own_costs():
    """Synthetic rows whose times follow the engine's T(n) exactly: AR makes 8 tokens in a prefill
    and 7 steps of T(1) = 10 ms; prompt lookup proposes 3 tokens a step, all accepted (alpha = 1),
    each verify pass costing T(4) = 25 ms, so 4 tokens per 25 ms against 1 per 10 ms: 1.6x; the
    draft model pays its 3 steps of 2 ms on top: 40/31. The first step (with the prefill) counts in
    neither, so prediction and measurement agree."""
    from specdec_lab.experiments.engines import engine_ar, predicted_table
    from specdec_lab.method import CandidateSource, Method

    def method(name, role, source=None):
        return Method(name, lambda ids: None, lossless=True, role=role, source=source, engine="llama.cpp")
    methods = [method("AR", "target AR"), method("lookup", "speculative", CandidateSource("prompt lookup", k=3)),
               method("draft", "speculative", CandidateSource("draft model", k=3))]
    assert {engine_ar(methods, m).name for m in methods} == {"AR"}
    curves = pd.DataFrame({"n": [1, 2, 4, 1], "ms_fit": [10.0, 14.0, 25.0, 2.0], "engine": ["llama.cpp"] * 4,
                           "model_role": ["target"] * 3 + ["draft"]})
    rows = []
    for prompt in ("p1", "p2"):
        rows.append({"decoder": "AR", "accepted_per_step": [0] * 8, "proposed_per_step": [0] * 8, "after": 0.070})
        rows.append({"decoder": "lookup", "accepted_per_step": [3, 3], "proposed_per_step": [3, 3], "after": 0.025})
        rows.append({"decoder": "draft", "accepted_per_step": [3, 3], "proposed_per_step": [3, 3], "after": 0.031})
        for row in rows[-3:]:
            row.update(prompt_id=prompt, category="code", repeat=0, tokens=list(range(8)), num_tokens=8,
                       time_to_first_token_s=0.5, wall_time_s=0.5 + row.pop("after"))
    table = predicted_table(pd.DataFrame(rows), methods, curves).set_index("decoder")
    assert table.loc["lookup", "predicted"] == pytest.approx(4 * 10 / 25)
    assert table.loc["draft", "predicted"] == pytest.approx(4 * 10 / (25 + 3 * 2))
    assert table.loc["lookup", "measured"] == pytest.approx(1.6) and table.loc["draft", "measured"] == pytest.approx(40 / 31)
    assert table.error.abs().max() < 1e-9


@needs_llama_cpp
def test_a_zoo_model_stops_on_the_same_tokens_on_both_engines():
    from specdec_lab import models

    on_llama = models.load_on_llama_cpp("smollm2-135m-instruct")
    on_torch = models.load("smollm2-135m-instruct", dtype="float32")
    assert stop_token_ids(on_llama.model) == stop_token_ids(on_torch.model) != frozenset()
    assert on_llama.quantization == "Q4_1" and on_llama.dtype is None and on_llama.weight_bytes > 50e6


def test_each_method_is_checked_against_the_ar_of_its_own_engine_and_weights():
    """With the torch AR a user would run (int4 weight-only) beside the verifying target's (bf16),
    a torch method's reference is the AR on its own weights, never the other torch AR."""
    from specdec_lab.experiments.engines import engine_ar
    from specdec_lab.method import CandidateSource, Method, Weights

    def method(name, role, engine, quantization, source=None):
        return Method(name, lambda ids: None, lossless=True, role=role, source=source, engine=engine,
                      weights=Weights(quantization=quantization))
    lookup = CandidateSource("prompt lookup", k=3)
    ar_llama, ar_bf16, ar_int4 = (method("AR llama", "target AR", "llama.cpp", "Q4_K_M"),
                                  method("AR bf16", "target AR", "transformers", "none"),
                                  method("AR int4", "target AR", "transformers", "int4-wo"))
    lookup_torch = method("lookup torch", "speculative", "transformers", "none", lookup)
    lookup_llama = method("lookup llama", "speculative", "llama.cpp", "Q4_K_M", lookup)
    methods = [ar_llama, ar_bf16, ar_int4, lookup_torch, lookup_llama]
    assert engine_ar(methods, lookup_torch) is ar_bf16
    assert engine_ar(methods, ar_int4) is ar_int4
    assert engine_ar(methods, lookup_llama) is ar_llama
    with pytest.raises(ValueError, match="expected one AR of the kit on transformers with none weights"):
        engine_ar([*methods, method("AR bf16 again", "target AR", "transformers", "none")], lookup_torch)
