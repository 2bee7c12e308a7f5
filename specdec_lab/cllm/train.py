"""Train a CLLM: fine-tune a model on its own Jacobi trajectories (HF accelerate).

In-process (a notebook, one CPU or GPU) call `train(...)`; to scale out, the same loop runs under
`accelerate launch -m specdec_lab.cllm.train --model ... --trajectories ... --out ...`.
Every `checkpoint_every` steps `out/checkpoint-NNNNNN/` gets a normal `save_pretrained` folder with
the tokenizer plus `training_state.pt` (optimizer, step); a rerun resumes from the newest one. With
`snapshots`, every checkpoint also leaves the weights alone in `out/snapshot-NNNNNN/` (no optimizer
state: a third of a checkpoint), for a learning curve measured after training.
`out/final/` is the trained model: `specdec_lab.models.load("out/final")` loads it like any model.
The loss curve goes to `out/losses.jsonl`, one line per optimizer step (with its wall time; with
several processes, the losses are the main process's share of the step).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from tqdm.auto import tqdm

from specdec_lab import memory, models
from specdec_lab.cllm.constants import MIXED_PRECISION
from specdec_lab.cllm.losses import LossWeights, prompt_losses
from specdec_lab.cllm.trajectories import Sample, samples, usable
from specdec_lab.runs import jsonl

STATE_FILE = "training_state.pt"
LOSS_LOG = "losses.jsonl"
FINAL = "final"


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300  # optimizer steps
    learning_rate: float = 2e-5
    warmup_steps: int = 10  # linear warm-up, then cosine decay to 10% of learning_rate
    weight_decay: float = 0.0
    grad_accumulation: int = 1  # prompts per optimizer step (per process)
    states_per_step: int = 8  # trajectory states of the prompt trained on together (they share its forward pass)
    max_grad_norm: float = 1.0
    checkpoint_every: int = 50
    keep_checkpoints: int = 1  # newest checkpoints kept on disk (the final model counts as one)
    snapshots: bool = False  # keep the weights of every checkpoint (snapshot-NNNNNN/) for a learning curve
    ar_weight: float = 10.0
    consistency_weight: float = 1.0
    consistency: str = "global"
    # 0: with a 152k vocabulary, a smoothing of 0.1 made the AR loss 2.56 where the base's own greedy text costs
    # 0.21 nats a token: its push of every logit towards uniform, not the text, was what the AR loss weighed
    label_smoothing: float = 0.0
    consistency_target: str = "soft"  # "soft": the fixed point's distribution (the paper); "hard": its tokens
    mixed_precision: str = "no"  # accelerate's: "no", "bf16" (autocast; CPUs with bf16 units too), "fp16"
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "grad_accumulation", "states_per_step", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        self.weights()  # checks the loss settings

    def weights(self) -> LossWeights:
        return LossWeights(self.ar_weight, self.consistency_weight, self.consistency, self.label_smoothing,
                           self.consistency_target)

    def recipe(self) -> str:
        """The settings 04 chooses among from learning curves, as its tables name a training run."""
        return f"lr {self.learning_rate:g}, AR weight {self.ar_weight:g}"


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(config.steps - config.warmup_steps, 1)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def by_prompt(found: Sequence[Sample]) -> list[list[Sample]]:
    """Training states grouped by prompt, in first-seen order."""
    groups: dict[str, list[Sample]] = {}
    for sample in found:
        groups.setdefault(sample.prompt_id, []).append(sample)
    return list(groups.values())


def batch_at(groups: Sequence[Sequence[Sample]], position: int, config: TrainConfig) -> list[Sample]:
    """The prompt and states trained on at global `position`: prompts in a fresh seeded permutation
    every epoch, states drawn by a generator seeded by the position, so a resumed run and an
    uninterrupted one see the same data in the same order."""
    epoch, offset = divmod(position, len(groups))
    order = list(range(len(groups)))
    random.Random(config.seed * 100_003 + epoch).shuffle(order)
    states = groups[order[offset]]
    return random.Random(f"{config.seed}-{position}").sample(list(states), min(config.states_per_step, len(states)))


def checkpoints(out: Path) -> list[Path]:
    """Checkpoint folders that were completely written, oldest first."""
    return _complete(Path(out).glob("checkpoint-*"))


def _complete(folders) -> list[Path]:
    """The folders `save` finished (a '.partial' one holds its state file before the rename), oldest first."""
    return sorted(p for p in folders if not p.name.endswith(".partial") and (p / STATE_FILE).exists())


def outcome(config: TrainConfig) -> dict:
    """The settings that decide the trained weights: `snapshots` only keeps copies along the way, so
    turning it on or off neither retrains nor moves the run to another folder."""
    return {key: value for key, value in asdict(config).items() if key != "snapshots"}


def save(folder: Path, model, tokenizer, optimizer, step: int, config: TrainConfig) -> None:
    """A loadable model folder plus the optimizer state (None for the final model: it is not resumed
    from, and AdamW's state is twice the model); written to a temp name, then renamed, so a crash
    never leaves a half-written checkpoint that a resume would pick up."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    optimizer_state = optimizer.state_dict() if optimizer is not None else None
    torch.save({"optimizer": optimizer_state, "step": step, "config": asdict(config)}, partial / STATE_FILE)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def snapshots(out: Path) -> list[Path]:
    """Weights-only snapshots that were completely written, oldest first (`TrainConfig.snapshots`)."""
    return _complete(Path(out).glob("snapshot-*"))


def snapshot_step(folder: Path) -> int:
    """The optimizer step a snapshot (or the final model) was saved at."""
    return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=False)["step"]


def _prune(out: Path, keep: int) -> None:
    for old in checkpoints(out)[: len(checkpoints(out)) - keep]:
        shutil.rmtree(old, ignore_errors=True)


def _trim_log(path: Path, step: int) -> None:
    """Drop log lines after the checkpoint a run resumes from (they will be produced again)."""
    jsonl.rewrite(path, [row for row in jsonl.read(path) if row["step"] <= step])


def last_run(path: Path) -> list[dict]:
    """The records of the newest collection run in a trajectory file (a file may hold several)."""
    rows = jsonl.read(path)
    if not rows:
        raise ValueError(f"no trajectory records in {path}: run cllm.trajectories.collect first")
    return [row for row in rows if row.get("run_id") == rows[-1].get("run_id")]


def run_folder(parent: str | Path, model: str, records: Sequence[dict], config: TrainConfig, dtype: str) -> Path:
    """`parent/cllm-<hash>`: one folder per (base model, training data, settings), so a notebook run
    with other parameters trains anew instead of resuming a run it does not match."""
    identity = {"model": model, "dtype": dtype, "config": outcome(config),
                "data": sorted((r["run_id"], r["prompt_id"]) for r in records)}
    return Path(parent) / f"cllm-{jsonl.config_hash(identity)}"


def train(
    model: str,
    trajectories: Sequence[dict] | str | Path,
    out: str | Path,
    config: TrainConfig = TrainConfig(),
    dtype: str = "float32",
    cpu: bool = True,
    progress: bool = True,
    desc: str = "CLLM training",
) -> Path:
    """Fine-tune `model` (any `models.load` spec) on Jacobi trajectory records (or reference answers:
    `trajectories.answer_records`); return `out/final`.

    Resumes from the newest checkpoint in `out`; returns at once when `out/final` already holds a
    run of this configuration. Degenerate (looping) generations are left out.
    """
    out = Path(out)
    final = out / FINAL
    if (final / STATE_FILE).exists():
        done = torch.load(final / STATE_FILE, map_location="cpu", weights_only=False)
        if {key: value for key, value in done["config"].items() if key != "snapshots"} == outcome(config):
            return final
        raise ValueError(f"{final} holds a run with other settings ({done['config']}); "
                         f"use another output folder or delete {out}")
    records = last_run(Path(trajectories)) if isinstance(trajectories, (str, Path)) else list(trajectories)
    data = by_prompt(samples(usable(records)[0]))
    if not data:
        raise ValueError("no training states: every trajectory is degenerate or already converged; collect more prompts")

    # Processes run different numbers of forward passes per step (their prompts have different block
    # counts), so DDP must not broadcast buffers in every forward: that collective would wait forever
    # for a process that has already finished its passes. The buffers here (rotary frequencies) never change.
    accelerator = Accelerator(cpu=cpu, mixed_precision=config.mixed_precision,
                              kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
    torch.manual_seed(config.seed)
    resume = checkpoints(out)[-1] if checkpoints(out) else None
    # loaded on the CPU; accelerator.prepare moves it to this process's device
    loaded = models.load(str(resume) if resume else model, dtype=dtype, device="cpu")
    network = loaded.model
    network.train()
    optimizer = torch.optim.AdamW(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    step = 0
    if resume:
        state = torch.load(resume / STATE_FILE, map_location="cpu", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    network, optimizer = accelerator.prepare(network, optimizer)
    log = out / LOSS_LOG
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        _trim_log(log, step)

    weights = config.weights()
    workers, rank = accelerator.num_processes, accelerator.process_index
    bar = tqdm(total=config.steps, initial=step, desc=desc, disable=not (progress and accelerator.is_main_process))
    while step < config.steps:
        step_start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        totals = {"loss": 0.0, "ar_loss": 0.0, "consistency_loss": 0.0}
        for micro in range(config.grad_accumulation):
            position = (step * config.grad_accumulation + micro) * workers + rank
            # one autocast region for all of a step's forwards: each forward's own region (accelerate wraps
            # the model's forward in one) casts the weights to bf16 again, and autograd keeps every copy until
            # the backward pass (a 0.5B model: about 0.8 GB per Jacobi block, a step of 8 blocks peaked at 21 GB)
            with accelerator.autocast():
                losses = prompt_losses(network, batch_at(data, position, config), weights)
            # gradients are synchronised across processes only on the last micro-batch
            context = accelerator.no_sync(network) if micro < config.grad_accumulation - 1 else nullcontext()
            with context:
                accelerator.backward(losses["loss"] / config.grad_accumulation)
            for name in totals:
                totals[name] += float(losses[name].detach()) / config.grad_accumulation
        if workers > 1:  # log the loss of the whole global batch, as one process with more micro-batches would
            means = accelerator.reduce(torch.tensor(list(totals.values()), device=accelerator.device), "mean")
            totals = dict(zip(totals, means.tolist()))
        accelerator.clip_grad_norm_(network.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        # a step's activations (GBs for a 0.5B model) would otherwise stay in the heap's arenas and add to the
        # next step's peak (measured with the 0.5B: 16-17 GB held between steps, 7.7 GB with this)
        memory.trim_heap()
        step += 1
        if accelerator.is_main_process:
            row = {"step": step, **totals, "lr": learning_rate(step - 1, config),
                   "step_s": round(time.perf_counter() - step_start, 3)}
            jsonl.append(log, row)
            bar.set_postfix(loss=f"{totals['loss']:.3f}", consistency=f"{totals['consistency_loss']:.3f}")
        bar.update(1)
        if step % config.checkpoint_every == 0 or step == config.steps:
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                unwrapped = accelerator.unwrap_model(network)
                if step == config.steps:
                    save(out / FINAL, unwrapped, loaded.tokenizer, None, step, config)
                    _prune(out, config.keep_checkpoints - 1)  # the final model counts as one
                else:
                    if config.snapshots:  # before the checkpoint: a resume from it never skips a snapshot
                        save(out / f"snapshot-{step:06d}", unwrapped, loaded.tokenizer, None, step, config)
                    save(out / f"checkpoint-{step:06d}", unwrapped, loaded.tokenizer, optimizer, step, config)
                    _prune(out, config.keep_checkpoints)
    bar.close()
    accelerator.wait_for_everyone()
    # Give the memory back: freed, it stays in the heap's per-thread arenas, and a second training in the
    # same process (04 fine-tunes on reference answers, then trains the CLLM) ran beside the first one's
    # weights, gradients and AdamW state (a 0.5B model's 8 GB: 04's cpu-full run was killed for memory).
    accelerator.free_memory()
    del network, optimizer, loaded
    memory.free_memory()
    return final


def read_losses(out: str | Path) -> list[dict]:
    """The loss curve of a training run (one row per optimizer step)."""
    return jsonl.read(Path(out) / LOSS_LOG)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="base model: zoo name, hub id, folder or .gguf")
    parser.add_argument("--trajectories", required=True, help="JSONL written by cllm.trajectories.collect")
    parser.add_argument("--out", required=True, help="output folder (checkpoints, final/, losses.jsonl)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--gpu", action="store_true", help="train on the accelerator's GPU(s) instead of the CPU")
    for field, default in asdict(TrainConfig()).items():
        if isinstance(default, bool):  # type=bool would read "--snapshots False" as True
            parser.add_argument(f"--{field.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=default)
        else:
            parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    args = vars(parser.parse_args(argv))
    config = TrainConfig(**{field: args[field] for field in asdict(TrainConfig())})
    if not args["gpu"]:
        # CPU processes on a machine with a GPU: accelerate's barrier would still name a CUDA device per
        # process (cuda:1 on a one-GPU machine fails); hidden before anything initialises CUDA, none is seen.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    final = train(args["model"], args["trajectories"], args["out"], config, dtype=args["dtype"], cpu=not args["gpu"])
    print(final)


if __name__ == "__main__":
    main()
