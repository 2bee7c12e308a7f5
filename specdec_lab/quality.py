"""What a faster model costs in output quality, measured against a reference model.

Two measures, both deterministic:
- greedy token agreement: how far a greedy generation follows the reference's greedy tokens
  (the fraction of the reference matched before the first differing token, and whether all match);
- perplexity on a small fixed text set (`TEXTS`, plain text, no chat template): exp of the mean
  negative log-likelihood per predicted token, all texts pooled.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# A fixed, small, mixed evaluation set (code, prose, SQL, a docstring), written for this kit so
# it is free to ship. Small on purpose: it ranks quantizations of one model against each other; it
# is not a language-modelling benchmark and says nothing across tokenizers.
TEXTS: tuple[str, ...] = (
    "def fibonacci(n: int) -> list[int]:\n"
    '    """Return the first n Fibonacci numbers."""\n'
    "    numbers = [0, 1]\n"
    "    while len(numbers) < n:\n"
    "        numbers.append(numbers[-1] + numbers[-2])\n"
    "    return numbers[:n]\n",
    "The train left the station a few minutes after noon. Most passengers were reading or looking "
    "out of the window at the fields, which were still wet from the morning rain. A child in the "
    "last carriage asked her father how long the journey would take, and he said it would be dark "
    "before they arrived.",
    "SELECT customers.name, COUNT(orders.id) AS order_count\n"
    "FROM customers\n"
    "JOIN orders ON orders.customer_id = customers.id\n"
    "WHERE orders.created_at >= '2024-01-01'\n"
    "GROUP BY customers.name\n"
    "ORDER BY order_count DESC\n"
    "LIMIT 10;",
    "import json\n\n\n"
    "def load_config(path):\n"
    "    with open(path) as handle:\n"
    "        config = json.load(handle)\n"
    "    if 'name' not in config:\n"
    "        raise ValueError(f'{path}: missing the name field')\n"
    "    return config\n",
    "Photosynthesis turns light into chemical energy. Plants take in carbon dioxide from the air and "
    "water from the soil, and with the energy of sunlight they build sugars, releasing oxygen as a "
    "by-product.",
)


def common_prefix_length(reference: Sequence[int], candidate: Sequence[int]) -> int:
    """How many leading tokens two sequences share: the one prefix-agreement rule of the kit
    (greedy agreement, Jacobi's converged prefix, quantized vs unquantized output)."""
    length = 0
    for ours, theirs in zip(reference, candidate):
        if ours != theirs:
            break
        length += 1
    return length


@dataclass(frozen=True)
class Agreement:
    matched_prefix: int  # tokens identical to the reference before the first difference
    reference_length: int
    full_match: bool  # the same tokens, same length

    @property
    def fraction(self) -> float:
        """Share of the reference reproduced before the first divergence (1.0 = full match)."""
        if self.full_match:
            return 1.0
        return self.matched_prefix / self.reference_length if self.reference_length else float("nan")

    @property
    def first_divergence(self) -> int | None:
        """Index of the first differing token; None when the two are identical."""
        return None if self.full_match else self.matched_prefix


def greedy_agreement(reference: Sequence[int], candidate: Sequence[int]) -> Agreement:
    """Compare two greedy generations of the same prompt token by token."""
    reference, candidate = list(reference), list(candidate)
    return Agreement(common_prefix_length(reference, candidate), len(reference), reference == candidate)


def continuation_nll(model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
    """Negative log-likelihood (nats, float32) of each output token given the prompt and the output
    before it, in one forward pass (no cache): the one scoring rule of the kit. Gradients flow when
    called under autograd; wrap in torch.no_grad() to score only."""
    prompt_ids, output_ids = list(prompt_ids), list(output_ids)
    if not prompt_ids or not output_ids:
        raise ValueError(f"need at least one prompt and one output token to score, got {len(prompt_ids)} "
                         f"and {len(output_ids)}")
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids + output_ids], dtype=torch.long, device=device)
    logits = model(input_ids=input_ids, use_cache=False).logits[0, len(prompt_ids) - 1: -1]
    return nll_from_logits(logits, output_ids)


def nll_from_logits(logits: torch.Tensor, output_ids: Sequence[int]) -> torch.Tensor:
    """NLL (nats, float32) of each output token under the logits row before it ((n, vocab) rows
    predicting output_ids[0..n-1]): the scoring rule, whichever engine computed the logits."""
    targets = torch.tensor(list(output_ids), dtype=torch.long, device=logits.device)
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")


@torch.inference_mode()
def token_nll(model, token_ids: Sequence[int]) -> torch.Tensor:
    """NLL (nats) of tokens[1:] given their prefixes, one forward pass."""
    token_ids = list(token_ids)
    if len(token_ids) < 2:
        raise ValueError(f"need at least 2 tokens to score a continuation, got {len(token_ids)}")
    return continuation_nll(model, token_ids[:1], token_ids[1:]).cpu()


def perplexity(model, sequences: Sequence[Sequence[int]]) -> float:
    """exp(mean NLL per predicted token), tokens of all sequences pooled (long texts weigh more)."""
    if not sequences:
        raise ValueError("no sequences to score")
    nll = torch.cat([token_nll(model, ids) for ids in sequences])
    return math.exp(float(nll.mean()))


def encode_texts(tokenizer, texts: Sequence[str] = TEXTS) -> list[list[int]]:
    """Plain tokenization (no chat template); a BOS is added where the tokenizer adds one."""
    return [list(tokenizer(text)["input_ids"]) for text in texts]


def text_perplexity(model, tokenizer, texts: Sequence[str] = TEXTS) -> float:
    return perplexity(model, encode_texts(tokenizer, texts))


# --- task quality: SQL exact match -----------------------------------------------------------------

SQL_FENCE = re.compile(r"```(?:sql)?\s*(.*?)(?:```|$)", re.S | re.I)


def extract_sql(answer: str) -> str:
    """The query in a model's answer: the first fenced block if there is one (an unclosed fence runs
    to the end), from its first SELECT or WITH, up to the first ';'."""
    fenced = SQL_FENCE.search(answer)
    sql = fenced.group(1) if fenced else answer
    start = re.search(r"\b(select|with)\b", sql, re.I)
    return (sql[start.start():] if start else sql).split(";")[0]


def normalize_sql(sql: str) -> str:
    """Lower case, double quotes as single ones, one space between tokens and around parentheses
    and commas: two spellings of the same query compare equal (string literals lose their case)."""
    sql = re.sub(r"\s*([(),])\s*", r" \1 ", sql.replace('"', "'").lower())
    return " ".join(sql.split())


def sql_exact_match(answer: str, gold: str) -> bool:
    """Spider-style exact match, as a normalized string match (not Spider's parsed-component match:
    a query with its clauses in another order counts as different)."""
    return normalize_sql(extract_sql(answer)) == normalize_sql(gold)


# --- task quality: the final number of a worked math solution ------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> float | None:
    """The final answer of a worked solution: the number after the last '####', else the last number
    in the text (commas as thousands separators); None when there is none."""
    if "####" in text:
        numbers = _NUMBER.findall(text.rsplit("####", 1)[1])[:1]
    else:
        numbers = _NUMBER.findall(text)[-1:]
    if not numbers:
        return None
    return float(numbers[0].replace(",", ""))


def answer_is_correct(text: str, answer: str) -> bool:
    """Exact match of the final number (as reasoning-gym scores it: equal as numbers)."""
    found = final_number(text)
    return found is not None and found == float(answer)


# --- task quality: a prompt set's answer key --------------------------------------------------------

@dataclass(frozen=True)
class AnswerKey:
    """A prompt set's checkable answers: what the match is called in tables and sentences, the gold
    answer of every prompt by id, and the match itself: (answer text, gold) -> right."""

    measure: str
    gold: dict[str, str]
    matches: Callable[[str, str], bool]
    reference: str  # what its answers are, for sentences: "the gold SQL", "the worked solutions"


def answer_key(prompt_set: str) -> AnswerKey | None:
    """The answer key of a prompt set with checkable answers (Spider, GSM-Symbolic); None for others."""
    from specdec_lab import data  # here, not above: data imports the models package, whose decoders import this

    if prompt_set == "spider":
        return AnswerKey("SQL exact match", data.spider_gold(), sql_exact_match, "the gold SQL")
    if prompt_set == "gsm-symbolic":
        return AnswerKey("final-number exact match", data.gsm_symbolic_answers(), answer_is_correct,
                         "the worked solutions")
    return None
