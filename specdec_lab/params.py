"""Validate a notebook's parameters (from a papermill YAML) before any model loads.

The notebook's own `parameters` cell is the schema: its names are the known keys and its default
values give the types. `RULES` adds the range checks, by parameter name, shared by all notebooks.
Every problem is collected and reported at once, each naming the bad value and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from specdec_lab import models
from specdec_lab.cllm.constants import CONSISTENCY_KINDS, CONSISTENCY_TARGETS, MIXED_PRECISION
from specdec_lab.decoders import lookahead, vllm_peer
from specdec_lab.decoders.jacobi import INITS
from specdec_lab.method import SCHEDULES
from specdec_lab.models import quantize, zoo
from specdec_lab.runs.paths import NOTEBOOKS_DIR, PARAMS_DIR


class ParameterError(ValueError):
    pass


def _positive_int(name: str, value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"{name} must be an integer >= 1, got {value!r}"
    return None


def _non_negative_int(name: str, value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{name} must be an integer >= 0, got {value!r}"
    return None


def _positive_int_list(name: str, value) -> str | None:
    if not isinstance(value, list) or not value:
        return f"{name} must be a non-empty list of integers >= 1, got {value!r}"
    bad = [v for v in value if _positive_int(name, v)]
    return f"{name} must hold integers >= 1 only (k < 1 drafts nothing); bad: {bad}" if bad else None


def _batch_sizes(name: str, value) -> str | None:
    if (not isinstance(value, list) or not value or any(_positive_int(name, v) for v in value)
            or value != sorted(set(value)) or value[0] != 1):
        return (f"{name} must be a sorted list of distinct batch sizes that starts with 1 (batch 1 is every "
                f"row's reference), e.g. [1, 2, 4, 8], got {value!r}")
    return None


def _one_of(choices) -> Callable[[str, object], str | None]:
    def check(name: str, value) -> str | None:
        return None if value in choices else f"{name} must be one of {list(choices)}, got {value!r}"
    return check


def _model_spec(name: str, value) -> str | None:
    if value is None or value == "":
        return None  # optional model slot left empty
    if not isinstance(value, str):
        return f"{name} must be a model spec string, got {value!r}"
    try:
        if value in zoo.ZOO:
            return None
        path = Path(value).expanduser()
        if path.suffix == ".gguf" and not path.is_file():
            return f"{name}: GGUF file {value!r} does not exist"
        if path.suffix != ".gguf":
            models.resolve(value)  # raises on unknown specs without loading anything
    except (ValueError, FileNotFoundError) as error:
        return f"{name}: {error}"
    return None


def _fraction(name: str, value) -> str | None:
    if not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return f"{name} must be a number in [0, 1], got {value!r}"
    return None


def _non_negative_number(name: str, value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return f"{name} must be a number >= 0, got {value!r}"
    return None


def _prompt_set(name: str, value) -> str | None:
    from specdec_lab import data

    if isinstance(value, str) and (value in data.PROMPT_SETS or (value.endswith(".jsonl") and Path(value).is_file())):
        return None
    return f"{name}: unknown prompt set {value!r}: use one of {list(data.PROMPT_SETS)} or an existing .jsonl file"


def _prompt_set_list(name: str, value) -> str | None:
    if not isinstance(value, list) or not value:
        return f"{name} must be a non-empty list of prompt sets, got {value!r} (an empty prompt set measures nothing)"
    return next((p for p in (_prompt_set(name, v) for v in value) if p), None)


def _subset_of(choices) -> Callable[[str, object], str | None]:
    def check(name: str, value) -> str | None:
        bad = [v for v in value if v not in choices] if isinstance(value, list) else [value]
        return f"{name}: unknown value(s) {bad}: use a list of {list(choices)}" if bad else None
    return check


def _quantization_list(name: str, value) -> str | None:
    names = list(quantize.QUANTIZATIONS)
    if not isinstance(value, list) or not value:
        return f"{name} must be a non-empty list of quantizations from {names}, got {value!r}"
    bad = [v for v in value if v not in names]
    return f"{name}: unknown quantization(s) {bad}: use names from {names}" if bad else None


def _schedule_list(name: str, value) -> str | None:
    choices = list(SCHEDULES)
    if not isinstance(value, list) or not value or any(v not in choices for v in value):
        return f"{name} must be a non-empty list of draft-length schedules from {choices}, got {value!r}"
    return None


def _speculative_pairs(name: str, value) -> str | None:
    if not isinstance(value, list):
        return f"{name} must be a list of 'target/draft' quantization pairs like 'none/nf4', got {value!r}"
    for pair in value:
        try:
            quantize.parse_pair(pair)
        except ValueError as error:
            return f"{name}: {error}"
    return None


def _cost_curve_n(name: str, value) -> str | None:
    if (not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
            or 1 not in value or value != sorted(set(value)) or min(value) < 1):
        return (f"{name} must be a sorted list of distinct token counts >= 1 that starts with 1 (T(1) is what "
                f"every other T(n) is compared with), got {value!r}")
    return None


def _model_roles(name: str, value) -> str | None:
    if not isinstance(value, list) or not value or any(v not in ("target", "draft") for v in value):
        return f"{name} must be a non-empty list drawn from ['target', 'draft'], got {value!r}"
    return None


def _positive_number(name: str, value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return f"{name} must be a number > 0, got {value!r}"
    return None


def _open_fraction(name: str, value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        return f"{name} must be a number strictly between 0 and 1, got {value!r}"
    return None


def _lookahead_configs(name: str, value) -> str | None:
    if not isinstance(value, list):
        return f"{name} must be a list of lookahead configs (empty: no lookahead rows), got {value!r}"
    problem = next((p for p in map(lookahead.config_problem, value) if p), None)
    return f"{name}: {problem}" if problem else None


RECIPE_KEYS = ("learning_rate", "ar_weight")  # what a CLLM training recipe may set (04's training_recipes)


def _training_recipes(name: str, value) -> str | None:
    example = "[{learning_rate: 3.0e-05}, {learning_rate: 1.0e-05, ar_weight: 20.0}]"
    if not isinstance(value, list) or any(not isinstance(v, dict) or not set(v) <= set(RECIPE_KEYS) for v in value):
        return (f"{name} must be a list of mappings with keys among {list(RECIPE_KEYS)} (each overrides those "
                f"parameters for one training run; empty: the one run they set), like {example}, got {value!r}")
    return next((p for v in value for key, x in v.items() for p in [_positive_number(f"{name}: {key}", x)] if p), None)


def _model_dtype_list(name: str, value) -> str | None:
    example = "[{model: smollm2-135m-instruct, dtype: float32}]"
    if not isinstance(value, list) or any(not isinstance(v, dict) or set(v) != {"model", "dtype"} for v in value):
        return f"{name} must be a list of {{model, dtype}} mappings like {example}, got {value!r}"
    return next((p for p in (_model_spec(name, v["model"]) or _one_of([*sorted(models.DTYPES), models.LLAMA_CPP])(name, v["dtype"])
                             for v in value) if p), None)


RULES: dict[str, Callable[[str, object], str | None]] = {
    "max_new_tokens": _positive_int,
    "num_prompts": _positive_int,
    "repeats": _positive_int,
    "k": _positive_int,
    "k_values": _positive_int_list,
    "warmup": _non_negative_int,
    "cost_curve_max_n": _positive_int,  # 01_baseline
    "cost_curve_repeats": _positive_int,
    "seed": _non_negative_int,
    "temperature": _non_negative_number,
    "top_p": _fraction,
    "top_k": _non_negative_int,
    "dtype": _one_of(["auto", *sorted(models.DTYPES)]),  # auto: the fastest torch path measured on this CPU
    "device": _one_of(models.DEVICES),
    "target": _model_spec,
    "draft": _model_spec,
    "model": _model_spec,
    "universal_draft": _model_spec,
    "prompt_set": _prompt_set,
    "prompt_sets": _prompt_set_list,
    "quantizations": _quantization_list,  # 03_quantized
    "spec_pairs": _speculative_pairs,
    "footprint_models": _model_roles,
    "footprint_repeats": _positive_int,
    "cost_curve_n": _cost_curve_n,
    "prompt_lookup_k": _non_negative_int,
    # 02_speculative
    "schedules": _schedule_list,
    "sweep_prompts": _non_negative_int,  # 0: no k sweep
    "picker_prompts": _non_negative_int,  # 0: no draft picker
    "tree_nodes": _non_negative_int,  # 0: no token trees; else the trees' node budget (the picker sizes the draft's)
    "tree_branches": _non_negative_int,  # matches a prompt-lookup tree merges (0: no prompt-lookup tree)
    "suffix_k": _non_negative_int,  # 0: no suffix decoding; else its tokens a step (a tree's nodes, a path's length)
    "suffix_spec_factor": _non_negative_number,  # suffix decoding proposes at most this x the match length
    "control_prompts": _positive_int,
    "control_max_new_tokens": _positive_int,
    "control_target": _model_spec,
    "control_draft": _model_spec,
    "control_draft_dtype": _one_of(sorted(models.DTYPES)),
    "control_draft_quantization": _one_of(quantize.QUANTIZATIONS),
    # 04_cllm
    "block_size": _positive_int,
    "init": _one_of(INITS),
    "held_out_fraction": _open_fraction,
    "train_prompts": _positive_int,
    "eval_prompts": _positive_int,
    "train_steps": _positive_int,
    "train_dtype": _one_of(sorted(models.DTYPES)),
    "sft_steps": _non_negative_int,  # 0: no fine-tuning on reference answers first
    "sft_learning_rate": _positive_number,
    "sft_answers_per_step": _positive_int,  # answers accumulated into one optimizer step
    "learning_rate": _positive_number,
    "grad_accumulation": _positive_int,
    "states_per_step": _positive_int,
    "ar_weight": _non_negative_number,
    "consistency_weight": _non_negative_number,
    "consistency": _one_of(CONSISTENCY_KINDS),
    "consistency_target": _one_of(CONSISTENCY_TARGETS),
    "mixed_precision": _one_of([*MIXED_PRECISION, "auto"]),  # auto: bf16 where the CPU multiplies bf16 in hardware
    "checkpoint_every": _positive_int,
    "learning_curve_prompts": _non_negative_int,  # 0: no learning curve
    "label_smoothing": _fraction,
    "training_recipes": _training_recipes,  # several: the learning curves choose among them
    "max_nll_rise": _non_negative_number,  # how far a checkpoint may drift from the base's text to be chosen
    "reference_model": _model_spec,
    "reference_dtype": _one_of(["auto", *sorted(models.DTYPES)]),  # auto: the fastest path measured on this CPU
    "reference_prompts": _positive_int,
    "reference_draft": _model_spec,  # "": no speculative decoding with a draft in 04's section 5
    "reference_draft_k": _positive_int,
    "lookahead_configs": _lookahead_configs,
    "cost_curve_models": _model_dtype_list,
    # 05_batch
    "batch_sizes": _batch_sizes,
    # 03_quantized, the engines part
    "engine_prompt_sets": _prompt_set_list,
    "engine_prompts": _positive_int,
    "engine_max_new_tokens": _positive_int,
    "engine_k": _positive_int,
    "engine_cost_curve_n": _cost_curve_n,
    "torch_path": _one_of(["auto", *sorted(models.DTYPES)]),  # auto: the fastest path measured on this CPU
    # 03_quantized and 05_batch, the vLLM parts
    "vllm_methods": _subset_of(vllm_peer.SPECULATIVE_METHODS),
    "vllm_prompts": _positive_int,
    "vllm_dtype": _one_of(["auto", *vllm_peer.DTYPES]),  # auto: bf16 where the CPU multiplies bf16 in hardware
    "vllm_suffix_k": _positive_int,
}


def notebook_path(notebook: str) -> Path:
    path = NOTEBOOKS_DIR / (notebook if notebook.endswith(".ipynb") else notebook + ".ipynb")
    if not path.exists():
        known = sorted(p.stem for p in NOTEBOOKS_DIR.glob("*.ipynb"))
        raise ParameterError(f"unknown notebook {notebook!r}: known are {known}")
    return path


def notebook_defaults(notebook: str) -> dict:
    """The names and default values of the notebook's `parameters` cell."""
    import ast
    import json

    cells = json.loads(notebook_path(notebook).read_text())["cells"]
    for cell in cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"])
            defaults = {}
            for statement in ast.parse(source).body:
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                    defaults[statement.targets[0].id] = ast.literal_eval(statement.value)
            return defaults
    raise ParameterError(f"notebook {notebook!r} has no cell tagged 'parameters'")


def _type_problem(name: str, value, default) -> str | None:
    if default is None or value is None:
        return None
    if isinstance(default, bool) != isinstance(value, bool):
        return f"{name} must be {type(default).__name__}, got {value!r}"
    if isinstance(default, float) and isinstance(value, int):
        return None
    if not isinstance(value, type(default)):
        return f"{name} must be {type(default).__name__} like the default {default!r}, got {value!r}"
    return None


def problems(notebook: str, values: Mapping) -> list[str]:
    """Every problem with `values` as parameters of `notebook` (empty list = fine)."""
    defaults = notebook_defaults(notebook)
    found = []
    for name, value in values.items():
        if name not in defaults:
            found.append(f"unknown parameter {name!r} for {notebook}: known are {sorted(defaults)} (a typo?)")
            continue
        problem = _type_problem(name, value, defaults[name])
        if problem is None and name in RULES:
            problem = RULES[name](name, value)
        if problem:
            found.append(problem)
    return (found + auto_dtype_problems(notebook, values) + tree_problems(values) + batch_problems(values)
            + vllm_problems(values) + recipe_problems(values))


def recipe_problems(values: Mapping) -> list[str]:
    """04 chooses among several training recipes by their learning curves: more than one needs a curve."""
    recipes = values.get("training_recipes")
    if isinstance(recipes, list) and len(recipes) > 1 and values.get("learning_curve_prompts") == 0:
        return [f"training_recipes: {len(recipes)} recipes are chosen among by their learning curves, which "
                "learning_curve_prompts: 0 turns off: set learning_curve_prompts >= 1, or keep one recipe"]
    return []


def tree_problems(values: Mapping) -> list[str]:
    """The draft tree is sized by the picker, from its calibration prompts, and cost-sized proposals (prompt
    lookup, the hybrid, suffix decoding) by the T(n) it measures: both need the picker."""
    found = []
    if values.get("tree_nodes") and not values.get("picker_prompts"):
        found.append(f"tree_nodes: {values['tree_nodes']} needs the draft picker, which sizes the draft tree from its "
                     "calibration prompts: set picker_prompts >= 1, or tree_nodes: 0 (no trees)")
    if values.get("cost_sized") and "picker_prompts" in values and not values["picker_prompts"]:  # 02's picker
        found.append("cost_sized: true needs the draft picker, which measures the target's T(n) that prompt lookup's, "
                     "the hybrid's and suffix decoding's proposals are cut by: set picker_prompts >= 1, or "
                     "cost_sized: false")
    return found


def vllm_problems(values: Mapping) -> list[str]:
    """03's vLLM part runs beside llama.cpp's AR loop, the baseline of its engines part, on that part's prompts;
    vLLM's n-gram speculation proposes prompt_lookup_k tokens (03 and 05)."""
    found = []
    if values.get("vllm") and values.get("engines") is False:
        found.append("vllm: true runs beside the engines part (its llama.cpp baseline, prompts and the kit's fastest "
                     "configuration): set engines: true, or vllm: false")
    prompts, engine_prompts = values.get("vllm_prompts"), values.get("engine_prompts")
    if values.get("vllm") and isinstance(prompts, int) and isinstance(engine_prompts, int) and prompts > engine_prompts:
        found.append(f"vllm_prompts = {prompts} exceeds engine_prompts = {engine_prompts}: vLLM runs on the first of the "
                     "engines part's prompts, beside the kit's rows there; lower vllm_prompts or raise engine_prompts")
    if values.get("vllm") and "ngram" in (values.get("vllm_methods") or []) and values.get("prompt_lookup_k") == 0:
        found.append("vllm_methods: ngram proposes prompt_lookup_k tokens, which is 0: set prompt_lookup_k >= 1, or "
                     "drop ngram from vllm_methods")
    return found


def batch_problems(values: Mapping) -> list[str]:
    """Batches are cut from the prompt set: every batch size must divide the prompt count, so that each
    size decodes the same prompts."""
    sizes, prompts = values.get("batch_sizes"), values.get("num_prompts")
    if not isinstance(sizes, list) or not isinstance(prompts, int) or _batch_sizes("batch_sizes", sizes):
        return []
    bad = [size for size in sizes if prompts % size]
    if bad:
        return [f"batch_sizes: {bad} do not divide num_prompts = {prompts} (each batch size must decode the same "
                f"prompts): make num_prompts a multiple of {max(sizes)}, or drop those batch sizes"]
    return []


# The notebooks whose `dtype` may be "auto" (every other dtype of the kit says what it compares: 03's
# unquantized reference, 04's fp32 CLLM, whose Jacobi must equal its AR).
AUTO_DTYPE_NOTEBOOKS = ("01_baseline", "02_speculative", "05_batch")


def auto_dtype_problems(notebook: str, values: Mapping) -> list[str]:
    """'auto' picks among torch's CPU paths (`models.dense_path`): only where a notebook lets it, on a CPU."""
    found = []
    if values.get("dtype") == "auto" and notebook not in AUTO_DTYPE_NOTEBOOKS:
        found.append(f"dtype 'auto' is for notebooks {', '.join(AUTO_DTYPE_NOTEBOOKS)}; {notebook} needs a dtype it "
                     "names (bfloat16, float32, ...)")
    for name in ("dtype", "reference_dtype"):
        if values.get(name) == "auto" and values.get("device", "cpu") != "cpu":
            found.append(f"{name} 'auto' chooses among torch's CPU paths, but device is {values['device']!r}: "
                         "give a dtype, or device 'cpu'")
    return found


def pair_problems(values: Mapping) -> list[str]:
    """A draft must share the target's tokenizer (loads the two tokenizers, not the weights)."""
    target, draft = values.get("target"), values.get("draft")
    if not target or not draft or target == draft:
        return []
    try:
        models.check_same_tokenizer(models.load_tokenizer(target), models.load_tokenizer(draft), target, draft)
    except (ValueError, OSError, RuntimeError) as error:
        return [str(error)]
    return []


def validate(notebook: str, values: Mapping) -> None:
    found = problems(notebook, values)
    if found:
        raise ParameterError(f"bad parameters for {notebook}:\n- " + "\n- ".join(found))


def load_yaml(path: str | Path) -> dict:
    """A parameter file as a dict, with a clear error for unreadable YAML."""
    path = Path(path)
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ParameterError(f"{path}: not valid YAML ({error})") from error
    if not isinstance(values, dict):
        raise ParameterError(f"{path}: expected a mapping of parameter: value, got {type(values).__name__}")
    return values


def profile_values(notebook: str, profile: str) -> dict:
    """The parameters `profile`'s file gives `notebook`, over the notebook's defaults, as papermill
    runs it (empty when the profile has no file for it)."""
    path = PARAMS_DIR / profile / f"{notebook}.yaml"
    return {**notebook_defaults(notebook), **load_yaml(path)} if path.exists() else {}


def validate_notebook_globals(notebook: str, namespace: Mapping) -> dict:
    """Call from a notebook right after its parameters cell (papermill has injected the YAML);
    returns the parameter values, which the benchmark stores with every result row."""
    values = {name: namespace[name] for name in notebook_defaults(notebook) if name in namespace}
    validate(notebook, values)
    return values
