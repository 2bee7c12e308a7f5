"""vLLM, the engine users move to when they outgrow one machine, beside the kit: notebook 03's fifth part
(per kind of text, beside llama.cpp's AR and the kit's decoders) and notebook 05's vLLM part (per batch
size, beside the kit's batched AR).

vLLM's CPU build (`make vllm`) runs the target's transformers folder, the weights the kit's models
load, in its own worker process (`decoders.vllm_peer`): AR and its speculative methods, each
configuration one engine (vLLM fixes `speculative_config` when it loads). Two vLLM engines of the
1.5B do not fit beside the kit in this machine's memory, so the configurations run one after the
other, each in a benchmark of its own, interleaved per prompt with llama.cpp's own AR loop, the
baseline of part 4:
- each vLLM configuration's speedup over llama.cpp's AR is paired per prompt in its own run, as the
  kit's are in part 4;
- vLLM's speculation over vLLM's AR is the quotient of two such paired ratios per prompt (through
  the shared baseline);
- the kit's fastest lossless configuration of part 4 stands beside vLLM's fastest speculative one,
  both over llama.cpp's AR on the same prompts.
vLLM's acceptance per draft position comes from its own counters, beside the kit's for the same
kind of source in part 4, and its text is checked against vLLM's AR (its speculation must keep it)
and against the kit's AR on the same weights, which runs in vLLM's AR run. Notebook 05 runs the same
configurations on batches, each in a run of its own beside the kit's batched AR on the same batches
(`run_batches`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specdec_lab import metrics, models
from specdec_lab.decoders import llama_cpp_peer, vllm_peer
from specdec_lab.experiments import batch_tables, common, lineups
from specdec_lab.experiments.engines import NOTEBOOK, PEER_AR, EngineTables
from specdec_lab.experiments.speculative import prompts_of
from specdec_lab.experiments.vllm_export import config_of
from specdec_lab.machine import cpu_model
from specdec_lab.method import CandidateSource, Method, SuffixSettings, Weights
from specdec_lab.models import zoo
from specdec_lab.models.cpu_kernels import has_bf16_dot_products
from specdec_lab.quality import common_prefix_length
from specdec_lab.runs import bench


@dataclass
class VllmTables:
    rows: pd.DataFrame  # every generation, each with its configuration's run in `vllm_run`
    per_kind: pd.DataFrame  # per (kind, vLLM configuration): speedup over llama.cpp's AR, agreement, acceptance
    same_weights: pd.DataFrame  # per prompt: vLLM's AR text against the kit's AR on the same weights, where they part
    vllm_ar_over_kit_ar: metrics.Speedup  # vLLM's AR over the kit's on the same weights, paired per prompt
    over_vllm_ar: pd.DataFrame  # per (kind, vLLM speculation): speedup over vLLM's AR through the shared baseline
    acceptance: pd.DataFrame  # per (method, position): P(token i accepted | the ones before), vLLM's and the kit's
    versus_kit: pd.DataFrame  # per kind: the kit's fastest lossless configuration and vLLM's fastest speculation
    errors: pd.DataFrame  # the configurations vLLM's CPU build could not run here, with its error
    dtype: str  # the weights' dtype vLLM ran
    version: str
    cpu: str | None


def vllm_dtype(setting: str, flags: list[str] | None = None) -> str:
    """'auto': bf16 where the CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), else the same weights
    widened to fp32 (on the AVX2-only EPYC vLLM's bf16 path ran 1.1-1.8x slower than fp32)."""
    if setting != "auto":
        return setting
    return "bfloat16" if has_bf16_dot_products(cpu_model()["cpu_flags"] if flags is None else flags) else "float32"


def sources(methods, lookup_k: int, draft_k: int, suffix_k: int) -> dict[str, CandidateSource | None]:
    """vLLM's configurations as candidate-source records, AR (None) first, then `methods` (of
    `vllm_peer.SPECULATIVE_METHODS`): its n-gram proposer with `lookup_k` tokens, the draft model with
    `draft_k`, suffix decoding with `suffix_k` tokens at vLLM's defaults."""
    every = {"ngram": CandidateSource("prompt lookup", "vllm", k=lookup_k, max_ngram=3),
             "draft_model": CandidateSource("draft model", "vllm", k=draft_k, schedule="constant"),
             "suffix": CandidateSource("suffix", "vllm", k=suffix_k, suffix=SuffixSettings())}
    return {"AR": None, **{name: every[name] for name in methods}}


def folder(spec: str) -> str:
    """What vLLM loads for a model spec: a zoo model's converted transformers folder, else the spec (a hub
    id or a local folder)."""
    return str(zoo.ensure(spec)) if spec in zoo.ZOO else spec


def method_name(source: CandidateSource | None, dtype: str) -> str:
    what = "AR" if source is None else {"prompt lookup": "ngram", "draft model": "draft",
                                        "suffix": "suffix"}[source.kind] + f" k={source.k}"
    return f"vLLM {what} ({dtype})"


def run(params: dict, kit: EngineTables | None = None) -> VllmTables | None:
    """vLLM's configurations, each in its own run beside llama.cpp's AR; None where `make vllm` was not run.
    `kit`: part 4's tables, for the kit's acceptance, AR text and fastest configuration on the same prompts."""
    if not vllm_peer.available():
        print(f"vLLM is not installed ({vllm_peer.python()} is missing): run `make vllm` to add its rows")
        return None
    dtype, new_tokens = vllm_dtype(params["vllm_dtype"]), params["engine_max_new_tokens"]
    prompts = prompts_of({**params, "prompt_sets": params["engine_prompt_sets"]}, params["vllm_prompts"])
    target_on_llama = models.load_on_llama_cpp(params["target"])
    peer_ar = lineups.llama_cpp_ar(llama_cpp_peer.load_for(params["target"]), target_on_llama, new_tokens, name=PEER_AR)
    # the kit's AR on the weights vLLM runs, in vLLM's AR run: the text vLLM's must equal, and its speed beside
    kit_ar = [lineups.ar(models.load(params["target"], dtype=dtype), new_tokens, name=kit_ar_label(dtype),
                         weights=Weights(quantization="none"))]

    def benchmark(name: str, source: CandidateSource | None, engine) -> pd.DataFrame:
        method = lineups.vllm(engine, source, new_tokens, method_name(source, dtype))
        rows = bench.run([peer_ar, method] + (kit_ar if source is None else []), prompts, target_on_llama.tokenizer,
                         out=common.results_file(params, NOTEBOOK, "vllm.jsonl"), repeats=params["repeats"],
                         warmup=params["warmup"], config={**params, "vllm_run": name, "vllm_dtype": dtype},
                         desc=f"vLLM {name}")
        kit_ar.clear()  # the kit's model's memory goes to the speculative engines (a draft model beside the target)
        return rows

    rows, errors = each_configuration(params, params["engine_k"], dtype, benchmark)
    per_kind = per_kind_table(rows, kit_ar_label(dtype))
    versions = vllm_methods(rows).extras.map(lambda extras: extras.get("vllm")).dropna()
    return VllmTables(rows, per_kind, same_weights_table(rows, kit_ar_label(dtype)),
                      vllm_ar_over_kit_ar(rows, kit_ar_label(dtype)), over_ar_table(rows),
                      acceptance_table(rows, kit.rows if kit is not None else None),
                      versus_kit_table(per_kind, kit, rows) if kit is not None else pd.DataFrame(),
                      errors, dtype, versions.iloc[0] if not versions.empty else vllm_peer.PACKAGE.split("==")[1],
                      cpu_model()["cpu_model"])


def each_configuration(params: dict, draft_k: int, dtype: str, benchmark) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every vLLM configuration (AR first, then `vllm_methods`) in an engine of its own, loaded by its first
    request and closed once `benchmark(name, source, engine)` has its rows. An error vLLM raises (a method its
    CPU build lacks) is kept and shown; the other configurations still run. Returns the rows, each with its
    configuration's run in `vllm_run`, and the errors."""
    frames, errors = [], []
    for name, source in sources(params["vllm_methods"], params["prompt_lookup_k"], draft_k, params["vllm_suffix_k"]).items():
        config, _ = config_of(source, folder(params["draft"])) if source is not None else (None, None)
        engine = vllm_peer.StartedOnFirstUse(folder(params["target"]), speculative_config=config, dtype=dtype)
        try:
            frames.append(benchmark(name, source, engine).assign(vllm_run=name))
        except vllm_peer.VllmError as error:
            errors.append({"configuration": method_name(source, dtype), "speculative_config": config, "error": str(error)})
        finally:
            engine.close()
    errors = pd.DataFrame(errors, columns=["configuration", "speculative_config", "error"])
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["vllm_run"])
    if not (rows.vllm_run == "AR").any():
        raise RuntimeError(f"vLLM's AR did not run, so nothing of vLLM can be compared: {errors.to_dict('records')}")
    return rows, errors


def kit_ar_label(dtype: str) -> str:
    return f"AR (ours · torch {dtype}, vLLM's weights)"


def vllm_methods(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows.engine == "vllm"]


def vllm_ar_name(rows: pd.DataFrame) -> str:
    return vllm_methods(rows)[vllm_methods(rows).role == "target AR"].decoder.iloc[0]


def per_kind_table(rows: pd.DataFrame, kit_ar: str) -> pd.DataFrame:
    """Per (kind, vLLM configuration): its speedup over llama.cpp's AR (per-token time, paired per prompt in
    its own run; geometric mean over prompts, 95% interval), tokens/s, its text's agreement with vLLM's AR
    and with the kit's AR on the same weights (`kit_ar`, in vLLM's AR run), and vLLM's acceptance (accepted /
    drafted tokens)."""
    vllm_ar, kit = metrics.reference_tokens(rows, vllm_ar_name(rows)), metrics.reference_tokens(rows, kit_ar)
    lines = []
    for (run_name, kind), group in rows.groupby(["vllm_run", "category"], sort=False):
        table = metrics.summary(group, baseline=PEER_AR)
        mine = vllm_methods(group)
        name = mine.decoder.iloc[0]
        counted = mine.extras.map(lambda extras: (extras.get("vllm_accepted", 0), extras.get("vllm_draft_tokens", 0)))
        drafted = sum(d for _, d in counted)
        lines.append({"category": kind, "decoder": name, "vllm_run": run_name, "source_kind": mine.source_kind.iloc[0],
                      **metrics.Speedup.from_line(table.loc[name]).columns("speedup"),
                      "tokens_per_second": table.loc[name, "tokens_per_second"],
                      "agreement_with_vllm_ar": metrics.add_agreement(mine, reference=vllm_ar).agreement.mean(),
                      "agreement_with_kit_ar": metrics.add_agreement(mine, reference=kit).agreement.mean(),
                      "acceptance": sum(a for a, _ in counted) / drafted if drafted else float("nan")})
    return pd.DataFrame(lines)


def same_weights_table(rows: pd.DataFrame, kit_ar: str) -> pd.DataFrame:
    """Per prompt: vLLM's AR text against the kit's AR on the same weights, both in vLLM's AR run: the
    agreement, and where they part (`position`, None: equal) with the two tokens there."""
    vllm_ar = rows[(rows.decoder == vllm_ar_name(rows)) & (rows.repeat == 0)]
    kit = metrics.reference_tokens(rows, kit_ar)
    lines = []
    for row in vllm_ar.itertuples():
        expected = kit[row.prompt_id]
        position = common_prefix_length(expected, row.tokens)
        parted = position < min(len(expected), len(row.tokens))
        lines.append({"prompt_id": row.prompt_id, "category": row.category,
                      "agreement": position / max(len(expected), 1), "position": position if parted else None,
                      "kit_token": expected[position] if parted else None,
                      "vllm_token": row.tokens[position] if parted else None})
    return pd.DataFrame(lines, columns=["prompt_id", "category", "agreement", "position", "kit_token", "vllm_token"])


def vllm_ar_over_kit_ar(rows: pd.DataFrame, kit_ar: str) -> metrics.Speedup:
    """vLLM's AR over the kit's AR on the same weights, per-token time paired per prompt in vLLM's AR run."""
    ar_run = rows[rows.vllm_run == "AR"]
    speed = metrics.speedups(ar_run, kit_ar)
    return metrics.over_prompts(speed[speed.decoder == vllm_ar_name(rows)].groupby("prompt_id").speedup.median())


def per_prompt_speedups(rows: pd.DataFrame) -> pd.Series:
    """(vLLM run, prompt) -> the vLLM configuration's speedup over llama.cpp's AR on that prompt, in its run
    (the median over repeats; the kit's AR beside vLLM's in the AR run is not vLLM's)."""
    lines = []
    for run_name, group in rows.groupby("vllm_run", sort=False):
        speed = metrics.speedups(group, PEER_AR)
        speed = speed[speed.decoder.isin(set(vllm_methods(group).decoder))].groupby("prompt_id").speedup.median()
        lines += [{"vllm_run": run_name, "prompt_id": prompt, "speedup": value} for prompt, value in speed.items()]
    return pd.DataFrame(lines).set_index(["vllm_run", "prompt_id"]).speedup


def over_ar_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (kind, vLLM speculation): its speedup over vLLM's AR, per prompt the quotient of the two runs'
    ratios over llama.cpp's AR (geometric mean over prompts, 95% interval)."""
    speed, kinds = per_prompt_speedups(rows), rows.groupby("prompt_id").category.first()
    names = vllm_methods(rows).groupby("vllm_run").decoder.first()
    lines = []
    for run_name in speed.index.get_level_values(0).unique():
        if run_name == "AR":
            continue
        quotient = (speed[run_name] / speed["AR"]).dropna()
        for kind, values in quotient.groupby(kinds.reindex(quotient.index).to_numpy(), sort=False):
            lines.append({"category": kind, "decoder": names[run_name], "vllm_run": run_name,
                          **metrics.over_prompts(values).columns("speedup_over_vllm_ar")})
    return pd.DataFrame(lines)


def vllm_acceptance_by_position(rows: pd.DataFrame) -> pd.DataFrame:
    """P(draft token i accepted | tokens 1..i-1 accepted) per vLLM speculation, from vLLM's counters: drafts,
    and per position the drafts whose first i tokens were accepted. vLLM does not count how many drafts
    reached position i with a token proposed there, so a draft shorter than k counts as rejected past its end."""
    records = []
    for name, group in vllm_methods(rows)[vllm_methods(rows).role == "speculative"].groupby("decoder", sort=False):
        drafts = sum(extras.get("vllm_drafts", 0) for extras in group.extras)
        accepted = [0] * max(len(extras.get("vllm_accepted_per_position", [])) for extras in group.extras)
        for extras in group.extras:
            for position, count in enumerate(extras.get("vllm_accepted_per_position", [])):
                accepted[position] += count
        reached = drafts
        for position, count in enumerate(accepted, start=1):
            if reached:
                records.append({"decoder": name, "position": position, "steps": reached, "acceptance": count / reached})
            reached = count
    return pd.DataFrame(records, columns=["decoder", "position", "steps", "acceptance"])


def acceptance_table(rows: pd.DataFrame, kit_rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """vLLM's acceptance by position beside the kit's (part 4) for the same kinds of source, on the same prompts."""
    tables = [vllm_acceptance_by_position(rows)]
    if kit_rows is not None:
        kinds = set(vllm_methods(rows).source_kind.dropna())
        mine = kit_rows[(kit_rows.implementation == "ours") & kit_rows.source_kind.isin(kinds)
                        & kit_rows.prompt_id.isin(set(rows.prompt_id))]
        tables.append(metrics.acceptance_by_position(mine))
    return pd.concat(tables, ignore_index=True)


def prefixed(speedup: metrics.Speedup, who: str) -> dict:
    """A speedup's columns named for whose it is: `<who>_speedup`, its interval and `<who>_prompts`."""
    return {f"{who}_speedup": speedup.value, f"{who}_speedup_low": speedup.low, f"{who}_speedup_high": speedup.high,
            f"{who}_prompts": speedup.prompts}


def versus_kit_table(per_kind: pd.DataFrame, kit: EngineTables, rows: pd.DataFrame) -> pd.DataFrame:
    """Per kind: the kit's fastest configuration equal to its engine's AR (part 4's choice), its speedup over
    llama.cpp's AR on the prompts vLLM ran, beside vLLM's fastest speculation's and vLLM's AR's over the same
    baseline; `kit_over_vllm` is the quotient of the two point estimates."""
    lines = []
    for best in kit.best.itertuples():
        if not isinstance(best.best, str):  # no configuration of the kit equalled its engine's AR on this kind
            continue
        prompts = set(rows[rows.category == best.category].prompt_id)
        mine = kit.rows[kit.rows.prompt_id.isin(prompts) & kit.rows.decoder.isin([best.best, PEER_AR])]
        kit_speed = metrics.Speedup.from_line(metrics.summary(mine, baseline=PEER_AR).loc[best.best])
        theirs = per_kind[(per_kind.category == best.category) & (per_kind.vllm_run != "AR")]
        ar = per_kind[(per_kind.category == best.category) & (per_kind.vllm_run == "AR")]
        fastest = theirs.loc[theirs.speedup.idxmax()] if not theirs.empty else None
        vllm_speed = metrics.Speedup.from_line(fastest) if fastest is not None else metrics.over_prompts([])
        lines.append({"category": best.category, "kit": best.best, **prefixed(kit_speed, "kit"),
                      "vllm": None if fastest is None else fastest.decoder, **prefixed(vllm_speed, "vllm"),
                      "vllm_ar_speedup": float(ar.speedup.iloc[0]) if not ar.empty else float("nan"),
                      "kit_over_vllm": kit_speed.value / vllm_speed.value})
    return pd.DataFrame(lines)


def versus_kit_long(versus: pd.DataFrame) -> pd.DataFrame:
    """`versus_kit_table` as one line per (kind, side), the columns `plots.category_speedups` reads."""
    sides = {"kit": "the kit's fastest lossless (part 4)", "vllm": "vLLM's fastest speculation"}
    return pd.concat([pd.DataFrame({"category": versus.category, "method": label, "speedup": versus[f"{who}_speedup"],
                                    "speedup_low": versus[f"{who}_speedup_low"], "speedup_high": versus[f"{who}_speedup_high"],
                                    "prompts": versus[f"{who}_prompts"]}) for who, label in sides.items()],
                     ignore_index=True)


# --- notebook 05: batches ------------------------------------------------------------------------------

@dataclass
class VllmBatchTables:
    rows: pd.DataFrame  # one row per request, each with its configuration's run in `vllm_run`
    table: pd.DataFrame  # per (vLLM configuration, batch size): throughput, over the kit's batched AR, latency
    over_vllm_ar: pd.DataFrame  # per (vLLM speculation, batch size): throughput over vLLM's AR's, through the baseline
    errors: pd.DataFrame
    dtype: str


def run_batches(params: dict, kit_ar: Method, prompts, tokenizer) -> VllmBatchTables | None:
    """vLLM's configurations on notebook 05's batches, each in a run of its own beside the kit's batched AR
    (`kit_ar`, 05's baseline) on the same batches; None where `make vllm` was not run."""
    if not vllm_peer.available():
        print(f"vLLM is not installed ({vllm_peer.python()} is missing): run `make vllm` to add its rows")
        return None
    dtype = vllm_dtype(params["vllm_dtype"])

    def benchmark(name: str, source: CandidateSource | None, engine) -> pd.DataFrame:
        method = lineups.vllm(engine, source, params["max_new_tokens"], method_name(source, dtype), batched=True)
        return bench.run_batches([kit_ar, method], prompts, tokenizer,
                                 out=common.results_file(params, "05_batch", "vllm.jsonl"),
                                 batch_sizes=params["batch_sizes"], repeats=params["repeats"], warmup=params["warmup"],
                                 config={**params, "vllm_run": name, "vllm_dtype": dtype}, seed=params["seed"],
                                 desc=f"vLLM {name}")

    # vLLM fixes k when it loads: its draft drafts the longest of 05's k values at every batch size
    rows, errors = each_configuration(params, max(params["k_values"]), dtype, benchmark)
    return VllmBatchTables(rows, batch_table(rows, kit_ar.name), batch_over_ar_table(rows, kit_ar.name), errors, dtype)


def batch_table(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (vLLM configuration, batch size): throughput (tokens/s over the batch), its ratio to the kit's
    batched AR on the same batches and the per-request latency speedup, each paired in the configuration's
    own run (`batch_tables`: geometric means over batches, 95% intervals)."""
    lines = []
    for run_name, group in rows.groupby("vllm_run", sort=False):
        table = batch_tables.throughput_speedups(group, baseline).merge(
            batch_tables.latency_speedups(group, baseline), on=["decoder", "batch_size"])
        lines.append(table[table.decoder != baseline].assign(vllm_run=run_name))
    roles = rows.drop_duplicates("decoder").set_index("decoder").role
    table = pd.concat(lines, ignore_index=True).sort_values("batch_size", kind="stable").reset_index(drop=True)
    return table.assign(role=table.decoder.map(roles))


def batch_over_ar_table(rows: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (vLLM speculation, batch size): its throughput over vLLM's AR's, per batch the quotient of the two
    runs' throughput ratios over the kit's batched AR on that batch (geometric mean over batches, interval)."""
    ratios = {}
    for run_name, group in rows.groupby("vllm_run", sort=False):
        per_batch = batch_tables.batches(group).set_index(batch_tables.BATCH_KEYS)
        ratios[run_name] = (per_batch[per_batch.decoder != baseline].throughput
                            / per_batch[per_batch.decoder == baseline].throughput)
    names = vllm_methods(rows).groupby("vllm_run").decoder.first()
    lines = []
    for run_name, ratio in ratios.items():
        if run_name == "AR":
            continue
        quotient = (ratio / ratios["AR"]).dropna()
        for batch_size, values in quotient.groupby(level="batch_size"):
            lines.append({"decoder": names[run_name], "vllm_run": run_name, "batch_size": batch_size,
                          **metrics.over_prompts(values).columns("speedup_over_vllm_ar")})
    return pd.DataFrame(lines).rename(columns={"prompts": "batches"})
