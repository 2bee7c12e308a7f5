"""Notebook 04: parallel decoding. The cost of a forward over n tokens, T(n), per model, and the
tokens per forward at which Jacobi or lookahead decoding breaks even; the base model's Jacobi
trajectories, a consistency LLM (CLLM) fine-tuned on them, then AR vs Jacobi and lookahead decoding
of the base model and of the CLLM, and prompt lookup, on held-out prompts (databases or templates
never trained on): tokens per forward, speed, each forward beside T(n) at its n, per-block
statistics, quality drift; and AR vs lookahead (vs Jacobi), prompt lookup and a draft model on a
reference model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from specdec_lab import data, hardware, metrics, models, quality, token_view
from specdec_lab.cllm import train, trajectories
from specdec_lab.decoders import jacobi
from specdec_lab.decoders.backend import stop_token_ids
from specdec_lab.experiments import common, lineups
from specdec_lab.experiments.cllm_tables import (Tables, accuracy, block_summary, block_table, break_even_table,
                                                 extra_memory, forward_cost_check, forward_sizes, groups,
                                                 chosen_checkpoint, learning_curve_table, looping_answers,
                                                 ms_per_decode_forward, paired_answers, seen_and_held_out)
from specdec_lab.experiments.cllm_words import headline
from specdec_lab.models import LLAMA_CPP, LoadedModel, cpu_kernels
from specdec_lab.runs import bench

NOTEBOOK = "04_cllm"


def split(params: dict) -> tuple[list[data.Prompt], list[data.Prompt], list[data.Prompt]]:
    """All prompts of the training groups (Spider's databases, math templates); the first
    `eval_prompts` of the held-out ones (disjoint groups), on which the methods are compared; and the
    next `learning_curve_prompts` held-out ones, on which the learning curves are read and the CLLM's
    checkpoint is chosen: never the prompts it is then measured on. Each side is spread round-robin
    over its groups. The CLLM's trajectories come from the first `train_prompts` of the training side;
    fine-tuning on reference answers draws from all of it."""
    train_side, held_out_set = data.split_by_group(data.load_prompts(params["prompt_set"]),
                                                   params["held_out_fraction"], seed=params["seed"])
    by_group = lambda prompt: prompt.group  # noqa: E731
    held_out_set = data.round_robin(held_out_set, by_group)
    evaluated, wanted = params["eval_prompts"], params["learning_curve_prompts"]
    if len(held_out_set) < evaluated + wanted:
        raise ValueError(f"eval_prompts = {evaluated} and learning_curve_prompts = {wanted} need {evaluated + wanted} "
                         f"held-out prompts, but {params['prompt_set']!r} holds out {len(held_out_set)} at "
                         f"held_out_fraction = {params['held_out_fraction']}: lower one of them, or raise "
                         f"held_out_fraction")
    return (data.round_robin(train_side, by_group), held_out_set[:evaluated],
            held_out_set[evaluated: evaluated + wanted])


def train_config(params: dict) -> train.TrainConfig:
    """The notebook's training parameters, named as TrainConfig names them (`train_steps` -> steps),
    with `mixed_precision: auto` resolved (`mixed_precision`)."""
    names = {field.name for field in fields(train.TrainConfig)} - {"steps", "snapshots", "mixed_precision"}
    return train.TrainConfig(steps=params["train_steps"], snapshots=params["learning_curve_prompts"] > 0,
                             mixed_precision=mixed_precision(params.get("mixed_precision", "no"),
                                                             params.get("device", "cpu")),
                             **{k: v for k, v in params.items() if k in names})


def mixed_precision(asked: str, device: str) -> str:
    """'auto': bf16 autocast on a GPU or on a CPU with bf16 dot products (AVX-512 BF16, AMX), where
    it made a training step 1.7x faster than fp32; none elsewhere: on the AVX2 EPYC every bf16
    product is emulated, and a step of the cpu profile took 120 s under autocast."""
    if asked != "auto":
        return asked
    if models.device_type(device) == "cuda":
        return "bf16"
    return "bf16" if cpu_kernels.BF16_DOT_PRODUCTS else "no"


def recipes(params: dict) -> list[train.TrainConfig]:
    """One training configuration per entry of `training_recipes` (each sets the learning rate or the AR
    weight, the rest as the parameters say), or the parameters' own one where the list is empty."""
    config = train_config(params)
    return [replace(config, **recipe) for recipe in params.get("training_recipes") or [{}]]


def answer_config(params: dict) -> train.TrainConfig:
    """Supervised fine-tuning on reference answers: the AR loss alone (cross-entropy, no smoothing),
    `sft_answers_per_step` answers (one prompt each) accumulated into every optimizer step."""
    return replace(train_config(params), steps=params["sft_steps"], learning_rate=params["sft_learning_rate"],
                   grad_accumulation=params["sft_answers_per_step"], consistency_weight=0.0, ar_weight=1.0,
                   label_smoothing=0.0, states_per_step=1, snapshots=False)


def fine_tune_on_answers(params: dict, prompts: Sequence[data.Prompt], answers: dict[str, str],
                         pretrained: LoadedModel) -> Path:
    """The paper's starting point: the model fine-tuned on the task's reference answers (Spider's gold
    SQL, a math problem's worked answer; of the training side only). Returns the fine-tuned model's folder."""
    end_id = pretrained.tokenizer.eos_token_id
    if end_id not in stop_token_ids(pretrained.model, pretrained.tokenizer):  # the decoders must stop where answers end
        raise ValueError(f"{params['model']}'s eos_token ({pretrained.tokenizer.eos_token!r}) is not among the ids its "
                         f"generation stops at: the answers to fine-tune on cannot be ended; use sft_steps: 0")
    records = trajectories.answer_records(pretrained.tokenizer, prompts, answers, end_id)
    config = answer_config(params)
    run_dir = train.run_folder(common.results_file(params, NOTEBOOK, "runs"), params["model"], records, config,
                               params["train_dtype"])
    folder = train.train(params["model"], records, run_dir, config, dtype=params["train_dtype"],
                         cpu=params["device"] == "cpu", desc="fine-tuning on reference answers")
    print(f"fine-tuned for {config.steps * config.grad_accumulation} answers drawn from {len(records)} prompts: {folder}")
    return folder


def cost_curve(loaded: LoadedModel, spec: str, dtype: str, params: dict) -> pd.DataFrame:
    """T(n) of one model (`hardware.forward_cost_curve`, the curve notebooks 01 and 03 use)."""
    curve = hardware.forward_cost_curve(loaded.model, params["cost_curve_n"], repeats=params["cost_curve_repeats"])
    return curve.assign(model=spec, dtype=dtype)


def run(params: dict) -> Tables:
    """The phases, in order: the base model (fine-tuned on reference answers first, with
    `sft_steps`), its Jacobi trajectories and the CLLM trained on them, the held-out prompts, the
    training prompts, the reference model, the cost curves. Each phase resumes from its files."""
    model, dtype, device = params["model"], params["dtype"], params["device"]
    pretrained = models.load(model, dtype=dtype, device=device)
    curves = {(model, dtype): cost_curve(pretrained, model, dtype, params)}
    train_side, held_out_set, validation = split(params)
    train_set = train_side[:params["train_prompts"]]
    kind = data.GROUP_KINDS.get(params["prompt_set"], "groups")
    print(f"training: {len(train_set)} prompts over {len(groups(train_set))} {kind}")
    print(f"held out: {len(held_out_set)} prompts over {kind} never trained on: {', '.join(groups(held_out_set))}")

    base, base_spec, pretrained_rows = base_model(params, pretrained, train_side, held_out_set)
    del pretrained
    trained = train_cllm(params, base, base_spec, train_set)
    curve = learning_curves(params, base, trained, validation)
    choice = None if curve is None else chosen_checkpoint(curve, params["max_nll_rise"])
    if choice is not None:
        trained = replace(trained, folder=Path(choice.folder), recipe=choice.recipe, step=choice.step)
    cllm = models.load(str(trained.folder), dtype=dtype, device=device)
    measured = {**params, "cllm": cllm_name(trained.folder)}  # the rows' configuration names the CLLM they ran
    methods = lineups.cllm(base, cllm, params["max_new_tokens"], params["block_size"], params["init"],
                           lookahead_configs=params["lookahead_configs"], prompt_lookup_k=params["prompt_lookup_k"])
    rows = bench.run(methods, held_out_set, base.tokenizer, out=common.results_file(params, NOTEBOOK, "held_out.jsonl"),
                     repeats=params["repeats"], warmup=params["warmup"], config=measured, desc="held-out")
    forward_check = forward_check_curve(base, rows, params)  # the CLLM has the base's shapes: one curve serves both
    table = metrics.summary(rows, baseline=lineups.BASE_AR)
    summary = common.summary_lines(table, methods)
    seen_rows = measure_training_prompts(params, base, cllm, train_set, trained.kept, measured)
    nll = held_out_nll({"base": base, "CLLM": cllm}, rows, held_out_set)
    views = token_view.views_of_rows(rows, base.tokenizer)
    converging = block_trajectories({"base model": base, "CLLM": cllm}, held_out_set[0], params)
    del cllm, methods, base

    reference = measure_reference(params, held_out_set, curves)
    cost_curves = measure_other_cost_curves(params, curves)
    tables = assemble(params, train_set, held_out_set, trained, rows, table, seen_rows, nll, cost_curves)
    tables.forward_check = forward_cost_check(rows, forward_check)
    tables.table["extra_memory_mb"] = extra_memory(tables.table, lineups.BASE_AR, {})
    add_accuracy(tables, params, rows, pretrained_rows)
    tables.learning_curve, tables.choice, tables.validation_set = curve, choice, validation
    tables.token_views, tables.trajectories = views, converging
    if reference is not None:
        tables.reference_precision = reference.precision
        tables.reference_table = metrics.summary(reference.rows, baseline=lineups.BASE_AR)
        tables.reference_table["ms_per_decode_forward"] = ms_per_decode_forward(reference.rows)
        tables.reference_table["extra_memory_mb"] = extra_memory(tables.reference_table, lineups.BASE_AR,
                                                                 reference.extra_weights_bytes)
        tables.reference_forward_check = forward_cost_check(reference.rows, reference.forward_check)
        tables.reference_blocks = block_summary(block_table(reference.rows))
    common.write_outputs(params, NOTEBOOK, summary, headline(tables), dtype=dtype,
                         model=f"{model} fine-tuned on reference answers" if params["sft_steps"] else model)
    return tables


def block_trajectories(loaded: dict[str, LoadedModel], prompt: data.Prompt, params: dict) -> token_view.HTML:
    """Each model's Jacobi block of `prompt` that fixed the most tokens beyond one an iteration, as it
    converged (an untimed decode with the trajectory kept: what the CLLM trains on)."""
    parts = []
    for label, model in loaded.items():
        result = jacobi.generate(model.model, data.encode(model.tokenizer, prompt), params["max_new_tokens"],
                                 block_size=params["block_size"], init=params["init"], record_states=True)
        traces = result.jacobi.traces
        if not traces:  # the first token ended the answer: no block to show
            continue
        best = max(range(len(traces)), key=lambda i: (result.jacobi.blocks[i].fast_forward, -i))
        parts.append(token_view.trajectory_html(
            traces[best], model.tokenizer,
            f"{label}: block {best + 1} of prompt {prompt.id}, {len(traces[best].states)} iterations for "
            f"{len(traces[best].fixed_point)} tokens"))
    return token_view.HTML("".join(parts))


def base_model(params: dict, pretrained: LoadedModel, train_side: Sequence[data.Prompt],
               held_out_set: Sequence[data.Prompt]) -> tuple[LoadedModel, str, pd.DataFrame | None]:
    """The model the CLLM starts from, its spec, and the pretrained model's held-out rows: with
    `sft_steps`, the pretrained model answers the held-out prompts (for its accuracy), then is
    fine-tuned on the training side's reference answers; without, the pretrained model itself."""
    if not params["sft_steps"]:
        return pretrained, params["model"], None
    answers = data.reference_answers(params["prompt_set"])  # fails before any work for a set without
    pretrained_rows = bench.run([lineups.ar(pretrained, params["max_new_tokens"], name=lineups.PRETRAINED_AR)],
                                held_out_set, pretrained.tokenizer, repeats=1, warmup=0, config=params,
                                desc="pretrained", out=common.results_file(params, NOTEBOOK, "pretrained.jsonl"))
    base_spec = str(fine_tune_on_answers(params, train_side, answers, pretrained))
    return models.load(base_spec, dtype=params["dtype"], device=params["device"]), base_spec, pretrained_rows


@dataclass(frozen=True)
class Trained:
    """The CLLM's training: the trajectories collected, those kept, the loss log of every recipe (a
    `recipe` column), the final model of every recipe's run, and the model taken as the CLLM: its
    folder, recipe and step (a run's final model, or the checkpoint its learning curve chose)."""

    records: list[dict]
    kept: list[dict]
    losses: pd.DataFrame
    runs: dict[str, Path]  # recipe -> its run's final model
    folder: Path
    recipe: str
    step: int


def train_cllm(params: dict, base: LoadedModel, base_spec: str, train_set: Sequence[data.Prompt]) -> Trained:
    """The base model's Jacobi trajectories on the training prompts, then a CLLM trained on the usable
    ones for every recipe (`recipes`), in `train_dtype` (fp32 weights under bf16 autocast: AdamW's small
    steps are lost on bf16 weights). The first recipe's final model is the CLLM until a learning curve
    chooses (`chosen_checkpoint`)."""
    records = trajectories.collect(base.model, base.tokenizer, train_set,
                                   common.results_file(params, NOTEBOOK, "trajectories.jsonl"),
                                   params["max_new_tokens"], params["block_size"], params["init"], params["seed"],
                                   config={"model": base_spec, "dtype": params["dtype"]})
    kept, _ = trajectories.usable(records)
    runs, losses = {}, []
    for config in recipes(params):
        run_dir = train.run_folder(common.results_file(params, NOTEBOOK, "runs"), base_spec, kept, config,
                                   params["train_dtype"])
        runs[config.recipe()] = train.train(base_spec, kept, run_dir, config, dtype=params["train_dtype"],
                                            cpu=params["device"] == "cpu", desc=f"CLLM training ({config.recipe()})")
        run_losses = pd.DataFrame(train.read_losses(run_dir))
        losses.append(run_losses.assign(recipe=config.recipe()))
        print(f"CLLM ({config.recipe()}) in {runs[config.recipe()]}; {len(run_losses)} steps, "
              f"{run_losses.step_s.sum() / 60:.1f} min of training")
    recipe, folder = next(iter(runs.items()))
    return Trained(records, kept, pd.concat(losses, ignore_index=True), runs, folder, recipe,
                   train.snapshot_step(folder))


def cllm_name(folder: Path) -> str:
    """A checkpoint as the rows' configuration names it: its run's folder (a hash of the recipe and the
    data) and the checkpoint in it."""
    return f"{folder.parent.name}/{folder.name}"


def learning_curves(params: dict, base: LoadedModel, trained: Trained,
                    validation: Sequence[data.Prompt]) -> pd.DataFrame | None:
    """Jacobi decoding by the base model (step 0) and by every recipe's model at each of its checkpoints,
    on the validation prompts (held out, never the compared ones), with the NLL of the base model's
    greedy answers to them under each model (`learning_curve_table`): whether more training would pay
    shows in the slope, and which recipe and step keep the base's text while fixing the most tokens
    per forward (`chosen_checkpoint`). Counts, not times: nothing here is interleaved. None without
    `learning_curve_prompts`."""
    if not params["learning_curve_prompts"]:
        for run in trained.runs.values():
            if params["train_steps"] > params["checkpoint_every"] and not train.snapshots(run.parent):
                print(f"learning curve: none in this profile (learning_curve_prompts: 0); {run.parent} keeps no "
                      "snapshots for one")
        return None
    out = common.results_file(params, NOTEBOOK, "learning_curve.jsonl")
    base_rows = bench.run([lineups.ar(base, params["max_new_tokens"], name=lineups.BASE_AR),
                           lineups.jacobi_method(base, params["max_new_tokens"], params["block_size"], params["init"],
                                                 lineups.BASE_JACOBI, lossless=True)],
                          validation, base.tokenizer, repeats=1, warmup=0, config=params, desc="validation: base",
                          out=out)
    answers = metrics.reference_tokens(base_rows, lineups.BASE_AR)
    base_point = with_answer_nll(base, base_rows[base_rows.decoder == lineups.BASE_JACOBI], validation, answers)
    points = [base_point.assign(recipe=recipe, step=0, folder="") for recipe in trained.runs]
    checkpoints = [(recipe, folder) for recipe, final in trained.runs.items()
                   for folder in [*train.snapshots(final.parent), final]]
    for recipe, folder in tqdm(checkpoints, desc="learning curves", unit="checkpoint"):
        step = train.snapshot_step(folder)
        model = models.load(str(folder), dtype=params["dtype"], device=params["device"])
        method = lineups.jacobi_method(model, params["max_new_tokens"], params["block_size"], params["init"],
                                       f"Jacobi (CLLM, {recipe}, after {step} steps)", lossless=False)
        rows = bench.run([method], validation, model.tokenizer, repeats=1, warmup=0,
                         config={**params, "cllm": cllm_name(folder)}, desc=f"{recipe}, step {step}", out=out)
        points.append(with_answer_nll(model, rows, validation, answers).assign(recipe=recipe, step=step,
                                                                               folder=str(folder)))
        del model
    return learning_curve_table(pd.concat(points, ignore_index=True), quality.answer_key(params["prompt_set"]),
                                answers)


@torch.no_grad()
def with_answer_nll(model: LoadedModel, rows: pd.DataFrame, prompts: Sequence[data.Prompt],
                    answers: pd.Series) -> pd.DataFrame:
    """The rows with `nll_per_token`: the mean NLL of the base model's greedy answer to each row's prompt
    under `model` (how far the model has drifted from the base as a language model, prompt by prompt)."""
    nll = {prompt.id: float(quality.continuation_nll(model.model, data.encode(model.tokenizer, prompt),
                                                     answers[prompt.id]).mean()) for prompt in prompts}
    return rows.assign(nll_per_token=rows.prompt_id.map(nll))


def measure_training_prompts(params: dict, base: LoadedModel, cllm: LoadedModel, train_set: Sequence[data.Prompt],
                             kept: list[dict], measured: dict) -> pd.DataFrame:
    """Jacobi of the base model and of the CLLM on the training prompts it was trained on (looping
    generations were left out of training), up to `eval_prompts` of them."""
    trained_on = {record["prompt_id"] for record in kept}
    methods = lineups.cllm(base, cllm, params["max_new_tokens"], params["block_size"], params["init"], with_ar=False)
    return bench.run(methods, [p for p in train_set if p.id in trained_on][:params["eval_prompts"]], base.tokenizer,
                     out=common.results_file(params, NOTEBOOK, "training_prompts.jsonl"), repeats=1, warmup=0,
                     config=measured, desc="training prompts")


def forward_check_curve(loaded: LoadedModel, rows: pd.DataFrame, params: dict) -> pd.DataFrame:
    """T(n) of `loaded` at every n the rows' decode forwards fed, measured right after them in the same
    process (`forward_cost_check` sets each method's forwards beside it)."""
    return hardware.forward_cost_curve(loaded.model, forward_sizes(rows), repeats=params["cost_curve_repeats"])


@dataclass
class Reference:
    """What section 5 measured on the reference model: its rows, the path it ran on ('bf16 int4-wo'
    where `reference_dtype: auto` chose that), T(n) at its forwards' n, and the weights each method
    holds beside it (the draft's)."""

    rows: pd.DataFrame
    precision: str
    forward_check: pd.DataFrame
    extra_weights_bytes: dict[str, int]


def measure_reference(params: dict, held_out_set: Sequence[data.Prompt], curves: dict) -> Reference | None:
    """The reference model's rows (`run_reference`), its cost curve into `curves`; None without one."""
    if not params["reference_model"]:
        return None
    reference = load_reference(params)
    spec, label = params["reference_model"], curve_dtype(reference)
    curves[(spec, label)] = cost_curve(reference, spec, label, params)
    rows, extra_weights = run_reference(reference, params, held_out_set)
    return Reference(rows, reference.precision, forward_check_curve(reference, rows, params), extra_weights)


def measure_other_cost_curves(params: dict, curves: dict) -> pd.DataFrame:
    """T(n) of the other models the cost curves compare (`cost_curve_models`), one loaded at a time,
    beside those measured already (dtype 'llama.cpp': the model's GGUF file on llama.cpp, the bound
    that engine sets for Jacobi and a CLLM); all of them, saved to cost_curves.csv."""
    for entry in params["cost_curve_models"]:
        key = (entry["model"], entry["dtype"])
        if key not in curves:
            other = (models.load_on_llama_cpp(key[0]) if key[1] == LLAMA_CPP
                     else models.load(key[0], dtype=key[1], device=params["device"]))
            curves[key] = cost_curve(other, *key, params)
            del other
    cost_curves = pd.concat(curves.values(), ignore_index=True)
    cost_curves.to_csv(common.results_file(params, NOTEBOOK, "cost_curves.csv"), index=False)
    return cost_curves


def assemble(params: dict, train_set, held_out_set, trained: Trained, rows: pd.DataFrame, table: pd.DataFrame,
             seen_rows: pd.DataFrame, nll: pd.DataFrame, cost_curves: pd.DataFrame) -> Tables:
    """The tables from the held-out rows (`table`: their summary), the training-prompt rows, the
    NLL and the cost curves."""
    table["ms_per_decode_forward"] = ms_per_decode_forward(rows)
    blocks, both = block_table(rows), seen_and_held_out(seen_rows, rows)
    tables = Tables(
        train_set, held_out_set, trajectories.summary(trained.records), trained.losses, trained.folder, rows, table,
        blocks, block_summary(blocks), both,
        both.pivot_table(index="decoder", columns="prompts", values="tokens_per_target_forward"),
        nll, looping_answers(rows, lineups.CLLM_JACOBI), cost_curves,
        break_even_table(cost_curves, params["block_size"], params["lookahead_configs"]))
    tables.cllm_lookahead, tables.base_lookahead = lineups.cllm_lookahead_names(params["lookahead_configs"])
    tables.cllm_recipe, tables.cllm_step = trained.recipe, trained.step
    return tables


def add_accuracy(tables: Tables, params: dict, rows: pd.DataFrame, pretrained_rows: pd.DataFrame | None) -> None:
    """Exact match per method by the prompt set's answer key (Spider's gold SQL, a math problem's final
    number; the pretrained model's too, when the base was fine-tuned), and base against CLLM prompt
    by prompt; nothing for a prompt set without checkable answers."""
    key = quality.answer_key(params["prompt_set"])
    if key is None:
        return
    answered = rows if pretrained_rows is None else pd.concat([pretrained_rows, rows])
    tables.answer_key, tables.accuracy = key, accuracy(answered, key)
    tables.accuracy_pairs = paired_answers(rows, key, lineups.BASE_AR, lineups.CLLM_JACOBI)


def load_reference(params: dict) -> LoadedModel:
    # lookahead and Jacobi verify many tokens a forward: 'auto' takes the path fastest at that
    return models.load(params["reference_model"], dtype=params["reference_dtype"], device=params["device"],
                       multi_token=True)


def curve_dtype(loaded: LoadedModel) -> str:
    """A cost curve's dtype label as the parameters spell it ('bfloat16'; 'bfloat16 int4-wo' where
    `reference_dtype: auto` chose int4), so the reference model's curve and the same model's entry
    in `cost_curve_models` are one curve, measured once."""
    name = str(loaded.dtype).removeprefix("torch.")
    return name if loaded.quantization == "none" else f"{name} {loaded.quantization}"


def run_reference(reference: LoadedModel, params: dict, held_out_set: list[data.Prompt]) -> tuple[pd.DataFrame, dict]:
    """AR vs lookahead decoding (and Jacobi, if asked) on an untrained larger model, on the first
    held-out prompts: what the training-free parallel decoders give where T(n) is flat; beside them,
    as in the CLLM paper's table, prompt lookup and speculative decoding with `reference_draft`, a
    smaller model of its family. Returns the rows and the bytes of weights each method holds beside
    the reference model's (the draft's)."""
    methods = lineups.cllm(reference, None, params["max_new_tokens"], params["block_size"], params["init"],
                           with_jacobi=params["reference_jacobi"], lookahead_configs=params["lookahead_configs"],
                           prompt_lookup_k=params["prompt_lookup_k"])
    extra_weights = {}
    if params["reference_draft"]:
        # 'auto': the path fastest at one-token steps, which is what a draft runs
        draft = models.load(params["reference_draft"], dtype=params["reference_dtype"], device=params["device"])
        models.check_same_tokenizer(reference.tokenizer, draft.tokenizer, params["reference_model"],
                                    params["reference_draft"])
        speculative = lineups.draft_model_speculative(reference, draft, params["reference_draft_k"],
                                                      params["max_new_tokens"])
        methods.append(speculative)
        extra_weights[speculative.name] = draft.weight_bytes
    rows = bench.run(methods, held_out_set[:params["reference_prompts"]], reference.tokenizer,
                     out=common.results_file(params, NOTEBOOK, "reference_model.jsonl"), repeats=params["repeats"],
                     warmup=params["warmup"], config={**params, **common.precisions(target=reference)},
                     desc=params["reference_model"])
    return rows, extra_weights


@torch.no_grad()
def held_out_nll(loaded: dict[str, LoadedModel], rows: pd.DataFrame, prompts: Sequence[data.Prompt],
                 reference_decoder: str = lineups.BASE_AR) -> pd.DataFrame:
    """Mean NLL per token of the reference decoder's texts (the base model's greedy answers to
    held-out prompts) under each model: how much the CLLM drifted from the base as a language model."""
    reference = metrics.reference_tokens(rows, reference_decoder)
    records = []
    for prompt in prompts:
        for name, model in loaded.items():
            nll = quality.continuation_nll(model.model, data.encode(model.tokenizer, prompt), reference[prompt.id])
            records.append({"model": name, "prompt_id": prompt.id, "nll_per_token": float(nll.mean())})
    return pd.DataFrame(records)
