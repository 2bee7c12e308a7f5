"""The vLLM export: the picker's recommendation per kind as vLLM's speculative_config and `vllm serve`
command, against a checked-in expectation (vLLM's own config class checks it in test_vllm_peer.py, where
`make vllm` was run)."""

import json
from pathlib import Path

import pytest

from specdec_lab.experiments import lineups, vllm_export
from specdec_lab.method import HybridSettings, SuffixSettings, TreeSettings, source_columns

EXPECTED = Path(__file__).parent / "data" / "vllm_export_expected.json"


def line(category, source, predicted, record):
    return {"category": category, "source": source, "predicted_speedup": predicted, "implementation": "ours",
            **source_columns(record)}


LOOKUP = lineups.prompt_lookup_source(10)
DRAFT = lineups.draft_source(5, "heuristic", 0.4)
HYBRID = lineups.hybrid_source(5, 10, HybridSettings())
TREE = lineups.sized_tree_source([(-1, 0), (-1, 1), (0, 0)])
SUFFIX = lineups.suffix_source(16, True, SuffixSettings(spec_factor=4.0))
TABLE = [
    line("code", "prompt lookup k=10", 1.67, LOOKUP), line("code", "draft adaptive k from 5", 1.10, DRAFT),
    line("code", "hybrid", 1.50, HYBRID),
    line("chat", "prompt lookup k=10", 0.91, LOOKUP), line("chat", "draft adaptive k from 5", 0.80, DRAFT),
    line("math", "hybrid", 1.30, HYBRID), line("math", "draft adaptive k from 5", 1.21, DRAFT),
    line("math", "prompt lookup k=10", 1.02, LOOKUP),
    line("short QA", "draft tree (3 nodes)", 1.12, TREE), line("short QA", "prompt lookup k=10", 0.95, LOOKUP),
    line("summarization", "suffix tree (16 nodes)", 1.45, SUFFIX),
]
PICKER = {"table": TABLE, "recommended": [TABLE[0], TABLE[3], TABLE[5], TABLE[8], TABLE[10]]}


def exported():
    return vllm_export.export(PICKER, "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct",
                              tensor_parallel_size=2)


def test_the_export_matches_the_checked_in_expectation():
    """Regenerate with: python -c "import json, test_vllm_export as t; print(json.dumps(t.exported(), indent=1))" """
    assert exported() == json.loads(EXPECTED.read_text())


def test_each_kind_maps_to_its_vllm_method_and_says_what_it_approximates():
    by_kind = {entry["kind"]: entry for entry in exported()}
    assert by_kind["code"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 10,
                                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert by_kind["chat"]["speculative_config"] is None and "without speculation" in by_kind["chat"]["approximation"]
    # the hybrid becomes its best single source for that kind: the draft model on math
    assert by_kind["math"]["exported"] == "draft adaptive k from 5" and by_kind["math"]["predicted_speedup"] == 1.21
    assert "the hybrid (predicted 1.30x) has no vLLM equivalent" in by_kind["math"]["approximation"]
    assert by_kind["math"]["speculative_config"]["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert by_kind["short QA"]["speculative_config"]["num_speculative_tokens"] == 2  # the tree's depth
    assert "chain" in by_kind["short QA"]["approximation"]
    assert by_kind["summarization"]["speculative_config"] == {
        "method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_spec_factor": 4.0, "suffix_decoding_min_token_prob": 0.1}
    assert "most frequent path" in by_kind["summarization"]["approximation"]
    command = by_kind["code"]["command"]
    assert command.startswith("vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct --speculative-config ")
    assert command.endswith("--tensor-parallel-size 2")


def test_a_draft_recommendation_without_a_draft_is_refused():
    with pytest.raises(ValueError, match="name no draft"):
        vllm_export.export({"table": TABLE, "recommended": [TABLE[6]]}, "qwen2.5-coder-1.5b-instruct", None)
