"""The llama.cpp peer (decoders.llama_cpp_peer) on a real GGUF file: the zoo's SmolLM2-135M (Q4_1,
98 MB, the file the smoke profile uses too). Runs where llama-cpp-python is installed (`make
llama-cpp`; CI installs it)."""

from __future__ import annotations

import pytest

from specdec_lab import models
from specdec_lab.decoders import autoregressive, llama_cpp_peer
from specdec_lab.experiments import lineups
from specdec_lab.models import zoo
from specdec_lab.quality import common_prefix_length

pytestmark = pytest.mark.skipif(not llama_cpp_peer.available(),
                                reason="llama-cpp-python is not installed: `make llama-cpp` (CI installs it)")
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def engine():
    return llama_cpp_peer.load(zoo.assemble_gguf(MODEL), threads=1)


@pytest.fixture(scope="module")
def ours():
    return models.load(MODEL, dtype="float32")


def prompt(ours) -> list[int]:
    return ours.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")["input_ids"]


def test_greedy_tokens_follow_the_kits_greedy_output_of_the_same_file(engine, ours):
    """Same file, same vocabulary: llama.cpp's Q4_1 kernels and our fp32 dequantized weights are
    different arithmetic, so the texts may part late, but not at the start of a confident prompt."""
    ids = prompt(ours)
    expected = autoregressive.generate(ours.model, ids, 16, stop_ids=[]).tokens
    result = llama_cpp_peer.generate(engine, ids, 16, stop_ids=[])
    assert result.num_tokens == 16 and result.prompt_length == len(ids)
    assert common_prefix_length(result.tokens, expected) >= 4, (result.tokens, expected)
    assert result.target_forwards == 16 and result.wall_time_s >= result.time_to_first_token_s > 0


def test_every_call_prefills_its_whole_prompt(engine, ours, monkeypatch):
    """The binding reuses the cached prefix of the previous call unless reset: the same prompt twice
    (warm-up, then the timed repeat) would skip the prefill our decoders pay, a timing advantage."""
    ids = prompt(ours)
    first = llama_cpp_peer.generate(engine, ids, 8, stop_ids=[]).tokens
    evaluated = []
    original = engine.llm.eval
    monkeypatch.setattr(engine.llm, "eval", lambda tokens: (evaluated.extend(tokens), original(tokens)))
    assert llama_cpp_peer.generate(engine, ids, 8, stop_ids=[]).tokens == first
    assert evaluated[: len(ids)] == ids  # the whole prompt went through the model again


def test_stops_on_a_stop_token(engine, ours):
    ids = prompt(ours)
    tokens = llama_cpp_peer.generate(engine, ids, 8, stop_ids=[]).tokens
    stop = tokens[2]
    stopped = llama_cpp_peer.generate(engine, ids, 8, stop_ids=[stop])
    assert stopped.tokens == tokens[: tokens.index(stop) + 1]


def test_method_record_says_what_it_is(engine, ours):
    method = lineups.llama_cpp_ar(engine, ours, 4)
    assert (method.implementation, method.lossless, method.role) == ("llama.cpp", False, "target AR")
    assert method(prompt(ours)).num_tokens <= 4


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"needs a \.gguf file.*zoo.assemble_gguf"):
        llama_cpp_peer.load(tmp_path / "model.safetensors")
