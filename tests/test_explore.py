"""The explorer: every method it offers runs on tiny fp32 models and the lossless ones write AR's text,
bad choices get a clear error in the UI instead of a traceback, the widgets work when code drives them,
and notebooks/00_explore.ipynb executes headless with its widgets driven by its own last cell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdec_lab import explore
from specdec_lab.explore import Explorer, ExplorerUI, Settings

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "t1 t2 t3 t4 t5 t1 t2 t3 t4"  # the tiny word-level tokenizer's words; a repeat for prompt lookup


@pytest.fixture(scope="module")
def explorer(folders):
    return Explorer.load(folders["target"], draft=folders["draft"], dtype="float32")


def test_every_method_on_the_menu_runs_and_the_lossless_ones_write_ars_text(explorer):
    assert explorer.methods == [explore.AR, explore.DRAFT, explore.DRAFT_TREE, explore.LOOKUP, explore.SUFFIX,
                                explore.HYBRID, explore.LOOKAHEAD, explore.JACOBI]  # no CLLM loaded: no CLLM entry
    for name in explorer.methods:
        run = explorer.run(PROMPT, Settings(name, k=3, max_new_tokens=24))
        assert run.method.lossless and run.result.tokens == run.ar.tokens, name
        assert run.summary().startswith(run.method.name) and "the same text as AR" in run.summary()
        assert len(run.result.token_origins) == run.result.num_tokens
        assert 'class="tv-legend"' in run._repr_html_()


def test_suffix_decoding_reads_the_answers_of_earlier_runs(explorer):
    """The same method (and its tree of earlier answers) from run to run: a prompt that continues an earlier
    answer has it proposed."""
    settings = Settings(explore.SUFFIX, tree_nodes=8, max_new_tokens=16)
    first = explorer.run("t5 t4 t3", settings)
    assert explorer.method(settings) is first.method
    words = explorer.target.tokenizer.decode(first.result.tokens[:3])
    again = explorer.run(f"t5 t4 t3 {words}", settings)
    assert again.result.tokens == again.ar.tokens


def test_sampling_runs_where_the_method_samples_and_is_refused_where_it_cannot(explorer):
    run = explorer.run(PROMPT, Settings(explore.HYBRID, temperature=0.8, max_new_tokens=16))
    assert "sampled" in run.summary()
    with pytest.raises(ValueError, match="decodes greedily: set temperature 0"):
        explorer.run(PROMPT, Settings(explore.JACOBI, temperature=0.8))


@pytest.mark.parametrize("settings, message", [
    (Settings("beam search"), "'beam search' is not available here"),
    (Settings(explore.AR, max_new_tokens=0), "max_new_tokens must be >= 1"),
    (Settings(explore.DRAFT, k=0), "k must be >= 1"),
])
def test_bad_choices_are_named(explorer, settings, message):
    with pytest.raises(ValueError, match=message):
        explorer.run(PROMPT, settings)
    with pytest.raises(ValueError, match="the prompt is empty"):
        explorer.run("  ", Settings())


def test_without_a_draft_the_draft_methods_leave_the_menu(folders):
    alone = Explorer.load(folders["target"], dtype="float32")
    assert explore.DRAFT not in alone.methods and explore.HYBRID not in alone.methods
    with pytest.raises(ValueError, match="load a draft model"):
        alone.run(PROMPT, Settings(explore.DRAFT))


def test_the_widgets_driven_by_code(explorer):
    ui = ExplorerUI(explorer, prompt_sets=("blog",), per_set=2)
    assert len(ui.prompts) == 2 and ui.method.options == tuple(explorer.methods)
    ui.text.value, ui.method.value, ui.k.value, ui.max_new_tokens.value = PROMPT, explore.LOOKUP, 4, 16
    ui.run_button.click()
    assert ui.last.settings == Settings(explore.LOOKUP, k=4, tree_nodes=8, max_new_tokens=16)
    assert ui.last.result.tokens == ui.last.ar.tokens
    ui.picked.value = next(iter(ui.prompts))  # a prompt from a set replaces the typed text
    ui.run_button.click()
    assert ui.last.result.prompt_length != len(explorer.encode(PROMPT))
    ui.method.value, ui.temperature.value = explore.LOOKAHEAD, 0.5
    assert ui.run() is None and ui.last is None  # said in the output area, not raised


@pytest.mark.integration
def test_the_explorer_notebook_runs_headless_with_its_widgets_driven_by_its_last_cell(folders, tmp_path):
    import papermill

    out = tmp_path / "explore.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "00_explore.ipynb"), str(out), cwd=str(ROOT / "notebooks"), kernel_name="python3",
        progress_bar=False, parameters={"target": folders["target"], "draft": folders["draft"], "cllm": "",
                                        "dtype": "float32", "prompt_sets": ["blog"], "demo_prompt": PROMPT,
                                        "demo_methods": [explore.AR, explore.LOOKUP, explore.HYBRID]})
    cells = json.loads(out.read_text())["cells"]
    shown = ["".join(output["data"]["text/html"]) for cell in cells for output in cell.get("outputs", [])
             if "text/html" in output.get("data", {})]
    views = [html for html in shown if 'class="tv-legend"' in html]
    assert len(views) == 3, f"expected the three demo methods' views, got {len(views)}"
    assert all("the same text as AR" in html for html in views)
    assert any("application/vnd.jupyter.widget-view+json" in output.get("data", {})
               for cell in cells for output in cell.get("outputs", []))


def test_a_cllm_of_the_target_joins_the_menu_and_one_of_another_model_is_refused_or_left_out(folders, tmp_path):
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from tiny import TINY_VOCAB, save_tiny_model

    with_cllm = Explorer.load(folders["target"], cllm=folders["draft"], dtype="float32")  # any model of its tokenizer
    assert with_cllm.methods[-1] == explore.CLLM_JACOBI
    run = with_cllm.run(PROMPT, Settings(explore.CLLM_JACOBI, max_new_tokens=12))
    assert not run.method.lossless and len(run.result.tokens) == 12
    other = save_tiny_model(tmp_path / "other", 2)
    words = Tokenizer(token_models.WordLevel({f"u{i}": i for i in range(TINY_VOCAB)}, unk_token="u0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="u0").save_pretrained(other)
    with pytest.raises(ValueError, match="trained from another model than the target"):
        Explorer.load(folders["target"], cllm=other, dtype="float32")
    assert explore.CLLM_JACOBI not in Explorer.load(folders["target"], cllm=other, dtype="float32",
                                                    cllm_required=False).methods
