"""The fastest dense path: measured on a tiny model folder, kept per machine, chosen by the time of
a whole generation (prefill + steps), never by the step alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdec_lab import models
from specdec_lab.models import dense_path
from specdec_lab.models.dense_path import PathTiming


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    return tmp_path


def test_every_path_is_measured_once_and_kept(folders, cache, monkeypatch):
    timings = dense_path.measured_paths(folders["target"], prompt_tokens=16, new_tokens=8)
    assert [(t.dtype, t.quantization) for t in timings] == list(dense_path.PATHS)
    assert all(t.prefill_s > 0 and t.step_s > 0 and t.multi_token_s > 0 for t in timings)
    assert (cache / "dense-paths.json").is_file()
    monkeypatch.setattr(dense_path, "time_path", lambda *a, **k: pytest.fail("measured again"))
    again = dense_path.measured_paths(folders["target"], prompt_tokens=16, new_tokens=100)
    assert [t.step_s for t in again] == [t.step_s for t in timings] and again[0].new_tokens == 100


def test_the_choice_weighs_the_prefill_with_the_steps(monkeypatch):
    """bf16 without AVX-512 BF16: the fastest step can still lose on a generation, its prefill being slow."""
    paths = [PathTiming("bfloat16", "none", prefill_s=20.0, step_s=0.10, multi_token_s=0.11, prompt_tokens=128,
                        new_tokens=32),
             PathTiming("float32", "none", prefill_s=1.5, step_s=0.20, multi_token_s=0.5, prompt_tokens=128,
                        new_tokens=32),
             PathTiming("bfloat16", "int4-wo", prefill_s=1.7, step_s=0.09, multi_token_s=0.2, prompt_tokens=128,
                        new_tokens=32)]
    monkeypatch.setattr(dense_path, "measured_paths", lambda *a, **k: paths)
    assert dense_path.resolve("m", "auto") == ("bfloat16", "int4-wo")
    paths[2] = replace(paths[2], prefill_s=9.0)
    assert dense_path.resolve("m", "auto") == ("float32", "none")  # 1.5 + 6.4 s beats 9.0 + 2.9 s
    assert dense_path.resolve("m", "bfloat16", "nf4") == ("bfloat16", "nf4")  # a given dtype is kept


def test_a_verifying_model_takes_the_path_fastest_at_multi_token_forwards(monkeypatch):
    """The Intel Xeon with AMX: int4 weight-only makes the fastest one-token step, but bf16's
    8-token forward costs about its one-token step while int4's costs twice its own."""
    paths = [PathTiming("bfloat16", "none", prefill_s=0.3, step_s=0.150, multi_token_s=0.165, prompt_tokens=64,
                        new_tokens=32),
             PathTiming("bfloat16", "int4-wo", prefill_s=1.2, step_s=0.105, multi_token_s=0.215, prompt_tokens=64,
                        new_tokens=32)]
    monkeypatch.setattr(dense_path, "measured_paths", lambda *a, **k: paths)
    assert dense_path.resolve("m", "auto") == ("bfloat16", "int4-wo")  # 1.2 + 32 x 0.105 = 4.56 s < 5.1 s
    assert dense_path.resolve("m", "auto", multi_token=True) == ("bfloat16", "none")  # 5.6 s < 8.1 s
    assert dense_path.resolve("m", "float32", multi_token=True) == ("float32", "none")  # a given dtype is kept


def test_auto_with_a_quantization_is_refused():
    with pytest.raises(ValueError, match="'auto' chooses the quantization too.*'nf4'"):
        dense_path.resolve("m", "auto", "nf4")
    with pytest.raises(ValueError, match="'auto' measures torch's CPU paths.*'cuda'"):
        models.load("m", dtype="auto", device="cuda")
