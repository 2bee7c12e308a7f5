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
- weight-only with a wide copy (`wide_rows`): torch's weight-only kernels are the fastest for a few
  rows, but over many (a prefill, a wide batch) they cost 2-3x a bf16 product (1536 x 8960 on the
  AVX-512 BF16 AMD EPYC: 168 rows 19.8 ms in int4, 6.6 ms in bf16; one row 0.22 against 0.81 ms).
  A layer can keep its quantized weights widened once to the model's dtype beside them, the same
  values (the same model, not the unquantized one), and multiply by that copy from `wide_rows` rows on.
  vLLM's AWQ layers do the same on GPUs for long inputs: dequantize, then a dense product. The row
  count is measured per layer shape on this CPU (`measured_wide_rows`); where the kernel is never
  slower, no copy is kept. The copy costs memory: every weight once more in the model's dtype.

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

import functools
import time

import torch
from torch import nn

from specdec_lab.machine import cpu_model

BITS = (8, 4)
GROUP_SIZES = (32, 64, 128, 256)  # what the int4 CPU kernel accepts
FP32_PRODUCT_ROWS = 32  # from here on, widening to fp32 beat torch's bf16 product on the AVX2 EPYC (43 vs 56 ms)
# the row counts at which a weight-only layer's kernel and its wide copy are timed against each other
WIDE_ROW_GRID = (8, 16, 24, 32, 48, 64)
# a layer's outputs beyond this many are left out of the timing: both products take time in proportion to the
# outputs, so a vocabulary head's 152k rows cost seconds to time and cross over where a slice of them does
WIDE_TIMED_OUTPUTS = 16384


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


def dense_product(flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """flat @ weight^T over many rows: torch's own product, in fp32 where the CPU has no bf16 one."""
    if widen_to_fp32(flat):
        return (flat.float() @ weight.float().T).to(flat.dtype)
    return torch.nn.functional.linear(flat, weight)


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
    return groups.sub_(8).mul_(scale[..., None]).add_(zero[..., None]).reshape(rows, columns)  # in place: a copy less


class WeightOnlyLinear(nn.Module):
    """What the int8 and int4 layers share: the bias, and the wide copy (see the module docstring)
    that forwards over `wide_rows` rows or more multiply by instead of calling the kernel."""

    wide_rows: int | None = None

    def keep_wide_copy(self, weight: torch.Tensor, rows: int | None) -> None:
        """Keep `weight` (this layer's quantized weights, widened) for forwards over `rows` rows or more."""
        self.wide_rows = rows
        self.register_buffer("wide_weight", None if rows is None else weight.contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.wide_rows is not None and flat.shape[0] >= self.wide_rows:
            out = dense_product(flat, self.wide_weight.to(x.dtype))
        else:
            out = self.kernel(flat)
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def wide_repr(self) -> str:
        return "" if self.wide_rows is None else f", a {self.wide_weight.dtype} copy from {self.wide_rows} rows"


class Int8WeightOnlyLinear(WeightOnlyLinear):
    """y = x @ (q * scale).T + bias, computed by torch's int8 weight-only CPU kernel."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, wide_rows: int | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = int8_quantize(linear.weight.data)
        self.register_buffer("weight_int8", q)
        self.register_buffer("scales", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.data.to(dtype).clone())
        self.keep_wide_copy((q.float() * self.scales.float()[:, None]).to(dtype) if wide_rows else None, wide_rows)

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(flat, self.weight_int8, self.scales.to(flat.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row scales{self.wide_repr()}"


class Int4WeightOnlyLinear(WeightOnlyLinear):
    """y = x @ ((q - 8) * scale + zero).T + bias, groups of `group_size` inputs, computed by torch's
    int4 weight-only CPU kernel (weights packed two per byte in the kernel's own tile layout)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, group_size: int,
                 grid: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, wide_rows: int | None = None):
        """`grid`: (q, scale, zero) to store as they are (e.g. a GGUF file's own Q4_K blocks, see
        `gguf_int4`) instead of re-quantizing `linear.weight`; `linear` then gives shape and bias."""
        super().__init__()
        self.in_features, self.out_features, self.group_size = linear.in_features, linear.out_features, group_size
        q, scale, zero = int4_quantize(linear.weight.data, group_size) if grid is None else grid
        self.register_buffer("weight_int4", torch._convert_weight_to_int4pack_for_cpu(q, 1))
        # the kernel's layout: [K / group_size, N, 2] holding (scale, zero) for every group and row
        self.register_buffer("scales_and_zeros", torch.stack([scale.T, zero.T], dim=-1).to(dtype).contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.data.to(dtype).clone())
        # the copy from the scales and zeros as stored (in `dtype`), as the kernel reads them
        wide = None
        if wide_rows:
            stored_scale, stored_zero = self.scales_and_zeros.float().permute(2, 1, 0)  # each [N, K / group_size]
            wide = int4_dequantize(q, stored_scale, stored_zero, group_size).to(dtype)
        self.keep_wide_copy(wide, wide_rows)

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(flat, self.weight_int4, self.group_size,
                                                 self.scales_and_zeros.to(flat.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 groups of {self.group_size}{self.wide_repr()}")


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


def wide_copy_bytes(model: nn.Module) -> int:
    """Bytes the weight-only layers' wide copies hold (memory that a one-token step does not read)."""
    return sum(module.wide_weight.numel() * module.wide_weight.element_size() for module in model.modules()
               if isinstance(module, WeightOnlyLinear) and module.wide_weight is not None)


def first_faster_width(widths: list[int], kernel_s: list[float], wide_s: list[float]) -> int | None:
    """The fewest rows from which the wide copy is faster than the kernel at every timed width
    (a crossing the timing noise makes twice counts from the last one); None if it is not
    faster at the widest."""
    chosen = None
    for width, kernel, wide in reversed(list(zip(widths, kernel_s, wide_s))):
        if wide >= kernel:
            break
        chosen = width
    return chosen


@functools.cache
@torch.no_grad()
def measured_wide_rows(bits: int, in_features: int, out_features: int, dtype: torch.dtype, group_size: int = 32,
                       repeats: int = 5) -> int | None:
    """From how many rows a layer of this shape multiplies faster by a copy of its weights in `dtype`
    than by torch's weight-only kernel, on this CPU (`first_faster_width` over WIDE_ROW_GRID, medians
    of `repeats`, random weights: the time depends on the shape, not the values); None where the
    kernel stays faster. Measured once per process and shape (at most WIDE_TIMED_OUTPUTS outputs of it), in
    about a second for a 1.5B model's."""
    linear = nn.Linear(in_features, min(out_features, WIDE_TIMED_OUTPUTS), bias=False, dtype=dtype)
    largest = WIDE_ROW_GRID[-1]
    layer = (Int4WeightOnlyLinear(linear, dtype, group_size, wide_rows=largest) if bits == 4
             else Int8WeightOnlyLinear(linear, dtype, wide_rows=largest))

    def median_s(product, rows: int) -> float:
        x = torch.randn(rows, in_features, dtype=dtype)
        product(x)  # kernels that repack on first use do it here
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            product(x)
            times.append(time.perf_counter() - start)
        return sorted(times)[repeats // 2]

    kernel_s = [median_s(layer.kernel, rows) for rows in WIDE_ROW_GRID]
    wide_s = [median_s(lambda x: dense_product(x, layer.wide_weight), rows) for rows in WIDE_ROW_GRID]
    return first_faster_width(list(WIDE_ROW_GRID), kernel_s, wide_s)


@torch.no_grad()
def quantize_weight_only(model: nn.Module, bits: int, group_size: int = 32, lm_head_bits: int = 8,
                         wide_copy: bool = False) -> nn.Module:
    """Replace every nn.Linear of `model` in place: decoder layers with `bits`, the LM head with
    `lm_head_bits` (llama.cpp's Q4_K_M files, too, keep the output matrix at higher precision: a
    4-bit vocabulary projection costs agreement for little speed). Embeddings and norms are kept.
    `wide_copy`: every layer keeps its weights widened too, for forwards over the rows from which that is
    measured faster (`measured_wide_rows`). The LM head sees many rows where a step verifies many tokens (a
    tree, a batch): the 1.5B's int8 head over 40 rows took 152 ms on the AVX-512 BF16 EPYC, its copy 45 ms."""
    check_shapes(model, bits, group_size)
    dtype = next(model.parameters()).dtype
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def replacement(linear: nn.Linear) -> nn.Module:
        layer_bits = lm_head_bits if linear is output else bits
        rows = measured_wide_rows(layer_bits, linear.in_features, linear.out_features, dtype, group_size) if wide_copy else None
        if layer_bits == 4:
            return Int4WeightOnlyLinear(linear, dtype, group_size, wide_rows=rows)
        return Int8WeightOnlyLinear(linear, dtype, wide_rows=rows)

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, child_name, replacement(child))
    return model
