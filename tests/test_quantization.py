"""Quantized loading, quantized speculative decoding, bad combinations, memory and quality measures.

Tiny random Llama models saved to a folder with a word-level tokenizer, so `models.load` runs
its real path (bitsandbytes and torch.ao included) in milliseconds; compute in fp32.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from specdec_lab import memory, models, quality, quantization
from specdec_lab.data import Prompt
from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.decoders.candidates import DraftModelCandidates
from tiny import tiny_llama

pytest.importorskip("bitsandbytes")

PROMPT = [1, 5, 9, 14, 3, 22, 7]
VOCAB, HIDDEN, LAYERS, KV_HEADS, HEADS = 64, 64, 2, 2, 4  # tiny_llama: 2 layers, 4 heads, 2 KV heads


def save_tiny_model(path, seed: int, bias: bool = False) -> str:
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers

    model = tiny_llama(seed, vocab_size=VOCAB, hidden=HIDDEN, weight_std=0.3, eos_token_id=None, bias=bias)
    model.save_pretrained(path)
    words = Tokenizer(token_models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0").save_pretrained(path)
    return str(path)



@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {"target": save_tiny_model(tmp_path_factory.mktemp("target"), 0),
            "draft": save_tiny_model(tmp_path_factory.mktemp("draft"), 1)}


@pytest.fixture(scope="module")
def load(folders):
    """Loaded variants, cached per (role, quantization, dtype) for the module."""
    cache = {}

    def get(role: str, name: str, dtype: str = "float32"):
        key = (role, name, dtype)
        if key not in cache:
            cache[key] = quantization.load_variant(folders[role], name, dtype, "cpu")
        return cache[key]
    return get


# --- loading -----------------------------------------------------------------------------------------

LINEAR_TYPE = {"nf4": "bitsandbytes.nn.modules.Linear4bit", "fp4": "bitsandbytes.nn.modules.Linear4bit",
               "int8": "bitsandbytes.nn.modules.Linear8bitLt", "none": "torch.nn.modules.linear.Linear",
               "torch-int8": "torch.ao.nn.quantized.dynamic.modules.linear.Linear"}


@pytest.mark.parametrize("name", quantization.NAMES)
def test_each_quantization_loads_and_runs(load, name):
    loaded = load("target", name)
    layer = loaded.model.model.layers[0].mlp.up_proj
    assert f"{type(layer).__module__}.{type(layer).__name__}" == LINEAR_TYPE[name]
    assert loaded.quantization == (None if name == "none" else name)
    logits = autoregressive.prefill(loaded.model, PROMPT, quantization.new_cache(loaded.model))
    assert logits.shape[-1] == VOCAB and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["nf4", "fp4", "int8", "torch-int8"])
def test_quantized_weights_are_smaller(load, name):
    assert load("target", name).weight_bytes < load("target", "none").weight_bytes


def test_double_quant_4bit_loads(folders):
    loaded = quantization.load_variant(folders["target"], "nf4", "float32", "cpu", double_quant=True)
    assert loaded.model.model.layers[0].mlp.up_proj.weight.quant_state.nested


def test_torch_int8_weight_bytes_count_the_packed_int8_weights(load):
    """get_memory_footprint misses the packed weights of torch.ao layers; weight_bytes adds them:
    the same model with one byte instead of four per nn.Linear weight (the tiny model has no biases)."""
    plain = load("target", "none").model
    linear_weights = sum(m.weight.numel() for m in plain.modules() if isinstance(m, torch.nn.Linear))
    quantized = load("target", "torch-int8")
    assert quantized.weight_bytes == plain.get_memory_footprint() - 3 * linear_weights
    assert quantized.model.get_memory_footprint() == plain.get_memory_footprint() - 4 * linear_weights


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("name", ["nf4", "torch-int8"])
def test_quantized_cpu_model_does_not_keep_the_checkpoint_mapped(tmp_path, name):
    """Otherwise every checkpoint page read while quantizing stays in the RSS that peak memory reports
    (biases included: torch.ao's packed layers keep the bias tensor they were given)."""
    folder = save_tiny_model(tmp_path, 2, bias=True)
    loaded = quantization.load_variant(folder, name, "float32", "cpu")
    assert str(tmp_path / "model.safetensors") not in Path("/proc/self/maps").read_text()
    assert loaded.weight_bytes > 0


def test_bf16_4bit_compute_labels(load):
    loaded = load("target", "nf4", "bfloat16")
    assert loaded.model.model.layers[0].mlp.up_proj.compute_dtype == torch.bfloat16
    assert quantization.label("nf4", "bfloat16") == "nf4" and quantization.label("none", "bfloat16") == "bf16"
    assert quantization.dtype_for("torch-int8", "bfloat16") == "float32"


# --- speculative decoding with quantized drafts and targets -------------------------------------------

@pytest.mark.parametrize("target_name, drafts", [
    ("none", [("draft", "nf4"), ("draft", "int8"), ("draft", "torch-int8"),
              ("target", "nf4"), ("target", "torch-int8")]),
    ("nf4", [("draft", "none"), ("draft", "int8"), ("target", "torch-int8")]),
    ("fp4", [("draft", "nf4")]),
    ("int8", [("draft", "none"), ("draft", "nf4"), ("target", "torch-int8")]),
])
def test_greedy_speculative_with_quantized_draft_equals_target_ar(load, target_name, drafts):
    """Another model or the target's own quantized copy drafts; the target verifies every token."""
    target = load("target", target_name).model
    expected = autoregressive.generate(target, PROMPT, 24, stop_ids=[]).tokens
    for role, draft_name in drafts:
        draft = load(role, draft_name).model
        result = speculative.generate(target, DraftModelCandidates(draft, 4), PROMPT, 24, stop_ids=[])
        assert result.tokens == expected, (role, draft_name)
        assert result.draft_forwards > 0


def test_own_quantized_copy_is_a_better_draft_than_another_model(load):
    target = load("target", "none").model
    own = speculative.generate(target, DraftModelCandidates(load("target", "int8").model, 4), PROMPT, 24, stop_ids=[])
    other = speculative.generate(target, DraftModelCandidates(load("draft", "int8").model, 4), PROMPT, 24, stop_ids=[])
    assert own.acceptance_rate > other.acceptance_rate


def test_torch_int8_output_of_a_row_depends_on_the_other_rows():
    """Why a torch-int8 *target* can leave its own AR output under speculative decoding: dynamic
    quantization picks one activation scale per call, over every token the call holds."""
    torch.manual_seed(0)
    layer = quantization.models.torch_int8(torch.nn.Sequential(torch.nn.Linear(16, 16)))
    one_token = torch.randn(1, 16)
    block = torch.cat([one_token, 50 * torch.randn(1, 16)])  # a second token with a larger range
    assert torch.equal(layer(one_token), layer(one_token.clone()))
    assert not torch.allclose(layer(block)[:1], layer(one_token), atol=1e-4)


# --- bad combinations fail before anything loads -------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(quantization="int4"), r"unknown quantization 'int4'.*nf4"),
    (dict(quantization="torch-int8", device="cuda"), r"torch-int8.*CPU kernels only.*device='cpu'"),
    (dict(quantization="torch-int8", dtype="bfloat16"), r"torch-int8.*float32.*use dtype='float32'"),
    (dict(quantization="int8", double_quant=True), r"double_quant.*4-bit.*not 'int8'"),
    (dict(quantization=None, double_quant=True), r"double_quant"),
])
def test_bad_combinations_are_refused(folders, kwargs, message):
    with pytest.raises(ValueError, match=message):
        models.load(folders["target"], **{"dtype": "float32", **kwargs})


def test_bitsandbytes_on_a_gguf_file_is_refused_before_reading_it(tmp_path):
    with pytest.raises(ValueError, match=r"'nf4' of a \.gguf file.*zoo name"):
        models.load(str(tmp_path / "missing.gguf"), quantization="nf4")


def test_device_bitsandbytes_does_not_support(folders, monkeypatch):
    import bitsandbytes

    monkeypatch.setattr(bitsandbytes, "supported_torch_devices", {"cuda"}, raising=False)
    with pytest.raises(ValueError, match=r"cannot run 'nf4' on 'cpu'.*torch-int8"):
        models.load(folders["target"], quantization="nf4")


def test_missing_bitsandbytes_says_how_to_install(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        models.load(folders["target"], quantization="int8")


@pytest.mark.parametrize("pair, message", [
    ("none-nf4", "target_quantization/draft_quantization"),
    ("none/int4", "'int4' is not a quantization"),
    ("nf4/self-nf4", "self-draft must be quantized differently"),
])
def test_bad_pairs(pair, message):
    with pytest.raises(ValueError, match=message):
        quantization.parse_pair(pair)


def test_pairs_are_checked_against_the_device_before_loading():
    with pytest.raises(ValueError, match="torch-int8.*CPU kernels only"):
        quantization.check_pairs(["none/none", "none/self-torch-int8"], device="cuda")
    assert quantization.check_pairs(["none/self-torch-int8"], "cpu") == [quantization.Pair("none", "torch-int8", True)]


def test_full_grid():
    grid = quantization.full_grid(["none", "nf4"], ["nf4"])
    assert grid == ["none/none", "none/nf4", "nf4/none", "nf4/nf4", "none/self-nf4"]


# --- quiet logs --------------------------------------------------------------------------------------------

def test_llm_int8_per_matmul_warning_is_dropped_and_others_kept(load, caplog):
    with caplog.at_level(logging.WARNING):
        autoregressive.generate(load("target", "int8").model, PROMPT, 3, stop_ids=[])
        logging.getLogger("bitsandbytes.autograd._functions").warning("something that matters")
    messages = [r.getMessage() for r in caplog.records]
    assert not any("MatMul8bitLt" in m for m in messages)
    assert "something that matters" in messages


def test_bitsandbytes_import_message_about_an_optional_kernel_is_dropped():
    """bitsandbytes logs at import that it could not fetch an optional CPU kernel from the hub."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import specdec_lab.models, bitsandbytes"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "gemm_4bit_forward" not in done.stderr


# --- memory -------------------------------------------------------------------------------------------------

def test_kv_cache_bytes_match_the_cache_shape(load):
    head_dim = HIDDEN // HEADS
    expected_fp32 = 2 * LAYERS * KV_HEADS * head_dim * 30 * 4
    assert quantization.kv_cache_bytes_at(load("target", "none").model, PROMPT, 30) == expected_fp32
    assert quantization.kv_cache_bytes_at(load("target", "torch-int8").model, PROMPT, 30) == expected_fp32
    assert quantization.kv_cache_bytes_at(load("target", "nf4", "bfloat16").model, PROMPT, 30) == expected_fp32 // 2


def test_kv_cache_bytes_at_equals_the_cache_after_a_generation(load):
    model = load("target", "none").model
    cache = quantization.new_cache(model)
    token = int(autoregressive.prefill(model, PROMPT, cache).argmax())
    for _ in range(9):
        token = int(autoregressive.decode_one_token(model, token, cache).argmax())
    assert memory.kv_cache_bytes(cache) == quantization.kv_cache_bytes_at(model, PROMPT, len(PROMPT) + 9)


# --- quality ------------------------------------------------------------------------------------------------

def test_greedy_agreement():
    same = quality.greedy_agreement([1, 2, 3, 4], [1, 2, 3, 4])
    assert same.full_match and same.fraction == 1.0
    diverged = quality.greedy_agreement([1, 2, 3, 4], [1, 2, 9, 4])
    assert diverged.matched_prefix == 2 and diverged.fraction == 0.5 and not diverged.full_match
    shorter = quality.greedy_agreement([1, 2, 3, 4], [1, 2])
    assert shorter.fraction == 0.5 and not shorter.full_match
    assert not quality.greedy_agreement([1, 2], [1, 2, 3]).full_match


def test_perplexity_on_own_greedy_text_is_lower_than_on_random_tokens(load):
    model = load("target", "none").model
    own = PROMPT + autoregressive.generate(model, PROMPT, 40, stop_ids=[]).tokens
    random_tokens = torch.randint(0, VOCAB, (len(own),), generator=torch.Generator().manual_seed(0)).tolist()
    own_ppl, random_ppl = quality.perplexity(model, [own]), quality.perplexity(model, [random_tokens])
    assert math.isfinite(own_ppl) and 1.0 <= own_ppl < random_ppl


def test_perplexity_pools_tokens_and_equals_exp_mean_nll(load):
    model = load("target", "none").model
    a, b = PROMPT, [3, 4, 5]
    nll = torch.cat([quality.token_nll(model, a), quality.token_nll(model, b)])
    assert quality.perplexity(model, [a, b]) == pytest.approx(math.exp(nll.mean().item()))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        quality.token_nll(model, [1])


def test_text_perplexity_of_quantized_model_differs_but_stays_finite(load):
    tokenizer = load("target", "none").tokenizer
    texts = ["t1 t2 t3 t4 t5 t6 t7 t8", "t9 t8 t7 t6 t5"]
    plain = quality.text_perplexity(load("target", "none").model, tokenizer, texts)
    four_bit = quality.text_perplexity(load("target", "nf4").model, tokenizer, texts)
    assert math.isfinite(four_bit) and four_bit != plain


# --- the notebook's runners ----------------------------------------------------------------------------------

PROMPTS = [Prompt("p1", "code", "t1 t5 t9 t14 t3"), Prompt("p2", "code", "t22 t7 t8 t2")]


def test_footprint_sweep_measures_and_resumes(folders, tmp_path):
    kwargs = dict(dtype="float32", device="cpu", double_quant=False, max_new_tokens=12, repeats=1, warmup=0,
                  out_dir=tmp_path, config={"test": 1})
    footprints, rows = quantization.footprint_sweep({"target": folders["target"]}, ["none", "nf4"], PROMPTS, **kwargs)
    table = quantization.footprint_table(footprints, rows)
    by_name = table.set_index("quantization")
    assert by_name.loc["none", "agreement"] == 1.0 and by_name.loc["none", "speed_vs_unquantized"] == 1.0
    assert by_name.loc["nf4", "weight_bytes"] < by_name.loc["none", "weight_bytes"]
    assert (table.kv_cache_bytes > 0).all() and (table.perplexity > 1).all()
    assert len(quantization.tradeoff_sentences(table)) == 1
    def line_counts():
        return [(tmp_path / name).read_text().count("\n") for name in ("ar.jsonl", "footprints.jsonl")]
    before = line_counts()
    quantization.footprint_sweep({"target": folders["target"]}, ["none", "nf4"], PROMPTS, **kwargs)
    assert line_counts() == before == [2 * 1 * len(PROMPTS), 2]


def test_footprint_sweep_hands_kept_variants_to_the_grid(folders, tmp_path, monkeypatch):
    pairs = ["none/nf4", "nf4/none"]
    keep = quantization.variants_to_keep(pairs, folders["target"], folders["draft"], "cpu")
    assert keep == {(folders["target"], "none"), (folders["target"], "nf4"), (folders["draft"], "nf4"),
                    (folders["draft"], "none")}
    assert quantization.variants_to_keep(pairs, folders["target"], folders["draft"], "cuda") == set()
    variants = {}
    quantization.footprint_sweep({"target": folders["target"]}, ["none", "nf4", "int8"], PROMPTS[:1],
                                 dtype="float32", device="cpu", double_quant=False, max_new_tokens=4, repeats=1,
                                 warmup=0, out_dir=tmp_path, config={}, variants=variants, keep=keep)
    assert set(variants) == {(folders["target"], "none"), (folders["target"], "nf4")}  # int8 was freed
    loads = []
    monkeypatch.setattr(quantization, "load_variant", lambda spec, name, *a, **kw: loads.append((spec, name)) or
                        models.load(spec, dtype="float32", quantization=None if name == "none" else name))
    quantization.speculative_grid(pairs, PROMPTS[:1], target=folders["target"], draft=folders["draft"],
                                  dtype="float32", device="cpu", double_quant=False, k=2, max_new_tokens=4,
                                  repeats=1, warmup=0, out=tmp_path / "spec.jsonl", config={}, variants=variants)
    assert sorted(loads) == sorted([(folders["draft"], "nf4"), (folders["draft"], "none")])  # each loaded once
    assert (folders["target"], "none") not in variants  # a target is freed after its group


def test_speculative_grid_is_lossless_for_quantized_drafts(folders, tmp_path):
    rows = quantization.speculative_grid(
        ["none/nf4", "none/self-int8", "nf4/none"], PROMPTS, target=folders["target"], draft=folders["draft"],
        dtype="float32", device="cpu", double_quant=False, k=3, max_new_tokens=12, repeats=1, warmup=0,
        out=tmp_path / "spec.jsonl", config={"test": 1})
    unquantized_ar = rows[rows.decoder == quantization.target_ar_name("none", "float32")]
    table = quantization.speculative_table(rows, unquantized_reference=unquantized_ar).set_index("pair")
    assert list(table.index) == ["target fp32 · draft nf4", "target fp32 · self LLM.int8", "target nf4 · draft fp32"]
    assert (table.agreement_with_target == 1.0).all() and (table.full_match_rate == 1.0).all()
    acceptance = table.acceptance_rate
    assert acceptance["target fp32 · self LLM.int8"] > acceptance["target fp32 · draft nf4"]
    assert table.loc["target fp32 · draft nf4", "agreement_with_unquantized"] == 1.0
    assert (table.speedup > 0).all()


# --- parameters ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["smoke", "cpu", "cpu-full"])
def test_parameter_files_are_valid(profile):
    from specdec_lab import report

    values = report.validate_all(report.parameter_files(profile, ["03_quantized"]))["03_quantized"]
    quantization.check_pairs(values["spec_pairs"], device=values["device"], dtype=values["dtype"])


def test_gpu_parameter_file_pairs_parse():
    """Its hub model ids cannot be checked offline; its quantizations and pairs can."""
    from specdec_lab import params, report

    values = params.load_yaml(report.PARAMS_DIR / "gpu-gemma2" / "03_quantized.yaml")
    for name in ("quantizations", "spec_pairs", "footprint_models", "footprint_repeats"):
        assert params.RULES[name](name, values[name]) is None
    assert "torch-int8" not in values["quantizations"]  # CPU only: refused on cuda
    assert all(quantization.parse_pair(pair) for pair in values["spec_pairs"])


@pytest.mark.parametrize("name, value, message", [
    ("spec_pairs", ["none/int4"], "'int4' is not a quantization"),
    ("quantizations", ["none", "q4"], r"unknown quantization\(s\) \['q4'\]"),
    ("footprint_models", ["target", "drafts"], "target', 'draft"),
    ("double_quant", "yes", "must be bool"),
])
def test_bad_parameters_are_named(name, value, message):
    from specdec_lab import params

    problems = params.problems("03_quantized", {name: value})
    assert len(problems) == 1 and re.search(message, problems[0])
