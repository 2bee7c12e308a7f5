"""Names of dtypes and devices, and what they resolve to: shared by loading and quantizing (which
import this, not each other)."""

from __future__ import annotations

import torch

DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16,
}
DTYPE_LABELS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DEVICES = ("cpu", "cuda", "auto")


def path_label(dtype: str | torch.dtype, quantization: str = "none") -> str:
    """'bf16', 'fp32', 'bf16 int4-wo': how tables and sentences name a torch path (dtype and
    weight-only quantization)."""
    return DTYPE_LABELS[parse_dtype(dtype)] + ("" if quantization == "none" else f" {quantization}")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def device_type(device: str) -> str:
    """'cpu' or 'cuda': what `device='auto'` resolves to on this machine."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
