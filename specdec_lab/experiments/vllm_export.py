"""The draft picker's recommendation, per kind of text, as vLLM's `speculative_config` and the `vllm serve`
command that runs it: vLLM is the engine a researcher moves to when one machine is not enough.

    python -m specdec_lab.experiments.vllm_export --profile cpu [--tensor-parallel-size 2]

It reads notebook 02's `picker.json` (the picker's best source per kind, with its record and predicted
speedup, as measured on this machine) and the profile's 02 parameter file (target and draft), and writes
`results/<profile>/02_speculative/vllm_export.json`. Where vLLM has no equal of a kit's source, the export
says what it approximates it with:
- prompt lookup -> `ngram` with k tokens and n-grams up to the kit's longest (vLLM's own matching; the
  kit's adaptive longest-match rule has no vLLM setting);
- the draft model -> `draft_model` with k tokens (an adaptive schedule starts from k; vLLM keeps k fixed);
  a draft tree -> a chain as deep as the tree (vLLM's tree attention serves EAGLE-style heads, not a draft
  model);
- suffix decoding -> `suffix` with the same tree depth, spec factor and probability floor (needs
  arctic-inference beside vLLM); a suffix tree -> its most frequent path (vLLM's proposer drafts one path),
  a cost-sized one uncut (vLLM has no such rule);
- the hybrid -> the single source the picker predicted best for that kind;
- a kind where no source is predicted to beat AR -> no speculation.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Mapping

import pandas as pd

from specdec_lab import params as parameters
from specdec_lab.method import CandidateSource, SuffixSettings, source_from_columns
from specdec_lab.runs import paths

NOTEBOOK = "02_speculative"
EXPORT_FILE = "vllm_export.json"
# the zoo's offline mirrors are GGUF copies of these hub checkpoints, which vLLM loads by name
HUB_IDS = {
    "qwen2.5-coder-1.5b-instruct": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "qwen2.5-coder-0.5b-instruct": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma-3-270m": "google/gemma-3-270m",
}


NO_CUT = ("the proposals' cut to the tokens worth verifying at this machine's T(n) has no vLLM setting: vLLM proposes "
          "up to num_speculative_tokens")


def hub_id(model: str) -> str:
    """The name vLLM loads a model by: a zoo name's hub id; a hub id or a local folder as given."""
    return HUB_IDS.get(model, model)


def speculative_config(line, draft: str | None) -> tuple[dict | None, str | None]:
    """(vLLM's speculative_config for one picker line, what it approximates; None, None: as the kit runs it).
    `line` holds a source record's columns (`method.source_columns`) and `predicted_speedup`."""
    source = source_from_columns(line, line.get("implementation", "ours"))
    if source is None or not float(line["predicted_speedup"]) > 1.0:
        return None, (f"no source is predicted to beat AR on this kind here (best: {line['source']}, "
                      f"{float(line['predicted_speedup']):.2f}x): serve without speculation")
    return config_of(source, hub_id(draft) if draft else None)


def config_of(source: CandidateSource, draft: str | None) -> tuple[dict, str | None]:
    """(vLLM's speculative_config for a candidate source, what of the source it approximates or None). `draft`:
    the draft model as vLLM loads it (a hub id or a local folder). Notebook 03 runs vLLM's own sources through it,
    the export the kit's."""
    if source.kind == "prompt lookup":
        config = {"method": "ngram", "num_speculative_tokens": source.k,
                  "prompt_lookup_max": source.max_ngram or 3, "prompt_lookup_min": 1}
        rule = None if source.match in (None, "latest") else (f"the kit's {source.match}-match rule and adaptive length "
                                                              f"become vLLM's own n-gram matching with k={source.k} fixed")
        if source.tree is not None:
            rule = "a lookup tree becomes one chain (vLLM's n-gram proposer has no trees)"
        return config, "; ".join(filter(None, [rule, NO_CUT if source.cost_sized else None])) or None
    if source.kind == "draft model":
        if not draft:
            raise ValueError("a draft-model source needs the draft model: the profile's parameters name no draft")
        config = {"method": "draft_model", "model": draft, "num_speculative_tokens": source.k}
        notes = []
        if source.schedule == "heuristic":
            notes.append(f"the adaptive draft length starts at k={source.k}; vLLM keeps it fixed")
        if source.tree is not None:
            notes.append("the draft tree becomes a chain as deep as the tree (vLLM's tree attention serves EAGLE heads)")
        return config, "; ".join(notes) or None
    if source.kind == "suffix":
        settings = source.suffix or SuffixSettings()
        config = {"method": "suffix", "num_speculative_tokens": source.k,
                  "suffix_decoding_max_tree_depth": settings.max_depth,
                  "suffix_decoding_max_spec_factor": settings.spec_factor,
                  "suffix_decoding_min_token_prob": settings.min_token_prob}
        notes = []
        if source.tree is not None:
            notes.append("the suffix tree becomes its most frequent path (vLLM's suffix proposer drafts one path)")
        if settings.spec_offset:
            notes.append(f"spec_offset {settings.spec_offset} has no vLLM setting (vLLM: 0)")
        if source.cost_sized:
            notes.append(NO_CUT)
        return config, "; ".join(notes) or None
    raise ValueError(f"no vLLM equivalent for a {source.kind!r} source: export the picker's best single source instead")


def best_single_source(table: pd.DataFrame, category: str):
    """The picker line with the highest predicted speedup for `category` among the sources vLLM has
    (ours, not the hybrid)."""
    lines = table[(table.category == category) & (table.implementation == "ours") & (table.source_kind != "hybrid")]
    return lines.loc[lines.predicted_speedup.idxmax()]


def export(picker: Mapping, target: str, draft: str | None, tensor_parallel_size: int = 1) -> list[dict]:
    """One entry per kind of text: the picker's recommendation, the vLLM config that serves it, what the
    config approximates, and the `vllm serve` command line."""
    table = pd.DataFrame(picker["table"])
    entries = []
    for line in pd.DataFrame(picker["recommended"]).to_dict("records"):
        chosen, via = line, None
        if line["source_kind"] == "hybrid":
            chosen = best_single_source(table, line["category"]).to_dict()
            via = (f"the hybrid (predicted {float(line['predicted_speedup']):.2f}x) has no vLLM equivalent: its best single "
                   f"source for this kind, {chosen['source']}")
        config, approximation = speculative_config(pd.Series(chosen), draft)
        command = ["vllm", "serve", hub_id(target)]
        if config is not None:
            command += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
        if tensor_parallel_size > 1:
            command += ["--tensor-parallel-size", str(tensor_parallel_size)]
        entries.append({"kind": line["category"], "recommended": line["source"],
                        "predicted_speedup": round(float(chosen["predicted_speedup"]), 3),  # of what is exported
                        "exported": chosen["source"], "speculative_config": config,
                        "approximation": "; ".join(note for note in (via, approximation) if note) or None,
                        "command": shlex.join(command)})
    return entries


def export_profile(profile: str, tensor_parallel_size: int = 1) -> tuple[list[dict], str]:
    """Export the profile's picker.json; returns the entries and the file written."""
    values = parameters.profile_values(NOTEBOOK, profile)
    if not values:
        raise parameters.ParameterError(f"profile {profile!r} has no {NOTEBOOK} parameter file")
    source = paths.results_path(values["results_dir"], NOTEBOOK, "picker.json")
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: run notebook 02 first (python -m specdec_lab.report --profile "
                                f"{profile} --only {NOTEBOOK}), with picker_prompts >= 1")
    entries = export(json.loads(source.read_text()), values["target"], values["draft"] or None, tensor_parallel_size)
    out = source.with_name(EXPORT_FILE)
    out.write_text(json.dumps(entries, indent=1))
    return entries, str(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs to shard the target over (vLLM's -tp)")
    args = parser.parse_args(argv)
    if args.tensor_parallel_size < 1:
        parser.error(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    entries, out = export_profile(args.profile, args.tensor_parallel_size)
    for entry in entries:
        print(f"{entry['kind']}: {entry['exported']} (predicted {entry['predicted_speedup']:.2f}x here)"
              + (f" [{entry['approximation']}]" if entry["approximation"] else "") + f"\n  {entry['command']}")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
