"""shape_costs: the hand-typed architectures are the published models' (their parameter counts, built on the meta
device), and a curve of a tiny shape has every n, T(1) = 1 and the machine's name."""

from __future__ import annotations

import pytest

from specdec_lab import shape_costs

# parameters of each model as published (the model cards' sizes, to three digits)
PUBLISHED = {"gemma-2-2b-it": 2.61e9, "gemma-2-9b-it": 9.24e9,
             "qwen2.5-coder-0.5b-instruct": 0.494e9, "qwen2.5-coder-1.5b-instruct": 1.54e9}


@pytest.mark.parametrize("shape", sorted(shape_costs.SHAPES))
def test_each_shape_has_its_published_parameter_count(shape):
    model = shape_costs.random_model(shape, "float32", "meta")  # shapes only: no memory, no time
    assert sum(parameter.numel() for parameter in model.parameters()) == pytest.approx(PUBLISHED[shape], rel=5e-3)


def test_a_tiny_shapes_curve_has_every_n_from_one(monkeypatch):
    monkeypatch.setitem(shape_costs.SHAPES, "tiny-gemma-2", ("Gemma2Config", dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=512)))
    curves = shape_costs.shape_cost_curves(["tiny-gemma-2"], "float32", "cpu", n_values=(1, 2, 4), prefix_tokens=8,
                                           repeats=2)
    assert curves.n.tolist() == [1, 2, 4] and curves.relative_to_one.iloc[0] == 1.0
    assert (curves.relative_to_one.diff().dropna() >= 0).all()  # the nondecreasing fit
    assert set(curves["model"]) == {"tiny-gemma-2"} and curves.machine.iloc[0] == shape_costs.machine_name("cpu")


def test_an_unknown_shape_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown shape 'gemma-3'.*gemma-2-9b-it"):
        shape_costs.random_model("gemma-3")
