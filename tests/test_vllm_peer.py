"""vLLM's CPU build as a peer (`make vllm`): its greedy text against the kit's AR on the same weights
(widened to fp32 in both, where greedy text depends on the weights alone), its suffix speculation against that
text (its n-gram speculation: test_vllm_engine), and its errors surfaced by name. Skipped, and named in the skip
summary, where `make vllm` was not run."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from specdec_lab import data, models
from specdec_lab.decoders import autoregressive, vllm_peer
from specdec_lab.models import zoo

needs_vllm = pytest.mark.skipif(not vllm_peer.available(),
                                reason=f"vLLM is not installed ({vllm_peer.python()} is missing): run `make vllm`")
MODEL = "smollm2-135m-instruct"
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24}


@pytest.fixture(scope="module")
def kit_ar():
    """The kit's greedy AR text of three HumanEval prompts, on the folder's weights widened to fp32, as vLLM
    runs them here. In bf16 the texts are the engines' arithmetic as much as the weights': they matched on the
    Intel Xeon with AMX and differed at token 22 of one prompt on an AVX2-only EPYC (a near-tie rounded apart)."""
    loaded = models.load(MODEL, dtype="float32")
    prompts = [data.encode(loaded.tokenizer, prompt) for prompt in data.load_prompts("humaneval", 3, seed=0)]
    return [(ids, autoregressive.generate(loaded.model, ids, 24).tokens) for ids in prompts]


@needs_vllm
def test_vllm_greedy_text_equals_the_kits_ar_and_a_terminated_worker_takes_the_engine_with_it(kit_ar):
    """The same text one prompt at a time and as one batch (notebook 05). Then the worker is terminated: vLLM runs
    its engine in a process of its own, and one left behind by a killed worker kept polling at 70% of a core,
    slowing every later measurement; a worker terminated (SIGTERM) exits the normal way, which shuts it down. (One
    engine for both checks: each start costs about a minute on 2 cores.)"""
    peer = vllm_peer.VllmPeer(zoo.ensure(MODEL), dtype="float32")
    try:
        for ids, ours in kit_ar:
            result = vllm_peer.generate(peer, ids, 24)
            assert result.tokens == ours, f"first difference at token {first_difference(result.tokens, ours)}"
            assert result.wall_time_s > 0 and result.extras["engine"] == "vllm"
        batch = vllm_peer.generate_batch(peer, [ids for ids, _ in kit_ar], 24)  # notebook 05: one call, one batch
        assert [result.tokens for result in batch] == [ours for _, ours in kit_ar]
        assert len({result.extras["batch_wall_time_s"] for result in batch}) == 1

        engine = descendants(peer.process.pid)
        assert engine, "vLLM started no engine process"
        peer.process.terminate()
        peer.process.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in engine) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(alive(pid) for pid in engine), "vLLM's engine process outlived its worker"
    finally:
        peer.close()


@needs_vllm
@pytest.mark.parametrize("config", [SUFFIX], ids=lambda config: config["method"])
def test_vllm_speculation_keeps_its_text_and_reports_its_counters(kit_ar, config):
    """Suffix decoding on arctic-inference's suffix tree (`make vllm` adds the part `make arctic` built): the same
    text as the kit's AR, and this call's counters, not the run's so far. (n-gram speculation keeps its text in
    test_vllm_engine's two end-to-end runs, one engine start each; its counters go through the same code.)"""
    k = config["num_speculative_tokens"]
    with vllm_peer.VllmPeer(zoo.ensure(MODEL), speculative_config=config, dtype="float32") as peer:
        drafts = 0
        for ids, ours in kit_ar:
            result = vllm_peer.generate(peer, ids, 24)
            assert result.tokens == ours
            extras = result.extras
            assert 0 <= extras["vllm_accepted"] <= extras["vllm_draft_tokens"] <= k * extras["vllm_drafts"]
            # each draft is verified in a step that yields a token
            assert extras["vllm_drafts"] <= len(result.tokens)
            assert sum(extras["vllm_accepted_per_position"]) == extras["vllm_accepted"]
            drafts += extras["vllm_drafts"]
        assert drafts > 0  # it proposed: HumanEval answers repeat their prompts' code


@needs_vllm
def test_an_unknown_method_is_vllms_own_error_named_with_its_config():
    with pytest.raises(vllm_peer.VllmError, match="could not load.*no-such-method"):
        vllm_peer.VllmPeer(zoo.ensure(MODEL), speculative_config={"method": "no-such-method",
                                                                  "num_speculative_tokens": 2})


@needs_vllm
def test_the_export_parses_with_vllms_own_speculative_config():
    """Every config the export writes has only fields of vLLM's SpeculativeConfig, and an n-gram or a suffix
    one builds it (a draft model's needs the target's model config, which only a running engine has)."""
    from test_vllm_export import exported

    configs = [entry["speculative_config"] for entry in exported() if entry["speculative_config"]]
    check = ("import dataclasses, json, sys\n"
             "from vllm.config import SpeculativeConfig\n"
             "names = {field.name for field in dataclasses.fields(SpeculativeConfig)}\n"
             "for config in json.load(sys.stdin):\n"
             "    assert set(config) <= names, config\n"
             "    if config['method'] in ('ngram', 'suffix'):  # suffix: arctic's tree is in vLLM's environment\n"
             "        SpeculativeConfig(**config)\n"
             "print('ok')\n")
    done = subprocess.run([str(vllm_peer.python()), "-c", check], input=json.dumps(configs), capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for status in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = status.read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended while we looked
                continue
            child = int(status.parent.name)
            if int(fields[1]) == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_without_its_environment_the_peer_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(RuntimeError, match="make vllm"):
        vllm_peer.VllmPeer("any-folder")


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
