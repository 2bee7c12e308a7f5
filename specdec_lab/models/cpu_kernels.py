"""Linear layers for CPU decoding: the bf16 product in its faster order, and weight-only int8 /
int4 layers on torch's native CPU kernels.

Decoding one token reads every weight once and does little arithmetic with each, so on a CPU its
speed is set by how fast the weights stream through (see `hardware.roofline_tokens_per_second`).

- bf16 / fp16 (`WeightLeftLinear`): the same weights, computed as W @ x^T (one row: a
  matrix-vector product). On the 2-core Xeon this kit was built on, torch's x @ W^T for a few rows
  streams bf16 weights at about 10 GB/s, torch.mv and W @ x^T at 18-25 GB/s (1536 x 8960: 3.1 ms
  against 1.3 ms for one row, 2.2 against 1.1 ms for 8 rows).
  A CPU without bf16 dot-product instructions (no AVX-512 BF16, no AMX: the AVX2 AMD EPYC this kit
  also runs on) has no fast bf16 matrix product at all: torch's takes time in proportion to the rows
  (1536 x 8960: 1.6 ms for one row, 110 ms for 64, 420 ms for 256), and a 64-token prefill of the
  1.5B model took 44 s. There, from `FP32_PRODUCT_ROWS` rows on, the product is computed in fp32
  (weights widened on the fly: 49 and 88 ms for 64 and 256 rows; that prefill 6.4 s); fewer rows stay
  in bf16, where widening every weight would cost more than it saves.
- weight-only: storing the weights in 8 or 4 bits and widening them inside the matmul kernel reads
  2x or 4x fewer bytes than bf16; the activations, the KV cache, embeddings and norms stay in the
  model's dtype.

- int8: one symmetric scale per output row,   w = q * scale,            q in [-127, 127]
        kernel `aten._weight_int8pack_mm(x, q, scales)`
- int4: groups of `group_size` inputs per row,  w = (q - 8) * scale + zero, q in [0, 15]
        (zero = the group's minimum + 8 * scale: the affine "min/max" grid of tinygemm, which is also
        how GGUF's Q4_K stores a group of 32: a scale and a minimum)
        kernel `aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)`

The zoo's weights come from Q4_K_M GGUF files dequantized (to fp32 folders, loaded in bf16); int4
re-quantizes those values with each group's own min/max grid ("int4-wo"). A Q4_K group of 32 lies
on such a grid, but is recovered exactly only when the group uses its lowest and highest level and
in fp32 (the scales and zeros are kept in the activations' dtype). "int4-gguf" (`gguf_int4`) reads
the file's Q4_K blocks instead (an existing grid, `Int4WeightOnlyLinear(..., grid=...)`); tensors
the file stores otherwise (Q5_0, Q6_K: 32, 64 levels, which 4 bits cannot hold) are re-quantized.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_lab.machine import cpu_model

BITS = (8, 4)
GROUP_SIZES = (32, 64, 128, 256)  # what the int4 CPU kernel accepts
FP32_PRODUCT_ROWS = 32  # from here on, widening to fp32 beat torch's bf16 product on the AVX2 EPYC (43 vs 56 ms)


def has_bf16_dot_products(flags: list[str] | None) -> bool:
    """Whether a CPU with these flags multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX).
    Unknown flags (no /proc/cpuinfo) count as yes: the product then stays as torch computes it."""
    return flags is None or bool({"avx512_bf16", "amx_bf16"} & set(flags))


BF16_DOT_PRODUCTS = has_bf16_dot_products(cpu_model()["cpu_flags"])


class WeightLeftLinear(nn.Linear):
    """nn.Linear with the product taken as W @ x^T: the same weights, parameters and state dict,
    another kernel (see the module docstring for why). fp32 results equal nn.Linear's up to
    summation order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] == 1:
            out = torch.mv(self.weight, flat[0]).unsqueeze(0)
        elif widen_to_fp32(flat):
            out = (flat.float() @ self.weight.float().T).to(x.dtype)
        else:  # contiguous: a transposed view reaches attention with stride n and takes its math path
            out = (self.weight @ flat.T).T.contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def widen_to_fp32(flat: torch.Tensor) -> bool:
    """Whether a bf16 product over these rows is computed in fp32 (see the module docstring)."""
    return flat.dtype == torch.bfloat16 and flat.shape[0] >= FP32_PRODUCT_ROWS and not BF16_DOT_PRODUCTS


def use_weight_left_linear(model: nn.Module) -> nn.Module:
    """Turn every plain nn.Linear of `model` into a `WeightLeftLinear`, in place (the class alone
    changes: no weight is copied). Quantized layers (subclasses, other modules) are left alone."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = WeightLeftLinear
    return model


def int8_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale float32 [N]) with weight ~= q * scale[:, None], one scale per row."""
    weight = weight.float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int4_quantize(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [N, K] in 0..15, scale [N, K/g], zero [N, K/g]) with weight ~= (q - 8) * scale + zero
    per group of `group_size` consecutive inputs of a row."""
    rows, columns = weight.shape
    groups = weight.float().reshape(rows, columns // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(rows, columns), scale, low + 8 * scale


def int4_dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    rows, columns = q.shape
    groups = q.reshape(rows, columns // group_size, group_size).float()
    return ((groups - 8) * scale[..., None] + zero[..., None]).reshape(rows, columns)


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (q * scale).T + bias, computed by torch's int8 weight-only CPU kernel."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = int8_quantize(linear.weight.data)
        self.register_buffer("weight_int8", q)
        self.register_buffer("scales", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.data.to(dtype).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row scales"


class Int4WeightOnlyLinear(nn.Module):
    """y = x @ ((q - 8) * scale + zero).T + bias, groups of `group_size` inputs, computed by torch's
    int4 weight-only CPU kernel (weights packed two per byte in the kernel's own tile layout)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, group_size: int,
                 grid: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None):
        """`grid`: (q, scale, zero) to store as they are (e.g. a GGUF file's own Q4_K blocks, see
        `gguf_int4`) instead of re-quantizing `linear.weight`; `linear` then gives shape and bias."""
        super().__init__()
        self.in_features, self.out_features, self.group_size = linear.in_features, linear.out_features, group_size
        q, scale, zero = int4_quantize(linear.weight.data, group_size) if grid is None else grid
        self.register_buffer("weight_int4", torch._convert_weight_to_int4pack_for_cpu(q, 1))
        # the kernel's layout: [K / group_size, N, 2] holding (scale, zero) for every group and row
        self.register_buffer("scales_and_zeros", torch.stack([scale.T, zero.T], dim=-1).to(dtype).contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.data.to(dtype).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch._weight_int4pack_mm_for_cpu(flat, self.weight_int4, self.group_size,
                                                self.scales_and_zeros.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 groups of {self.group_size}")


def check_shapes(model: nn.Module, bits: int, group_size: int) -> None:
    """Refuse, naming the layer, a Linear whose input size the int4 kernel cannot group."""
    if bits not in BITS:
        raise ValueError(f"weight-only bits must be one of {BITS}, got {bits}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {GROUP_SIZES}, got {group_size}")
    if bits == 4:
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and module.in_features % group_size:
                raise ValueError(f"layer {name!r} has {module.in_features} inputs, not a multiple of the int4 "
                                 f"group size {group_size}: use quantization 'int8-wo', or a group size that "
                                 f"divides {module.in_features}")


@torch.no_grad()
def quantize_weight_only(model: nn.Module, bits: int, group_size: int = 32, lm_head_bits: int = 8) -> nn.Module:
    """Replace every nn.Linear of `model` in place: decoder layers with `bits`, the LM head with
    `lm_head_bits` (llama.cpp's Q4_K_M files, too, keep the output matrix at higher precision: a
    4-bit vocabulary projection costs agreement for little speed). Embeddings and norms are kept."""
    check_shapes(model, bits, group_size)
    dtype = next(model.parameters()).dtype
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def replacement(linear: nn.Linear) -> nn.Module:
        layer_bits = lm_head_bits if linear is output else bits
        if layer_bits == 4:
            return Int4WeightOnlyLinear(linear, dtype, group_size)
        return Int8WeightOnlyLinear(linear, dtype)

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, child_name, replacement(child))
    return model
