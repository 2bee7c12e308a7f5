"""Every parameter file is validated before any model loads; each bad input gets a message that
names the bad value (the README's table lists these checks)."""

import pytest

from specdec_lab import params, report
from specdec_lab.models import zoo
from specdec_lab.runs.paths import INTERACTIVE_NOTEBOOKS, REPO_ROOT


@pytest.mark.parametrize("profile", report.profiles())
def test_every_shipped_parameter_file_is_valid(profile):
    for path in report.parameter_files(profile):
        assert params.problems(path.stem, params.load_yaml(path)) == [], path


def test_every_profile_covers_the_same_notebooks():
    stems = {profile: sorted(p.stem for p in report.parameter_files(profile)) for profile in report.profiles()}
    assert len({tuple(v) for v in stems.values()}) == 1, stems
    notebooks = sorted(p.stem for p in params.NOTEBOOKS_DIR.glob("*.ipynb") if p.stem not in INTERACTIVE_NOTEBOOKS)
    assert stems["cpu"] == notebooks


GOOD = params.load_yaml(REPO_ROOT / "params/smoke/02_speculative.yaml")


@pytest.mark.parametrize("change, message", [
    ({"kk": 5}, "unknown parameter 'kk'"),
    ({"k": 0}, "k must be an integer >= 1, got 0"),
    ({"k": "5"}, "k must be int"),
    ({"k_values": [3, 0]}, "k_values must hold integers >= 1"),
    ({"max_new_tokens": -1}, "max_new_tokens must be an integer >= 1"),
    ({"repeats": 0}, "repeats must be an integer >= 1"),
    ({"prompt_sets": []}, "empty prompt set"),
    ({"prompt_sets": ["humanevil"]}, "unknown prompt set 'humanevil'"),
    ({"target": "no-such-model"}, "unknown model 'no-such-model'"),
    ({"draft": "/nowhere/model.gguf"}, "does not exist"),
    ({"dtype": "bf17"}, "dtype must be one of"),
    ({"device": "tpu"}, "device must be one of"),
    ({"dtype": "auto", "device": "cuda"}, "dtype 'auto' chooses among torch's CPU paths, but device is 'cuda'"),
    ({"fp32_control": "yes"}, "fp32_control must be bool"),
    ({"tree_nodes": -1}, "tree_nodes must be an integer >= 0"),
    ({"tree_branches": -1}, "tree_branches must be an integer >= 0"),
    ({"suffix_spec_factor": -1.0}, "suffix_spec_factor must be a number >= 0"),
    ({"tree_nodes": 8, "picker_prompts": 0}, "tree_nodes: 8 needs the draft picker"),
    ({"tree_nodes": 0, "cost_sized": True, "picker_prompts": 0}, "cost_sized: true needs the draft picker"),
])
def test_bad_values_are_named(change, message):
    found = params.problems("02_speculative", GOOD | change)
    assert any(message in problem for problem in found), found


def test_all_problems_are_reported_at_once():
    with pytest.raises(params.ParameterError) as error:
        params.validate("02_speculative", GOOD | {"k": 0, "repeats": 0})
    assert "k must" in str(error.value) and "repeats must" in str(error.value)


def test_bad_yaml_and_unknown_profile_and_notebook(tmp_path):
    broken = tmp_path / "01_baseline.yaml"
    broken.write_text("k: [1, 2\n")
    with pytest.raises(params.ParameterError, match="not valid YAML"):
        params.load_yaml(broken)
    with pytest.raises(params.ParameterError, match="unknown profile 'gpuu'"):
        report.parameter_files("gpuu")
    with pytest.raises(params.ParameterError, match="unknown notebook"):
        params.notebook_defaults("99_nothing")


def test_reproduce_stops_before_running_anything(tmp_path, monkeypatch):
    profile = tmp_path / "bad"
    profile.mkdir()
    (profile / "01_baseline.yaml").write_text("max_new_tokens: 0\n")
    monkeypatch.setattr(report, "PARAMS_DIR", tmp_path)
    assert report.main(["--profile", "bad"]) == 2


@pytest.mark.integration
def test_a_draft_with_another_tokenizer_is_refused_before_loading_weights():
    # small zoo models keep a fresh CI machine's download short: Gemma 3 and SmolLM2 tokenizers differ
    found = params.pair_problems({"target": "gemma-3-270m", "draft": "smollm2-135m-instruct"})
    assert found and "different vocabularies" in found[0]
    same_tokenizer = str(zoo.ensure("smollm2-135m-instruct"))  # the same model as a local folder
    assert params.pair_problems({"target": "smollm2-135m-instruct", "draft": same_tokenizer}) == []


CLLM_GOOD = params.load_yaml(REPO_ROOT / "params/smoke/04_cllm.yaml")


@pytest.mark.parametrize("change, message", [
    ({"lookahead_configs": [{"window": 5}]}, "lookahead_configs: a lookahead config is a mapping with window and ngram_size"),
    ({"lookahead_configs": [{"window": 5, "ngram_size": 1}]}, "ngram_size must be an integer >= 2, got 1"),
    ({"lookahead_configs": [{"window": 5, "ngram_size": 3, "W": 2}]}, "keys ['window', 'ngram_size'"),
    ({"lookahead_configs": [{"window": 5, "ngram_size": 3, "pool_from_prompt": "yes"}]}, "pool_from_prompt must be"),
    ({"cost_curve_models": [{"model": "smollm2-135m-instruct"}]}, "list of {model, dtype} mappings"),
    ({"cost_curve_models": [{"model": "gpt-17", "dtype": "float32"}]}, "unknown model 'gpt-17'"),
    ({"cost_curve_n": [2, 4]}, "starts with 1"),
    ({"dtype": "auto"}, "dtype 'auto' is for notebooks 01_baseline, 02_speculative, 05_batch; 04_cllm needs a dtype it names"),
    ({"reference_dtype": "auto", "device": "cuda"}, "reference_dtype 'auto' chooses among torch's CPU paths, but "
                                                    "device is 'cuda'"),
    ({"learning_curve_prompts": -1}, "learning_curve_prompts must be an integer >= 0"),
    ({"training_recipes": [{"lr": 1e-5}]}, "training_recipes must be a list of mappings with keys among "
                                           "['learning_rate', 'ar_weight']"),
    ({"training_recipes": [{"learning_rate": 0}]}, "training_recipes: learning_rate must be a number > 0, got 0"),
    ({"training_recipes": [{"learning_rate": 1e-5}, {"ar_weight": 3.0}], "learning_curve_prompts": 0},
     "training_recipes: 2 recipes are chosen among by their learning curves, which learning_curve_prompts: 0 turns off"),
    ({"label_smoothing": 1.5}, "label_smoothing must be a number in [0, 1]"),
    ({"max_nll_rise": -0.1}, "max_nll_rise must be a number >= 0"),
])
def test_bad_parallel_decoding_values_are_named(change, message):
    found = params.problems("04_cllm", CLLM_GOOD | change)
    assert any(message in problem for problem in found), found


def test_dtype_auto_is_taken_where_a_notebook_lets_it():
    assert params.problems("02_speculative", GOOD | {"dtype": "auto"}) == []
    assert params.problems("04_cllm", CLLM_GOOD | {"reference_dtype": "auto"}) == []


BATCH_GOOD = params.load_yaml(REPO_ROOT / "params/smoke/05_batch.yaml")


@pytest.mark.parametrize("change, message", [
    ({"batch_sizes": [1, 4, 2]}, "batch_sizes must be a sorted list of distinct batch sizes that starts with 1"),
    ({"batch_sizes": [0, 2]}, "batch_sizes must be a sorted list of distinct batch sizes that starts with 1"),
    ({"batch_sizes": [2, 4]}, "batch_sizes must be a sorted list of distinct batch sizes that starts with 1"),
    ({"batch_sizes": []}, "batch_sizes must be a sorted list"),
    ({"batch_sizes": [1, 3, 8], "num_prompts": 4}, "batch_sizes: [3, 8] do not divide num_prompts = 4"),
    ({"k_values": [0]}, "k_values must hold integers >= 1"),
])
def test_bad_batch_values_are_named(change, message):
    found = params.problems("05_batch", BATCH_GOOD | change)
    assert any(message in problem for problem in found), found
    assert params.problems("05_batch", BATCH_GOOD | {"dtype": "auto"}) == []
