"""Quantization backends: one list of names, what each stores and computes, whether it can run
here, and how it is applied while loading (`load.load(spec, quantization=...)`).

- "none": the weights in `dtype` as loaded. For the offline zoo models these are 4-bit GGUF
  weights (Q4_K_M, Q4_1) dequantized to bf16/fp32: a Q4-quality model held in 16/32-bit.
- "nf4", "fp4": bitsandbytes 4-bit weights (blockwise NF4 / FP4), activations in `dtype`.
- "int8": bitsandbytes LLM.int8 (int8 weights; activation columns with outliers kept in fp16).
- "torch-int8": torch.ao dynamic quantization: int8 Linear weights, activations quantized per
  call, everything else float32 (a CPU backend).
- "int8-wo", "int4-wo": weight-only int8 (per row) / int4 (groups of 32) Linear weights on torch's
  native CPU kernels, activations and everything else in `dtype` (see `weight_only`; the LM head is
  int8 in both).
- "int4-gguf": int4 weight-only from the GGUF file's own Q4_K blocks (`gguf_int4`: no
  re-quantization; tensors the file stores in other types are re-quantized as in "int4-wo"). Needs a
  zoo name or a .gguf path.

A speculative `Pair` names a target quantization and a draft one ("none/nf4"), or the target's
own quantized copy as its draft ("none/self-torch-int8").
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab.models import zoo
from specdec_lab.models.dtypes import DTYPE_LABELS, device_type, parse_dtype

QUANTIZATIONS = ("none", "nf4", "fp4", "int8", "torch-int8", "int8-wo", "int4-wo", "int4-gguf")
BITSANDBYTES_QUANTIZATIONS = ("nf4", "fp4", "int8")  # "int8" = LLM.int8 (int8 weights, fp16 outliers)
LABELS = {"none": None, "nf4": "nf4", "fp4": "fp4", "int8": "LLM.int8", "torch-int8": "torch-int8",
          "int8-wo": "int8 weight-only", "int4-wo": "int4 weight-only", "int4-gguf": "int4 weight-only (GGUF Q4_K)"}
WEIGHT_ONLY_BITS = {"int8-wo": 8, "int4-wo": 4, "int4-gguf": 4}  # torch's native CPU kernels (see weight_only)
INT4_GROUP_SIZE = 32
SELF = "self-"  # a draft spelled "self-<name>" is the target's own copy quantized with <name>


def check_name(name: str) -> str:
    if name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}: use one of {QUANTIZATIONS} "
                         "(int8 = bitsandbytes LLM.int8, torch-int8 = torch.ao dynamic int8, int8-wo / int4-wo = "
                         "torch's weight-only CPU kernels, int4-gguf = int4-wo from a GGUF's own Q4_K blocks)")
    return name


def dtype_for(quantization: str, dtype: str) -> str:
    """The dtype a variant is loaded in: torch-int8's kernels take float32 activations only."""
    return "float32" if check_name(quantization) == "torch-int8" else dtype


def label(quantization: str, dtype: str) -> str:
    """Short plot label: the dtype for "none", else the quantization's name."""
    return LABELS[check_name(quantization)] or DTYPE_LABELS[parse_dtype(dtype)]


def describe(quantization: str, dtype: str, device: str) -> str:
    """One honest sentence on what is stored and what is computed in which precision."""
    compute = DTYPE_LABELS[parse_dtype(dtype_for(quantization, dtype))]
    if quantization == "none":
        return f"weights and compute in {compute}"
    if quantization in ("nf4", "fp4"):
        text = (f"4-bit {quantization} weights (blocks of 64, one absmax each), dequantized for every matmul; "
                f"compute dtype {compute}")
        if device == "cpu" and _cpu_4bit_kernel_is_bf16():
            text += (" (this CPU has AVX512-BF16: bitsandbytes' fused CPU kernel computes the 4-bit matmuls "
                     "in bf16 whatever the compute dtype)")
        return text
    if quantization == "int8":
        return (f"LLM.int8: int8 weights, activations quantized per row to int8, outlier columns (|x| > 6) "
                f"in fp16; the rest of the model (attention, norms, KV cache) in {compute}")
    if quantization == "int4-gguf":
        return (f"weight-only int4 read from the GGUF file's own Q4_K blocks (groups of 32, scale and zero in "
                f"{compute}; tensors stored in other types re-quantized to int4; LM head int8), widened inside "
                f"torch's CPU matmul kernel; activations, embeddings, norms, attention and the KV cache in {compute}")
    if quantization in WEIGHT_ONLY_BITS:
        layout = ("int8, one scale per output row" if quantization == "int8-wo"
                  else f"int4, groups of {INT4_GROUP_SIZE} with a scale and a zero each")
        return (f"weight-only {layout} (LM head int8), widened inside torch's CPU matmul kernel; activations, "
                f"embeddings, norms, attention and the KV cache in {compute}; with dtype auto, forwards over many "
                f"rows (a prefill) multiply by a {compute} copy of the same quantized weights, from the row count "
                f"measured faster on this CPU")
    return ("torch.ao dynamic int8: int8 Linear weights, activations quantized per call; embeddings, norms, "
            "attention and the KV cache in fp32")


def _cpu_4bit_kernel_is_bf16() -> bool:
    try:
        from bitsandbytes.functional import has_avx512bf16
        return bool(has_avx512bf16())
    except Exception:  # no bitsandbytes or no CPU library: the generic path keeps the compute dtype
        return False


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


def check_quantization(quantization: str, dtype: torch.dtype, device: str, double_quant: bool = False,
                       gguf: bool = False, spec: str | None = None) -> None:
    """Refuse, before anything loads, the combinations that cannot run or would carry a false label
    (`spec`, when given: the model, which 'int4-gguf' needs to have a GGUF file)."""
    check_name(quantization)
    if quantization == "int4-gguf" and spec is not None and not (spec in zoo.ZOO or str(spec).endswith(".gguf")):
        raise ValueError(f"quantization 'int4-gguf' reads the int4 weights from the Q4_K blocks of the model's GGUF "
                         f"file, but model {spec!r} is neither a zoo name nor a .gguf path, so it has none: use "
                         "quantization='int4-wo' (re-quantizes the loaded weights), or give a zoo name or .gguf file")
    if double_quant and quantization not in ("nf4", "fp4"):
        raise ValueError(f"double_quant applies to 4-bit quantization (nf4, fp4) only, not {quantization!r}: "
                         "set double_quant=False")
    if quantization == "torch-int8":
        if device_type(device) != "cpu":
            raise ValueError(f"quantization 'torch-int8' (torch.ao dynamic int8) has CPU kernels only, but device is "
                             f"{device!r}: use device='cpu', or 'int8' (LLM.int8) / 'nf4' (bitsandbytes) on CUDA")
        if dtype != torch.float32:
            raise ValueError(f"quantization 'torch-int8' multiplies float32 activations with int8 weights (its kernels "
                             f"take float32 only), so dtype {dtype} would be a false label: use dtype='float32'")
    if quantization in WEIGHT_ONLY_BITS and device_type(device) != "cpu":
        raise ValueError(f"quantization {quantization!r} uses torch's weight-only CPU kernels, but device is "
                         f"{device!r}: use device='cpu', or 'nf4' / 'int8' (bitsandbytes) on CUDA")
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
        if device_type(device) not in supported:
            raise ValueError(f"bitsandbytes {bitsandbytes.__version__} cannot run {quantization!r} on "
                             f"{device_type(device)!r} (it supports {sorted(supported)}): use a CUDA device, "
                             "upgrade bitsandbytes (CPU support from 0.46), or use 'torch-int8' on CPU")



def check_quantizations(names: Sequence[str], device: str, dtype: str, double_quant: bool = False) -> None:
    """`check_quantization` for several names, each in the dtype it is loaded in."""
    for name in names:
        check_quantization(check_name(name), parse_dtype(dtype_for(name, dtype)), device,
                           double_quant and name in ("nf4", "fp4"))


def bitsandbytes_config(quantization: str, compute_dtype: torch.dtype, double_quant: bool = False):
    """bitsandbytes config for 'nf4' / 'fp4' / 'int8' (LLM.int8); None otherwise."""
    if check_name(quantization) not in BITSANDBYTES_QUANTIZATIONS:
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


def weight_only(model: torch.nn.Module, quantization: str, gguf_path=None, wide_copy: bool = False) -> torch.nn.Module:
    """'int8-wo' / 'int4-wo': every Linear's weights to int8 / int4 for torch's CPU kernels;
    'int4-gguf': int4 from the Q4_K blocks of `gguf_path`, the file the model was loaded from (its
    report, exact vs re-quantized layers, is kept as `model.int4_gguf_report`). `wide_copy`: the
    layers keep their quantized weights widened too, for forwards over many rows
    (`cpu_kernels.quantize_weight_only`)."""
    from specdec_lab.models.cpu_kernels import quantize_weight_only

    if quantization == "int4-gguf" and gguf_path is None:
        raise ValueError("quantization 'int4-gguf' needs the model's GGUF file: pass gguf_path= (load() finds it "
                         "for a zoo name or a .gguf path)")
    if next(model.parameters()).dtype == torch.float32:
        warnings.warn(f"{quantization!r} with float32 activations takes torch's reference path (about 30x slower a "
                      "matmul than bf16 on the CPU this kit was built on): fine for exactness tests, not for timing; "
                      "use dtype='bfloat16'", stacklevel=3)
    if quantization == "int4-gguf":
        from specdec_lab.models.gguf_int4 import quantize_from_gguf

        model.int4_gguf_report = quantize_from_gguf(model, gguf_path, wide_copy=wide_copy)
        print(f"int4-gguf from {Path(gguf_path).name}: {model.int4_gguf_report}")  # which path each layer took
        return model
    return quantize_weight_only(model, WEIGHT_ONLY_BITS[quantization], group_size=INT4_GROUP_SIZE, wide_copy=wide_copy)


def own_float_tensors(model: torch.nn.Module) -> None:
    """Copy the float tensors a quantized CPU model kept from the checkpoint into memory it owns.

    A float32 load maps the safetensors file and its tensors (here: the embeddings, which are not
    quantized) point into that mapping, which keeps the whole file mapped; every page read while
    quantizing the other weights then stays resident and counts in the process's RSS (for a 1.5B
    model, gigabytes of weights the quantized model no longer uses). The copy releases the mapping.
    """
    with torch.no_grad():
        buffers = [tensor for name, tensor in model.named_buffers() if not name.endswith("wide_weight")]  # made here
        for tensor in [*model.parameters(), *buffers]:
            if tensor.is_floating_point() and tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()



@torch.inference_mode()
def warm_up(model) -> None:
    """One tiny forward pass, so one-time work is done before anything is measured: bitsandbytes'
    CPU 4-bit layers repack their weights on first use (a transient of hundreds of MB that would
    otherwise land in the first generation's peak memory)."""
    model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device))


# --- speculative pairs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """A target quantization and a draft: the draft model quantized, or the target's own copy."""

    target: str
    draft: str
    self_draft: bool = False

    def draft_label(self, dtype: str) -> str:
        return ("self " if self.self_draft else "") + label(self.draft, dtype)

    def name(self, dtype: str) -> str:
        who = "self" if self.self_draft else "draft"
        return f"target {label(self.target, dtype)} · {who} {label(self.draft, dtype)}"


def parse_pair(text: str) -> Pair:
    """'none/nf4' (target unquantized, draft nf4), 'nf4/none', 'none/self-torch-int8' (the target
    drafts for itself from its own torch-int8 copy, gpt-fast style)."""
    if not isinstance(text, str) or text.count("/") != 1:
        raise ValueError(f"bad speculative pair {text!r}: write 'target_quantization/draft_quantization', e.g. "
                         f"'none/nf4' or 'none/self-torch-int8'; quantizations: {QUANTIZATIONS}")
    target, draft = text.split("/")
    self_draft = draft.startswith(SELF)
    draft = draft[len(SELF):] if self_draft else draft
    for part in (target, draft):
        if part not in QUANTIZATIONS:
            raise ValueError(f"bad speculative pair {text!r}: {part!r} is not a quantization, use one of "
                             f"{QUANTIZATIONS}")
    if self_draft and draft == target:
        raise ValueError(f"bad speculative pair {text!r}: a self-draft must be quantized differently from the "
                         "target (it would accept every token and save nothing)")
    return Pair(target, draft, self_draft)


def check_pairs(pairs: Sequence[str], device: str, dtype: str = "bfloat16") -> list[Pair]:
    """Parse every pair and refuse, before any model loads, one that cannot load on `device`."""
    parsed = [parse_pair(p) for p in pairs]
    check_quantizations(sorted({q for pair in parsed for q in (pair.target, pair.draft)}), device, dtype)
    return parsed
