"""CLLM: trajectory collection (resume), losses, a few training steps (tiny random models)."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models as tokenizer_models, pre_tokenizers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specdec_lab import data, models
from specdec_lab.cllm import losses, train, trajectories
from specdec_lab.cllm.trajectories import Sample
from specdec_lab.data import Prompt
from specdec_lab.decoders import autoregressive
from specdec_lab.experiments import cllm as evaluate
from specdec_lab.experiments import cllm_tables, lineups
from specdec_lab.quality import common_prefix_length
from tiny import tiny_llama

WORDS = [f"w{i}" for i in range(60)]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<eos>": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    backend = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    return tiny_llama(seed, vocab_size=len(WORDS) + 2, hidden=32, weight_std=0.3, eos_token_id=1)



@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(model_folder):
    return models.load(str(model_folder), dtype="float32")


def prompts(count: int) -> list[Prompt]:
    return [Prompt(f"p{i}", "test", " ".join(WORDS[(7 * i + j) % 60] for j in range(5 + i % 3)), group=f"g{i % 2}")
            for i in range(count)]


def collect(loaded, out, count=5, **kwargs):
    return trajectories.collect(loaded.model, loaded.tokenizer, prompts(count), out, max_new_tokens=20,
                                block_size=6, chat=False, **kwargs)


def test_records_hold_the_greedy_output_and_each_blocks_trajectory(loaded, tmp_path):
    records = collect(loaded, tmp_path / "t.jsonl", count=2)
    for record in records:
        expected = autoregressive.generate(loaded.model, record["prompt_ids"], 20).tokens
        assert record["output_ids"] == expected
        for block in record["blocks"]:
            start, fixed_point = block["start"], block["fixed_point"]
            assert record["output_ids"][start: start + len(fixed_point)] == fixed_point
    found = trajectories.samples(records)
    # the training states: every recorded state with a position after its first wrong token, no other
    wanted = [(r["prompt_id"], b, i) for r in records for b, block in enumerate(r["blocks"])
              for i, state in enumerate(block["states"])
              if common_prefix_length(state, block["fixed_point"]) <= len(block["fixed_point"]) - 2]
    assert found and [(s.prompt_id, s.block_index, s.iteration) for s in found] == wanted
    for s in found:
        block = next(r for r in records if r["prompt_id"] == s.prompt_id)["blocks"][s.block_index]
        assert s.output_ids[s.start: s.start + len(s.fixed_point)] == s.fixed_point
        assert s.state == block["states"][s.iteration]
        assert s.next_state == (block["states"] + [block["fixed_point"]])[s.iteration + 1]


def test_collection_resumes_after_an_interruption(loaded, tmp_path):
    uninterrupted = collect(loaded, tmp_path / "whole.jsonl")

    class Interrupted(Exception):
        pass

    written = []

    def crash_after_two(record):
        written.append(record["prompt_id"])
        if len(written) == 2:
            raise Interrupted

    path = tmp_path / "resumed.jsonl"
    with pytest.raises(Interrupted):
        collect(loaded, path, on_record=crash_after_two)
    assert len(path.read_text().splitlines()) == 2
    resumed = collect(loaded, path, on_record=lambda record: written.append(record["prompt_id"]))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 5 and len({row["prompt_id"] for row in lines}) == 5  # no duplicates
    assert written[2:] == ["p2", "p3", "p4"]  # only the missing prompts ran again
    timeless = lambda records: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in records]
    assert timeless(resumed) == timeless(uninterrupted)


def test_other_settings_do_not_reuse_old_records(loaded, tmp_path):
    path = tmp_path / "t.jsonl"
    first = collect(loaded, path, count=2)
    again = trajectories.collect(loaded.model, loaded.tokenizer, prompts(2), path, max_new_tokens=12, block_size=6,
                                 chat=False)
    assert {r["run_id"] for r in again}.isdisjoint(r["run_id"] for r in first)
    assert [r["output_ids"] for r in again] == [
        autoregressive.generate(loaded.model, r["prompt_ids"], 12).tokens for r in again]
    assert len(path.read_text().splitlines()) == 4


def test_degenerate_generations_are_flagged_and_removed():
    looping = [5, 6, 7] * 10
    assert trajectories.is_degenerate(looping)
    assert trajectories.is_degenerate([9] * 12)
    assert not trajectories.is_degenerate(list(range(40)))
    records = [{"degenerate": True, "blocks": []}, {"degenerate": False, "blocks": []}]
    kept, removed = trajectories.usable(records)
    assert removed == 1 and kept == records[1:]


def sample_at(state, fixed_point=(11, 12, 13, 14, 15)) -> Sample:
    output = [20, 21, *fixed_point, 30]
    return Sample(prompt_ids=[3, 4, 5, 6], output_ids=output, start=2, state=list(state),
                  fixed_point=list(fixed_point), next_state=list(fixed_point), block_index=0, iteration=0)


def test_state_logits_line_up_with_the_fixed_point_logits(loaded):
    fixed_point = [11, 12, 13, 14, 15]
    (_, state_logits, target), = losses.prompt_logits(loaded.model, [sample_at(fixed_point)])["states"]
    assert torch.allclose(state_logits, target, atol=1e-5)
    # and the target rows are the model's own predictions for the block's tokens
    direct = loaded.model(torch.tensor([[3, 4, 5, 6, 20, 21, *fixed_point]])).logits[0, 5:10]
    assert torch.allclose(target, direct, atol=1e-5)


def test_states_of_several_blocks_share_one_pass_without_changing_their_losses(loaded, tmp_path):
    records = collect(loaded, tmp_path / "t.jsonl", count=5)
    found = trajectories.samples(records)
    prompt_id = max({s.prompt_id for s in found}, key=lambda p: len({s.block_index for s in found if s.prompt_id == p}))
    states = [s for s in found if s.prompt_id == prompt_id]
    assert len({s.block_index for s in states}) >= 2, "the tiny model should give a prompt with two blocks"
    chosen = [states[0], states[-1], states[1]]  # two of one block (one batch), one of another
    assert chosen[0].block_index == chosen[2].block_index != chosen[1].block_index
    weights = losses.LossWeights()
    together = losses.prompt_losses(loaded.model, chosen, weights)["consistency_loss"]
    alone = torch.stack([losses.prompt_losses(loaded.model, [s], weights)["consistency_loss"] for s in chosen])
    assert torch.isclose(together, alone.mean(), atol=1e-5)


def test_consistency_loss_is_zero_at_the_fixed_point_and_positive_before(loaded):
    weights = losses.LossWeights()
    # wrong in its last token only: that position is not masked, but no prediction of the block is
    # conditioned on the last token, so its distribution is the fixed point's (a misaligned row is not)
    last_wrong = losses.prompt_losses(loaded.model, [sample_at([11, 12, 13, 14, 43])], weights)
    assert abs(float(last_wrong["consistency_loss"].detach())) < 1e-6
    before = losses.prompt_losses(loaded.model, [sample_at([11, 40, 41, 42, 43])], weights)
    assert float(before["consistency_loss"].detach()) > 1e-4
    local = losses.prompt_losses(loaded.model, [sample_at([11, 40, 41, 42, 43])], losses.LossWeights(consistency="local"))
    assert float(local["consistency_loss"].detach()) > 1e-4
    assert torch.isclose(before["loss"], 10 * before["ar_loss"] + before["consistency_loss"])


def test_hard_consistency_target_is_cross_entropy_on_the_fixed_point_tokens(loaded):
    hard = losses.LossWeights(consistency_target="hard")
    sample = sample_at([11, 40, 41, 42, 43])
    (_, state_logits, _), = losses.prompt_logits(loaded.model, [sample])["states"]
    expected = torch.nn.functional.cross_entropy(state_logits[1:], torch.tensor(sample.fixed_point[1:]))
    got = losses.prompt_losses(loaded.model, [sample], hard)["consistency_loss"]
    assert torch.isclose(got, expected, atol=1e-5)
    # wrong in its last token only: the cross-entropy of the model's own row for that position,
    # computed here in one plain forward pass over prompt + output up to the block's last token
    last_wrong = losses.prompt_losses(loaded.model, [sample_at([11, 12, 13, 14, 43])], hard)["consistency_loss"]
    with torch.no_grad():
        row = loaded.model(torch.tensor([[3, 4, 5, 6, 20, 21, 11, 12, 13, 14]])).logits[0, -1:]
    assert torch.isclose(last_wrong, torch.nn.functional.cross_entropy(row, torch.tensor([15])), atol=1e-5)


def answers(count: int) -> dict[str, str]:
    return {f"p{i}": " ".join(WORDS[(5 * i + j) % 60] for j in range(3 + i % 2)) for i in range(count)}


def test_reference_answers_train_the_ar_loss_alone(loaded):
    records = trajectories.answer_records(loaded.tokenizer, prompts(2), answers(2), end_id=1, chat=False)
    found = trajectories.samples(records)
    assert [s.state for s in found] == [[], []] and found[0].output_ids[-1] == 1  # the answer ends with <eos>
    weights = losses.LossWeights(ar_weight=1.0, consistency_weight=0.0, label_smoothing=0.0)
    got = losses.prompt_losses(loaded.model, found[:1], weights)
    assert float(got["consistency_loss"].detach()) == 0.0
    # the AR rows are those of a plain forward that predict the answer (a row off by one is not)
    sample = found[0]
    with torch.no_grad():
        logits = loaded.model(torch.tensor([sample.prompt_ids + sample.output_ids])).logits[0]
    rows = logits[len(sample.prompt_ids) - 1: -1]
    expected = torch.nn.functional.cross_entropy(rows, torch.tensor(sample.output_ids))
    assert torch.isclose(got["ar_loss"], expected, atol=1e-5)


def test_a_trajectory_without_blocks_is_not_taken_for_a_reference_answer(loaded):
    # Jacobi returns no block when the first token ends the answer: nothing to train on there
    record = {"prompt_id": "p0", "prompt_ids": [3, 4], "output_ids": [1], "blocks": [], "degenerate": False}
    assert trajectories.samples([record]) == []


def test_other_reference_answers_make_another_fine_tuning_run(loaded):
    first = trajectories.answer_records(loaded.tokenizer, prompts(2), answers(2), end_id=1, chat=False)
    changed = trajectories.answer_records(loaded.tokenizer, prompts(2), {**answers(2), "p1": "w9"}, end_id=1, chat=False)
    assert first[0]["run_id"] != changed[0]["run_id"]
    config = train.TrainConfig()
    assert train.run_folder("runs", "m", first, config, "float32") != train.run_folder("runs", "m", changed, config,
                                                                                        "float32")


def test_a_prompt_without_a_reference_answer_fails_early(loaded):
    with pytest.raises(ValueError, match="no reference answer for 1 prompts, e.g. 'p2'"):
        trajectories.answer_records(loaded.tokenizer, prompts(3), answers(2), end_id=1, chat=False)
    with pytest.raises(ValueError, match="'sharegpt' has no reference answers.*sft_steps: 0"):
        data.reference_answers("sharegpt")


def test_fine_tuning_on_reference_answers_lowers_their_loss(loaded, model_folder, tmp_path):
    records = trajectories.answer_records(loaded.tokenizer, prompts(4), answers(4), end_id=1, chat=False)
    params = {"train_steps": 50, "learning_rate": 1e-4, "sft_steps": 12, "sft_learning_rate": 3e-3,
              "sft_answers_per_step": 2, "grad_accumulation": 1, "states_per_step": 8, "checkpoint_every": 6,
              "learning_curve_prompts": 2}
    config = evaluate.answer_config(params)
    assert (config.steps, config.learning_rate, config.states_per_step, config.grad_accumulation) == (12, 3e-3, 1, 2)
    assert (config.ar_weight, config.consistency_weight, config.label_smoothing) == (1.0, 0.0, 0.0)
    assert not config.snapshots  # a learning curve is the CLLM's, not the fine-tuning's
    found = trajectories.samples(records)
    before = mean_loss(loaded.model, found, config.weights())
    final = train.train(str(model_folder), records, tmp_path / "sft", config, progress=False)
    assert mean_loss(models.load(str(final), dtype="float32").model, found, config.weights()) < before / 2


def test_consistency_mask_covers_the_converged_prefix():
    assert losses.consistency_mask([1, 2, 9, 4], [1, 2, 3, 4]).tolist() == [False, False, True, True]
    assert not losses.consistency_mask([1, 2, 3], [1, 2, 3]).any()


def test_bad_loss_settings_fail_early():
    with pytest.raises(ValueError, match="consistency"):
        losses.LossWeights(consistency="both")
    with pytest.raises(ValueError, match="steps"):
        train.TrainConfig(steps=0)
    with pytest.raises(ValueError, match="consistency_target.*'soft'"):
        train.TrainConfig(consistency_target="argmax")
    with pytest.raises(ValueError, match="mixed_precision.*'bf16'"):
        train.TrainConfig(mixed_precision="bfloat16")


def mean_loss(model, samples, weights) -> float:
    with torch.no_grad():
        return sum(float(losses.prompt_losses(model, [s], weights)["loss"]) for s in samples) / len(samples)


def test_a_few_training_steps_lower_the_loss(loaded, model_folder, tmp_path):
    records = collect(loaded, tmp_path / "t.jsonl", count=4)
    data = trajectories.samples(trajectories.usable(records)[0])
    config = train.TrainConfig(steps=12, learning_rate=3e-3, warmup_steps=2, checkpoint_every=6)
    before = mean_loss(loaded.model, data, config.weights())

    final = train.train(str(model_folder), records, tmp_path / "run", config, progress=False)
    trained = models.load(str(final), dtype="float32")
    assert mean_loss(trained.model, data, config.weights()) < before
    assert [row["step"] for row in train.read_losses(tmp_path / "run")] == list(range(1, 13))
    assert not train.checkpoints(tmp_path / "run")  # the final model replaces the checkpoints
    assert train.train(str(model_folder), records, tmp_path / "run", config) == final  # done: no work


def test_a_finished_training_gives_its_memory_back(loaded, model_folder, tmp_path, monkeypatch):
    # 04 trains twice in one process (fine-tuning, then the CLLM). Freed but not given back (the heap keeps
    # it, in the arenas of the threads that allocated it), the first training's weights, gradients and AdamW
    # state (a 0.5B model's 8 GB) sat beside the second's: 04's cpu-full run was killed for memory.
    records = collect(loaded, tmp_path / "t.jsonl", count=2)
    given_back = []
    monkeypatch.setattr(train.memory, "free_memory", lambda: given_back.append(True))
    train.train(str(model_folder), records, tmp_path / "run", train.TrainConfig(steps=2, checkpoint_every=2),
                progress=False)
    assert given_back  # the trained model and its optimizer were released before


def test_snapshots_keep_the_weights_of_every_checkpoint_for_a_learning_curve(loaded, model_folder, tmp_path):
    records = collect(loaded, tmp_path / "t.jsonl", count=3)
    config = train.TrainConfig(steps=6, learning_rate=3e-3, warmup_steps=2, checkpoint_every=2, snapshots=True)
    final = train.train(str(model_folder), records, tmp_path / "run", config, progress=False)
    kept = train.snapshots(tmp_path / "run")
    assert [p.name for p in kept] == ["snapshot-000002", "snapshot-000004"]
    assert [train.snapshot_step(p) for p in [*kept, final]] == [2, 4, 6]
    assert torch.load(kept[0] / train.STATE_FILE, weights_only=False)["optimizer"] is None  # weights alone
    weights = [models.load(str(p), dtype="float32").model.state_dict() for p in [*kept, final]]
    name = next(iter(weights[0]))
    assert not torch.equal(weights[0][name], weights[1][name]) and not torch.equal(weights[1][name], weights[2][name])
    assert not train.checkpoints(tmp_path / "run")  # the resumable checkpoints are pruned as before


def test_training_resumes_from_the_last_checkpoint(loaded, model_folder, tmp_path, monkeypatch):
    records = collect(loaded, tmp_path / "t.jsonl", count=3)
    config = train.TrainConfig(steps=8, learning_rate=3e-3, warmup_steps=2, checkpoint_every=3)
    whole = models.load(str(train.train(str(model_folder), records, tmp_path / "whole", config, progress=False)),
                        dtype="float32")

    real_losses, calls = train.prompt_losses, []

    def crash_in_step_five(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_losses(*args)

    monkeypatch.setattr(train, "prompt_losses", crash_in_step_five)
    with pytest.raises(KeyboardInterrupt):
        train.train(str(model_folder), records, tmp_path / "cut", config, progress=False)
    assert [p.name for p in train.checkpoints(tmp_path / "cut")] == ["checkpoint-000003"]
    monkeypatch.setattr(train, "prompt_losses", real_losses)
    resumed = models.load(str(train.train(str(model_folder), records, tmp_path / "cut", config, progress=False)),
                          dtype="float32")
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert [row["step"] for row in train.read_losses(tmp_path / "cut")] == list(range(1, 9))


def test_prompts_are_taken_round_robin_over_databases():
    chosen = data.round_robin(prompts(6), key=lambda prompt: prompt.group)[:3]
    assert [p.group for p in chosen] == ["g0", "g1", "g0"]
    assert [p.id for p in chosen] == ["p0", "p1", "p2"]


def test_block_table_has_one_row_per_block(loaded):
    from specdec_lab.decoders import jacobi
    result = jacobi.generate(loaded.model, [3, 4, 5], 20, block_size=6, stop_ids=[])
    rows = pd.DataFrame([{"decoder": "Jacobi", "prompt_id": "p", "repeat": 0, "jacobi": result.to_dict()["jacobi"]}])
    blocks = cllm_tables.block_table(rows)
    assert len(blocks) == len(result.jacobi.blocks)
    assert blocks.iterations.sum() == len(result.accepted_per_step)
    summary = cllm_tables.block_summary(blocks)
    assert summary.loc["Jacobi", "blocks"] == len(blocks)


def test_seen_and_held_out_labels_the_jacobi_rows_of_each_side():
    def rows(tokens_per_forward: dict) -> pd.DataFrame:
        return pd.DataFrame([{"decoder": name, "role": "target AR" if name == lineups.BASE_AR else "parallel",
                              "prompt_id": "p", "tokens_per_target_forward": value}
                             for name, value in tokens_per_forward.items()])
    seen = rows({lineups.BASE_JACOBI: 1.1, lineups.CLLM_JACOBI: 1.8})
    held_out = rows({lineups.BASE_AR: 1.0, lineups.BASE_JACOBI: 1.05, lineups.CLLM_JACOBI: 1.2})
    both = cllm_tables.seen_and_held_out(seen, held_out)
    assert lineups.BASE_AR not in set(both.decoder)
    table = both.pivot_table(index="decoder", columns="prompts", values="tokens_per_target_forward")
    assert table.loc[lineups.CLLM_JACOBI, "trained on"] == 1.8
    assert table.loc[lineups.CLLM_JACOBI, "held out"] == 1.2


def test_cllm_line_up_declares_what_each_method_is(loaded):
    methods = lineups.cllm(loaded, loaded, max_new_tokens=4, block_size=2)
    assert [(m.name, m.role, m.lossless) for m in methods] == [
        (lineups.BASE_AR, "target AR", True), (lineups.BASE_JACOBI, "parallel", True),
        (lineups.CLLM_JACOBI, "parallel", False)]  # a fine-tuned model's text is its own
    assert [m.name for m in lineups.cllm(loaded, loaded, 4, 2, with_ar=False)] == [lineups.BASE_JACOBI, lineups.CLLM_JACOBI]
    configs = [{"window": 3, "ngram_size": 3}, {"window": 5, "ngram_size": 3, "candidates": 2}]
    with_lookahead = lineups.cllm(loaded, loaded, 4, 2, lookahead_configs=configs)
    assert [(m.name, m.lossless) for m in with_lookahead[3:]] == [
        ("Lookahead W=3 N=3 G=3 (base)", True), ("Lookahead W=5 N=3 G=2 (base)", True),
        ("Lookahead W=3 N=3 G=3 (CLLM)", False)]  # the CLLM with the first config only: its text is its own
    assert [m.name for m in lineups.cllm(loaded, None, 4, 2, lookahead_configs=configs)][-1] == "Lookahead W=5 N=3 G=2 (base)"


def test_cllm_methods_decode_the_cllm_and_base_methods_the_base(loaded):
    """A stand-in CLLM with other weights: Jacobi and lookahead on it return its greedy text (fp32,
    exact), the base methods the base's."""
    other = tiny_model(seed=1)
    cllm_model = dataclasses.replace(loaded, model=other)
    prompt = data.encode(loaded.tokenizer, prompts(1)[0], chat=False)
    texts = {m.name: m(prompt).tokens for m in lineups.cllm(loaded, cllm_model, 12, 4,
                                                             lookahead_configs=[{"window": 3, "ngram_size": 3}])}
    base = autoregressive.generate(loaded.model, prompt, 12).tokens
    own = autoregressive.generate(other, prompt, 12).tokens
    assert base != own  # the test needs two models that answer differently
    assert texts[lineups.BASE_AR] == texts[lineups.BASE_JACOBI] == texts["Lookahead W=3 N=3 G=3 (base)"] == base
    assert texts[lineups.CLLM_JACOBI] == texts["Lookahead W=3 N=3 G=3 (CLLM)"] == own


def test_two_cpu_processes_train_like_one_with_the_same_global_batch(loaded, model_folder, tmp_path):
    """DistributedDataParallel over two CPU processes (gloo, under torchrun): each process takes one
    prompt of a global batch of two, as one process does with two micro-batches. The loss curves and
    the weights agree, and the checkpoint loads and decodes. (The model under DDP is a wrapper:
    reading `model.config` from it crashed the first forward.)"""
    import os
    import subprocess
    import sys

    path = tmp_path / "t.jsonl"
    collect(loaded, path, count=4)
    common = ["--steps", "4", "--learning-rate", "0.003", "--warmup-steps", "1", "--checkpoint-every", "4"]
    one = train.train(str(model_folder), path, tmp_path / "one",
                      train.TrainConfig(steps=4, learning_rate=3e-3, warmup_steps=1, checkpoint_every=4,
                                        grad_accumulation=2), progress=False)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "specdec_lab.cllm.train", "--model", str(model_folder), "--trajectories", str(path),
               "--out", str(tmp_path / "two"), "--grad-accumulation", "1", *common]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    losses_one, losses_two = train.read_losses(tmp_path / "one"), train.read_losses(tmp_path / "two")
    assert [row["step"] for row in losses_two] == [1, 2, 3, 4]
    for a, b in zip(losses_one, losses_two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (a, b)
    two = models.load(str(tmp_path / "two" / train.FINAL), dtype="float32")
    for (name, a), b in zip(models.load(str(one), dtype="float32").model.state_dict().items(),
                            two.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name
    assert len(autoregressive.generate(two.model, [2, 3, 4], 5, stop_ids=[]).tokens) == 5
