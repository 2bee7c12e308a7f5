"""int4 weight-only layers built from a GGUF file's own Q4_K blocks, without re-quantizing.

"int4-wo" re-quantizes weights that were dequantized from the zoo's Q4_K_M file. This module reads
the file's Q4_K blocks instead and hands their 4-bit quants, scales and minimums straight to torch's
int4 CPU kernel (`cpu_kernels.Int4WeightOnlyLinear`, groups of 32).

Q4_K (ggml), one super-block of 256 weights of a row = 144 bytes:
    d, dmin   fp16 each                 (4 bytes)
    sc, m     8 x 6-bit sub-block scales and mins, packed in 12 bytes
    q         256 x 4-bit quants in 0..15 (128 bytes)
    weight of sub-block j (32 consecutive weights) = d * sc[j] * q - dmin * m[j]
The kernel computes, per group of 32 inputs of a row, w = (q - 8) * scale + zero, so
    scale = d * sc[j],  zero = 8 * scale - dmin * m[j]
gives w = scale * q - dmin * m[j]: one Q4_K sub-block is one kernel group, q unchanged.

Exactness: the kernel takes `scales_and_zeros` in the activations' dtype only (fp32 with fp32, bf16
with bf16, fp16 with fp16). In fp32, scale = d * sc is exact (11 + 6 significant bits), and so is
zero = 8 * scale - dmin * m unless d and dmin are orders of magnitude apart; then the kernel's
weights equal gguf-py's dequantizer bit for bit (all 52.3M Q4_K weights of the zoo's Qwen2.5-Coder
0.5B), else within an ulp. In bf16, scale and zero are rounded to bf16 (8 significant bits): exact
up to that rounding, an error of the size of the bf16 rounding of the weights themselves.

Tensors of other types (Q6_K and Q5_0 in Q4_K_M files, Q4_1 in the SmolLM2 file, F32, ...) do not
fit 4 bits exactly: their layers are re-quantized from the loaded weights like "int4-wo", and counted
in the report. The LM head is int8 per row, as in "int4-wo".
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from specdec_lab.models.cpu_kernels import (
    Int4WeightOnlyLinear, Int8WeightOnlyLinear, check_shapes, int4_dequantize, measured_wide_rows,
)

logger = logging.getLogger(__name__)

WEIGHTS_PER_SUPER_BLOCK = 256
SUB_BLOCKS = 8
GROUP_SIZE = 32  # one Q4_K sub-block = one group of the int4 kernel
Q4_K_BLOCK_BYTES = 2 + 2 + 12 + WEIGHTS_PER_SUPER_BLOCK // 2  # d, dmin, packed sc/m, packed q: 144


class Int4Grid(NamedTuple):
    """What the int4 kernel layer stores: w = (q - 8) * scale + zero per group of 32 inputs of a row.
    q int32 [rows, columns] in 0..15; scale, zero float32 [rows, columns / 32]."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor


# --- Q4_K blocks -> (q, scale, zero) --------------------------------------------------------------

def split_q4_k_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[n, 144] uint8 super-blocks -> d [n] fp32, dmin [n] fp32, packed scales [n, 12], packed quants [n, 128]."""
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != Q4_K_BLOCK_BYTES:
        raise ValueError(f"Q4_K super-blocks must be uint8 [n, {Q4_K_BLOCK_BYTES}], got {blocks.dtype} "
                         f"{list(blocks.shape)}")
    blocks = np.ascontiguousarray(blocks)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32)
    return d, dmin, blocks[:, 4:16], blocks[:, 16:]


def unpack_q4_k_scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes per super-block -> 6-bit sc [n, 8] and m [n, 8] (ggml's get_scale_min_k4).

    bytes 0-3:  sc[0..3] in the low 6 bits; the top 2 bits are bits 4-5 of sc[4..7]
    bytes 4-7:  m[0..3]  in the low 6 bits; the top 2 bits are bits 4-5 of m[4..7]
    bytes 8-11: bits 0-3 of sc[4..7] in the low nibble, bits 0-3 of m[4..7] in the high nibble
    """
    packed = packed.astype(np.uint8)
    scale_bytes, min_bytes, low_nibble_bytes = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales_0_3 = scale_bytes & 0x3F
    mins_0_3 = min_bytes & 0x3F
    scales_4_7 = (low_nibble_bytes & 0x0F) | ((scale_bytes >> 6) << 4)
    mins_4_7 = (low_nibble_bytes >> 4) | ((min_bytes >> 6) << 4)
    return np.concatenate([scales_0_3, scales_4_7], axis=1), np.concatenate([mins_0_3, mins_4_7], axis=1)


def unpack_q4_k_quants(packed: np.ndarray) -> np.ndarray:
    """128 packed bytes per super-block -> 256 quants in 0..15 [n, 256], in weight order.

    The bytes come in 4 runs of 32: run r holds sub-block 2r in its low nibbles and sub-block
    2r + 1 in its high nibbles (not consecutive weights in one byte)."""
    runs = packed.reshape(-1, 4, 1, 32)
    nibbles = np.concatenate([runs & 0x0F, runs >> 4], axis=2)  # [n, run, low/high, 32]
    return nibbles.reshape(-1, WEIGHTS_PER_SUPER_BLOCK)


def q4_k_to_int4_grid(blocks: np.ndarray, rows: int, columns: int) -> Int4Grid:
    """A Q4_K tensor's bytes ([rows, columns / 256 * 144] uint8, one row per output) -> its exact
    Int4Grid (scale and zero in fp32)."""
    if columns % WEIGHTS_PER_SUPER_BLOCK:
        raise ValueError(f"a Q4_K row holds whole super-blocks of {WEIGHTS_PER_SUPER_BLOCK} weights, got "
                         f"{columns} columns")
    d, dmin, packed_scales, packed_quants = split_q4_k_blocks(blocks.reshape(-1, Q4_K_BLOCK_BYTES))
    sc, m = unpack_q4_k_scales_and_mins(packed_scales)
    scale = d[:, None] * sc.astype(np.float32)  # [n, 8]: exact in fp32 (11 + 6 bits)
    minimum = dmin[:, None] * m.astype(np.float32)  # what the sub-block subtracts: w = scale * q - minimum
    zero = 8 * scale - minimum  # the kernel's (q - 8) * scale + zero = scale * q - minimum
    groups = columns // GROUP_SIZE
    q = unpack_q4_k_quants(packed_quants).astype(np.int32).reshape(rows, columns)
    return Int4Grid(torch.from_numpy(q), torch.from_numpy(scale.reshape(rows, groups)),
                    torch.from_numpy(zero.reshape(rows, groups)))


def undo_llama_rope_permutation(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the rows of each head of a llama attn_q / attn_k weight
    (for its rotary embedding layout); transformers reverses it when loading (LlamaTensorProcessor).
    Only whole rows move, so the same permutation applies to q, scale and zero alike."""
    half_head = rows.shape[0] // heads // 2
    return rows.reshape(heads, half_head, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


# --- GGUF file -> per HF weight name ----------------------------------------------------------------

def _field(reader, key: str):
    if key not in reader.fields:
        raise ValueError(f"GGUF file has no metadata field {key!r}: is it a model file written by llama.cpp?")
    return reader.fields[key].contents()


def hf_to_gguf_names(reader, hf_weight_names) -> dict[str, str | None]:
    """'model.layers.0.self_attn.q_proj.weight' -> 'blk.0.attn_q.weight' (None when the file's
    architecture has no such tensor), with gguf-py's own name table, as transformers does."""
    import gguf

    architecture = _field(reader, "general.architecture")
    block_count = int(_field(reader, f"{architecture}.block_count"))
    arch = next((key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ValueError(f"gguf {gguf.__version__} does not know the architecture {architecture!r}: "
                         "upgrade the gguf package or use quantization='int4-wo'")
    name_map = gguf.get_tensor_name_map(arch, block_count)
    return {name: name_map.get_name(name, try_suffixes=(".weight", ".bias")) for name in hf_weight_names}


def _rope_heads(reader, gguf_name: str) -> int | None:
    """Heads whose rows transformers un-permutes in this tensor (llama q / k only), else None."""
    architecture = _field(reader, "general.architecture")
    if architecture != "llama" or not gguf_name.endswith((".attn_q.weight", ".attn_k.weight")):
        return None
    heads = int(_field(reader, "llama.attention.head_count"))
    if gguf_name.endswith(".attn_k.weight") and "llama.attention.head_count_kv" in reader.fields:
        heads = int(_field(reader, "llama.attention.head_count_kv"))
    return heads


def read_int4_grid(reader, tensor) -> Int4Grid | None:
    """One tensor of the file (a `reader.tensors` entry, or None): its exact Int4Grid, [out, in]
    like torch, in transformers' row order; None when the file stores it in another type."""
    import gguf

    if tensor is None or tensor.tensor_type != gguf.GGMLQuantizationType.Q4_K or len(tensor.shape) != 2:
        return None  # another type, or not a matrix (a Linear weight is one)
    columns, rows = (int(n) for n in tensor.shape)  # ggml lists the fastest (input) dimension first
    grid = q4_k_to_int4_grid(np.asarray(tensor.data), rows, columns)
    heads = _rope_heads(reader, tensor.name)
    if heads is not None:
        grid = Int4Grid(*(undo_llama_rope_permutation(part, heads) for part in grid))
    return grid


def read_int4_grids(reader, hf_weight_names) -> dict[str, Int4Grid | None]:
    """Per HF weight name: `read_int4_grid` of its tensor (None: another type, or not in the file).
    Every grid at once (4 bytes a weight): for a few layers; `quantize_from_gguf` reads one at a time."""
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    return {hf_name: read_int4_grid(reader, tensors.get(gguf_name))
            for hf_name, gguf_name in hf_to_gguf_names(reader, hf_weight_names).items()}


# --- swap a loaded model's Linear layers ------------------------------------------------------------

@dataclass
class Int4GgufReport:
    """Which layers came exactly from the file's Q4_K blocks, which were re-quantized (by GGUF type)."""

    exact_layers: int = 0
    exact_parameters: int = 0
    requantized_layers: Counter = field(default_factory=Counter)  # GGUF type -> layers
    requantized_parameters: Counter = field(default_factory=Counter)  # GGUF type -> weights
    lm_head: str = "none"

    def __str__(self) -> str:
        others = ", ".join(f"{layers} {kind} ({self.requantized_parameters[kind] / 1e6:.1f}M weights)"
                           for kind, layers in sorted(self.requantized_layers.items())) or "none"
        return (f"{self.exact_layers} layers ({self.exact_parameters / 1e6:.1f}M weights) int4 exactly from Q4_K; "
                f"re-quantized to int4: {others}; LM head: {self.lm_head}")


def _check_grid_matches(name: str, grid: Int4Grid, weight: torch.Tensor) -> None:
    """The loaded weights are the file's values rounded to the model's dtype (bf16: 2^-9 relative),
    so a gap of a quarter quant step or more means a wrong name mapping or row order, not rounding."""
    if tuple(grid.q.shape) != tuple(weight.shape):
        raise ValueError(f"GGUF tensor for {name!r} has shape {list(grid.q.shape)}, the model's weight "
                         f"{list(weight.shape)}: the file is not the one this model was loaded from")
    gap = (int4_dequantize(*grid, GROUP_SIZE) - weight.float()).abs()
    quant_step = grid.scale.abs().repeat_interleave(GROUP_SIZE, dim=1)
    allowed = 2 ** -7 * weight.float().abs() + 0.25 * quant_step
    if (gap > allowed).any():
        raise ValueError(f"GGUF Q4_K weights for {name!r} differ from the loaded weights by up to "
                         f"{gap.max().item():.3g}: the GGUF -> HF name mapping or row order is wrong for this "
                         "architecture; use quantization='int4-wo'")


@torch.no_grad()
def quantize_from_gguf(model: nn.Module, gguf_path: str | Path, lm_head_bits: int = 8,
                       wide_copy: bool = False) -> Int4GgufReport:
    """Replace every nn.Linear of `model` in place: int4 from the file's own Q4_K blocks where the
    file has them, int4 re-quantized from the loaded weights elsewhere, the LM head int8 (as
    "int4-wo" does). `model` must have been loaded from this very file (or its converted folder).
    `wide_copy`: as in `cpu_kernels.quantize_weight_only`."""
    import gguf

    check_shapes(model, 4, GROUP_SIZE)
    dtype = next(model.parameters()).dtype
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    body = [f"{name}.weight" for name, module in linears.items() if module is not output]
    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    gguf_names = hf_to_gguf_names(reader, body)
    types = {name: tensors[gguf_name].tensor_type.name if gguf_name in tensors else "absent"
             for name, gguf_name in gguf_names.items()}  # of the layers re-quantized, for the report

    report = Int4GgufReport()
    for name, linear in linears.items():
        rows = (measured_wide_rows(lm_head_bits if linear is output else 4, linear.in_features, linear.out_features,
                                   dtype, GROUP_SIZE) if wide_copy else None)
        weight_name = f"{name}.weight"
        if linear is output:
            replacement = (Int8WeightOnlyLinear(linear, dtype, wide_rows=rows) if lm_head_bits == 8
                           else Int4WeightOnlyLinear(linear, dtype, GROUP_SIZE, wide_rows=rows))
            report.lm_head = f"int{lm_head_bits} re-quantized"
        elif (grid := read_int4_grid(reader, tensors.get(gguf_names[weight_name]))) is not None:
            _check_grid_matches(name, grid, linear.weight)
            replacement = Int4WeightOnlyLinear(linear, dtype, GROUP_SIZE, grid=grid, wide_rows=rows)
            report.exact_layers += 1
            report.exact_parameters += linear.weight.numel()
        else:
            replacement = Int4WeightOnlyLinear(linear, dtype, GROUP_SIZE, wide_rows=rows)
            report.requantized_layers[types[weight_name]] += 1
            report.requantized_parameters[types[weight_name]] += linear.weight.numel()
        parent_name, _, child_name = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child_name, replacement)
    logger.info("int4-gguf %s: %s", Path(gguf_path).name, report)
    return report
