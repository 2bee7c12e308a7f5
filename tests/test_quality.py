"""Quality measures: greedy agreement (one prefix rule), continuation NLL and perplexity."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_lab import quality
from specdec_lab.decoders import autoregressive

pytest.importorskip("bitsandbytes")

PROMPT = [1, 5, 9, 14, 3, 22, 7]
VOCAB = 64


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




def test_sql_is_read_from_the_answer_and_compared_normalized():
    from specdec_lab.quality import extract_sql, sql_exact_match

    gold = "SELECT name ,  country ,  age FROM singer ORDER BY age DESC"
    assert extract_sql("```sql\nSELECT name FROM singer;\n```\nThis lists the names.") == "SELECT name FROM singer"
    assert extract_sql("Here it is: select count(*) from t") == "select count(*) from t"
    assert extract_sql("```sql\nSELECT a FROM") == "SELECT a FROM"  # an unclosed fence: cut off by max_new_tokens
    assert sql_exact_match("```sql\nselect name, country, age\nfrom singer order by age desc;\n```", gold)
    assert not sql_exact_match("```sql\nSELECT name, country FROM singer ORDER BY age DESC\n```", gold)
    assert sql_exact_match('SELECT count(*) FROM t WHERE x = "a"', "SELECT count ( * ) FROM t WHERE x = 'a'")


# --- the final number of a worked math solution -------------------------------------------------

@pytest.mark.parametrize("text, number", [
    ("3 apples + 4 apples = 7 apples\n#### 7", 7.0),
    ("#### 1,234", 1234.0),
    ("She pays $12.50 in all.\n#### 12.5 dollars", 12.5),
    ("#### -3", -3.0),
    ("First 2 + 2 = 4 #### 9 and then 10", 9.0),  # the number right after the last ####
    ("So the answer is 15.", 15.0),  # no ####: the last number
    ("30 minutes, then 144 minutes, 174 in all", 174.0),
    ("no number at all", None),
    ("#### none", None),
])
def test_final_number_of_a_worked_solution(text, number):
    assert quality.final_number(text) == number


def test_answer_is_correct_compares_numbers_not_strings():
    assert quality.answer_is_correct("... #### 3.50", "3.5") and quality.answer_is_correct("#### 1,000", "1000")
    assert not quality.answer_is_correct("#### 35", "3.5") and not quality.answer_is_correct("no answer", "3")
