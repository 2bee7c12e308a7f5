"""T(n) of a published architecture on this machine, without its weights: the model built from its
config with random weights, timed by `hardware.forward_cost_curve`.

A forward's cost depends on the shapes, the dtype and the kernels, not on the weights' values, so a
machine that cannot download a model (no hub, or a GPU lent without network) can still measure what
verifying n tokens at once costs there against decoding one. It says nothing about acceptance: that
needs the real weights (the notebooks). The models run as transformers builds them: on a CPU, without the
kit's own Linear layers and paths (`models.load`, `dtype: auto`), so there the notebooks' curves are the ones to read.

    python -m specdec_lab.shape_costs --device cuda --dtype bfloat16 --out results/shape-costs
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import pandas as pd
import torch

from specdec_lab.hardware import forward_cost_curve
from specdec_lab.models.dtypes import parse_dtype

# The architecture fields of each model's config.json on the hub (the rest are the classes' defaults).
SHAPES: dict[str, tuple[str, dict]] = {
    "gemma-2-2b-it": ("Gemma2Config", dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096)),
    "gemma-2-9b-it": ("Gemma2Config", dict(
        vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096)),
    "qwen2.5-coder-0.5b-instruct": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2.5-coder-1.5b-instruct": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, tie_word_embeddings=True)),
}
N_VALUES = (1, 2, 4, 8, 16, 32, 64, 128)


def random_model(shape: str, dtype: str = "bfloat16", device: str = "cpu"):
    """The model of `shape` (a key of SHAPES) with random weights, built on `device` directly (a 9B model
    is not initialised on the CPU first), in eval mode."""
    import transformers

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: known are {sorted(SHAPES)}")
    config_class, fields = SHAPES[shape]
    config = getattr(transformers, config_class)(**fields)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype))
    return model.eval()


def machine_name(device: str) -> str:
    """The GPU's name on cuda; the CPU's model name otherwise."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    from specdec_lab.machine import cpu_model

    return cpu_model()["cpu_model"] or platform.processor()


def shape_cost_curves(shapes=tuple(SHAPES), dtype: str = "bfloat16", device: str = "cpu", n_values=N_VALUES,
                      prefix_tokens: int = 200, repeats: int = 10) -> pd.DataFrame:
    """One `forward_cost_curve` per shape (ms and T(n) / T(1) by n), one model in memory at a time."""
    curves = []
    for shape in shapes:
        model = random_model(shape, dtype, device)
        curve = forward_cost_curve(model, n_values, prefix_tokens=prefix_tokens, repeats=repeats)
        curves.append(curve.assign(model=shape, dtype=dtype, machine=machine_name(device)))
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return pd.concat(curves, ignore_index=True)


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="folder for shape_costs.csv")
    args = parser.parse_args(argv)
    curves = shape_cost_curves(args.shapes, args.dtype, args.device, repeats=args.repeats)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(curves.pivot(index="n", columns="model", values="ms").round(2).to_string())
        print(curves.pivot(index="n", columns="model", values="relative_to_one").round(3).to_string())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        curves.to_csv(args.out / "shape_costs.csv", index=False)
    return curves


if __name__ == "__main__":
    main()
