"""The benchmark runner writes every sample at once, resumes, and never mixes configurations."""

import gc
import json
from functools import partial

import pytest

from specdec_lab.data import Prompt
from specdec_lab.decoders import autoregressive
from specdec_lab.method import Method, Weights
from specdec_lab.runs import bench, jsonl
from tiny import tiny_llama


class Tokens:
    """A stand-in tokenizer: prompt text is a space-separated list of ids."""

    chat_template = None
    bos_token_id = 1

    def __call__(self, text):
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


PROMPTS = [Prompt("a", "code", "1 5 6 7"), Prompt("b", "chat", "1 9 8 7 6")]


class Counting:
    def __init__(self, decode, fail_after=None):
        self.decode, self.calls, self.fail_after = decode, 0, fail_after

    def __call__(self, prompt_ids):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated interruption")
        self.calls += 1
        return self.decode(prompt_ids)


def decoders(**counting) -> list[Method]:
    model = tiny_llama()
    counted = Counting(partial(autoregressive.generate, model, max_new_tokens=6, stop_ids=[]), **counting)
    return [Method("ar", counted, lossless=True, role="target AR", source=None, weights=Weights("target", "none"))]


def test_rows_are_written_as_produced_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "runs.jsonl"
    interrupted = decoders(fail_after=3)
    with pytest.raises(KeyboardInterrupt):
        bench.run(interrupted, PROMPTS, Tokens(), out, repeats=2, warmup=0, config={"x": 1})
    assert len(out.read_text().splitlines()) == 3  # nothing finished was lost

    resumed = decoders()
    rows = bench.run(resumed, PROMPTS, Tokens(), out, repeats=2, warmup=0, config={"x": 1})
    assert resumed[0].decode.calls == 1  # only the missing sample ran
    assert len(rows) == 4 and sorted(zip(rows.prompt_id, rows.repeat)) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]

    uninterrupted = bench.run(decoders(), PROMPTS, Tokens(), tmp_path / "once.jsonl", repeats=2, warmup=0, config={"x": 1})
    key = ["prompt_id", "repeat"]
    assert rows.sort_values(key).tokens.tolist() == uninterrupted.sort_values(key).tokens.tolist()


def ar_and(other: str, model, fail_after=None) -> list[Method]:
    """AR and a second method on the same model, the second failing after `fail_after` calls."""
    decode = partial(autoregressive.generate, model, max_new_tokens=6, stop_ids=[])
    return [Method("ar", Counting(decode), lossless=True, role="target AR"),
            Method(other, Counting(decode, fail_after=fail_after), lossless=True, role="speculative")]


def test_a_unit_cut_by_an_interruption_is_run_again_whole(tmp_path):
    """The two rows of a ratio come from one process: a (prompt, repeat) whose baseline finished
    before a crash but whose method did not is run again whole, and its old baseline row is not used."""
    out = tmp_path / "runs.jsonl"
    model = tiny_llama()
    with pytest.raises(KeyboardInterrupt):
        bench.run(ar_and("other", model, fail_after=1), PROMPTS, Tokens(), out, repeats=1, warmup=0)
    assert [json.loads(line)["decoder"] for line in out.read_text().splitlines()] == ["ar", "other", "ar"]
    resumed = ar_and("other", model)
    rows = bench.run(resumed, PROMPTS, Tokens(), out, repeats=1, warmup=0)
    assert [m.decode.calls for m in resumed] == [1, 1]  # prompt a was complete; prompt b ran again whole
    assert len(rows) == 4 and rows.groupby("prompt_id").process.nunique().eq(1).all()
    first_process = json.loads(out.read_text().splitlines()[0])["process"]
    assert set(rows[rows.prompt_id == "b"].process) != {first_process}


def test_a_method_restricted_to_some_prompts_shares_their_units_and_resumes(tmp_path):
    """A k sweep on the first prompts runs in the line-up's units (its ratio uses the same AR row);
    its unit is complete only with the sweep's row, so a crash before it re-runs that unit whole."""
    out = tmp_path / "runs.jsonl"
    model = tiny_llama()
    with pytest.raises(KeyboardInterrupt):
        bench.run(ar_and("sweep", model, fail_after=0), PROMPTS, Tokens(), out, repeats=1, warmup=0,
                  only_on={"sweep": {"a"}})
    assert [json.loads(line)["decoder"] for line in out.read_text().splitlines()] == ["ar"]
    resumed = ar_and("sweep", model)
    rows = bench.run(resumed, PROMPTS, Tokens(), out, repeats=1, warmup=0, only_on={"sweep": {"a"}})
    assert [m.decode.calls for m in resumed] == [2, 1]  # prompt a again whole; the sweep never on prompt b
    assert sorted(zip(rows.prompt_id, rows.decoder)) == [("a", "ar"), ("a", "sweep"), ("b", "ar")]
    assert rows[rows.prompt_id == "a"].process.nunique() == 1
    with pytest.raises(ValueError, match="'nothing'"):
        bench.run(ar_and("sweep", model), PROMPTS, Tokens(), out, repeats=1, warmup=0, only_on={"nothing": {"a"}})


def test_other_parameters_never_mix_with_old_rows(tmp_path):
    out = tmp_path / "runs.jsonl"
    bench.run(decoders(), PROMPTS, Tokens(), out, repeats=1, warmup=0, config={"max_new_tokens": 6})
    fresh = decoders()
    rows = bench.run(fresh, PROMPTS, Tokens(), out, repeats=1, warmup=0, config={"max_new_tokens": 7})
    assert fresh[0].decode.calls == 2 and len(rows) == 2
    assert {r["config"]["max_new_tokens"] for r in map(json.loads, out.read_text().splitlines())} == {6, 7}


def test_a_rerun_over_fewer_prompts_returns_only_those(tmp_path):
    out = tmp_path / "runs.jsonl"
    bench.run(decoders(), PROMPTS, Tokens(), out, repeats=2, warmup=0, config={"x": 1})
    fewer = decoders()
    rows = bench.run(fewer, PROMPTS[:1], Tokens(), out, repeats=1, warmup=0, config={"x": 1})
    assert fewer[0].decode.calls == 0  # resumed from the file
    assert sorted(zip(rows.prompt_id, rows.repeat)) == [("a", 0)]


def test_a_line_cut_off_by_a_crash_is_skipped(tmp_path):
    out = tmp_path / "runs.jsonl"
    bench.run(decoders(), PROMPTS[:1], Tokens(), out, repeats=1, warmup=0)
    with out.open("a") as handle:
        handle.write('{"run_id": "half a li')
    assert len(jsonl.read(out)) == 1


def test_rows_carry_derived_numbers_and_environment(tmp_path):
    rows = bench.run(decoders(), PROMPTS[:1], Tokens(), tmp_path / "r.jsonl", repeats=1, warmup=1)
    row = rows.iloc[0]
    assert row.num_tokens == 6 and row.tokens_per_second > 0 and row.target_forwards == 6
    assert row.env["torch"] and row.text == " ".join(map(str, row.tokens))
    # the method's declared properties travel with every row: tables select by them, never by name
    assert row.decoder == "ar" and row.lossless and row.role == "target AR"
    assert row.model_role == "target" and row.quantization == "none" and row.source_kind is None


def test_method_names_must_be_unique(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        bench.run(decoders() + decoders(), PROMPTS, Tokens(), tmp_path / "r.jsonl")


def test_a_method_with_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="unknown role 'baseline'"):
        Method("ar", print, lossless=True, role="baseline")


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[]), "empty prompt set"),
    (dict(repeats=0), "repeats must be >= 1"),
    (dict(methods=[]), "no methods"),
])
def test_bad_runner_input(tmp_path, kwargs, message):
    arguments = dict(methods=decoders(), prompts=PROMPTS, tokenizer=Tokens(), out=tmp_path / "r.jsonl") | kwargs
    with pytest.raises(ValueError, match=message):
        bench.run(**arguments)


def test_methods_are_timed_with_the_loaded_objects_out_of_the_collectors_passes(tmp_path):
    """Every timed call, of one request or a batch, runs with what existed before the loop frozen out of the cyclic
    collector, and the freeze is lifted afterwards, also after an interruption. Catches a full pass over the loaded
    models left to land inside whichever generation crosses the collector's threshold (in 02 the method timed after
    suffix decoding's tree nodes paid it), and a freeze never lifted (a frozen reference cycle is never freed, and 02
    frees its bf16 models before loading the fp32 ones)."""
    model, frozen = tiny_llama(), []

    def decode(prompt_ids):
        frozen.append(gc.get_freeze_count())
        return autoregressive.generate(model, prompt_ids, max_new_tokens=4, stop_ids=[])

    def decode_batch(batch):
        return [decode(prompt_ids) for prompt_ids in batch]

    bench.run([Method("ar", decode, lossless=True, role="target AR")], PROMPTS, Tokens(), tmp_path / "one.jsonl",
              repeats=1, warmup=0)
    bench.run_batches([Method("ar", decode_batch, lossless=True, role="target AR")], PROMPTS, Tokens(),
                      tmp_path / "batches.jsonl", batch_sizes=[1, 2], warmup=0)
    assert len(frozen) == 2 + 4 and min(frozen) > 0 and gc.get_freeze_count() == 0, frozen
    with pytest.raises(KeyboardInterrupt):
        bench.run([Method("ar", Counting(decode, fail_after=1), lossless=True, role="target AR")], PROMPTS, Tokens(),
                  tmp_path / "cut.jsonl", repeats=1, warmup=0)
    assert gc.get_freeze_count() == 0
