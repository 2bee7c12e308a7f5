"""Weight-only int8 / int4 Linear layers on torch's native CPU kernels (models.weight_only): each
kernel computes what its dequantized weights say, a whole tiny model agrees with its dequantized
copy, speculative decoding on a weight-only target is lossless against that target, and bad
settings are refused early."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec_lab import hardware
from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.decoders.candidates import DraftModelCandidates
from specdec_lab.models import cpu_kernels, quantize
from specdec_lab.models.cpu_kernels import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from specdec_lab.models import weight_bytes as models_weight_bytes
from tiny import tiny_llama

PROMPT = [1, 5, 9, 14, 3, 22, 7]


def dequantized_weight(layer) -> torch.Tensor:
    if isinstance(layer, Int8WeightOnlyLinear):
        return layer.weight_int8.float() * layer.scales.float()[:, None]
    # unpack through the kernel itself: x = identity gives W^T row by row
    eye = torch.eye(layer.in_features)
    bias = 0 if layer.bias is None else layer.bias.float()
    return (layer(eye) - bias).T


@pytest.mark.parametrize("bits", [8, 4])
def test_kernel_matches_dequantized_weights_in_fp32(bits):
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 48, bias=True)
    layer = Int8WeightOnlyLinear(linear, torch.float32) if bits == 8 else Int4WeightOnlyLinear(linear, torch.float32, 32)
    x = torch.randn(2, 5, 128)
    if bits == 8:
        reference = x @ dequantized_weight(layer).T + linear.bias
    else:  # the reference grid computed in Python, not read back through the kernel
        q, scale, zero = cpu_kernels.int4_quantize(linear.weight.data, 32)
        reference = x @ cpu_kernels.int4_dequantize(q, scale, zero, 32).T + linear.bias
    out = layer(x)
    assert out.shape == (2, 5, 48)
    torch.testing.assert_close(out, reference, atol=1e-4, rtol=1e-4)
    # and the quantization error itself is what 8 / 4 bits allow, not a garbled layout
    error = (dequantized_weight(layer) - linear.weight).abs().max().item()
    assert error < (0.003 if bits == 8 else 0.02) * 1.0, error


def test_int4_grid_is_exact_for_weights_already_on_a_4_bit_grid():
    """GGUF Q4_K groups of 32 lie on such a grid (scale * q + min): re-quantizing them loses nothing
    when every group spans its 16 levels."""
    torch.manual_seed(0)
    scale, low = torch.rand(8, 4, 1) + 0.1, torch.randn(8, 4, 1)
    levels = torch.stack([torch.randperm(32) % 16 for _ in range(32)]).reshape(8, 4, 32).float()
    weight = (levels * scale + low).reshape(8, 128)
    q, s, z = cpu_kernels.int4_quantize(weight, 32)
    torch.testing.assert_close(cpu_kernels.int4_dequantize(q, s, z, 32), weight, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["int8-wo", "int4-wo"])
def test_weight_only_model_agrees_with_its_dequantized_copy(name):
    """fp32: the quantized model's logits equal those of a float model holding the dequantized
    weights; bf16 agrees within bf16 tolerance."""
    model = tiny_llama(0, vocab_size=64, hidden=64).eval()
    quantized = quantize.weight_only(copy.deepcopy(model), name)
    layer = quantized.model.layers[0].mlp.up_proj
    assert isinstance(layer, Int8WeightOnlyLinear if name == "int8-wo" else Int4WeightOnlyLinear)
    assert isinstance(quantized.lm_head, Int8WeightOnlyLinear)  # the LM head stays int8
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for (path, module), (_, original) in zip(quantized.named_modules(), reference.named_modules()):
            if isinstance(module, (Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
                original.weight.copy_(dequantized_weight(module))
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(quantized(ids).logits, reference(ids).logits, atol=1e-4, rtol=1e-4)
        bf16 = quantize.weight_only(copy.deepcopy(model).to(torch.bfloat16), name)
        layer = bf16.model.layers[0].mlp.up_proj
        assert (layer.scales_and_zeros if name == "int4-wo" else layer.scales).dtype == torch.bfloat16
        torch.testing.assert_close(bf16(ids).logits.float(), reference(ids).logits, atol=0.15, rtol=0.05)


def wide_layer(bits: int, dtype: torch.dtype, wide_rows: int | None, bias: bool = True):
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 48, bias=bias).to(dtype)
    return (Int8WeightOnlyLinear(linear, dtype, wide_rows=wide_rows) if bits == 8
            else Int4WeightOnlyLinear(linear, dtype, 32, wide_rows=wide_rows)), linear


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_wide_copy_holds_the_quantized_weights_not_the_original_ones(bits, dtype):
    """The copy is the same model in another kernel: its product equals the kernel's (fp32: to
    rounding; bf16: within bf16 tolerance), and it is not the unquantized weight the layer was made from."""
    layer, linear = wide_layer(bits, dtype, wide_rows=4)
    plain, _ = wide_layer(bits, dtype, wide_rows=None)
    assert plain.wide_weight is None and layer.wide_weight.dtype == dtype
    x = torch.randn(2, 3, 128).to(dtype)  # 6 rows: the copy's product
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.05, rtol=0.02)
    torch.testing.assert_close(layer(x).float(), plain(x).float(), **tolerance)
    torch.testing.assert_close(layer.wide_weight.float(), dequantized_weight(plain).float(), **tolerance)
    if dtype == torch.float32:  # on the quantized grid exactly, which is not the original weight (int8's is near it)
        torch.testing.assert_close(layer.wide_weight, dequantized_weight(plain), atol=1e-6, rtol=1e-6)
        assert (layer.wide_weight - linear.weight).abs().max() > 1e-5


@pytest.mark.parametrize("bits", [8, 4])
def test_a_wide_copy_takes_the_forwards_from_its_row_count_on_and_the_kernel_the_others(monkeypatch, bits):
    layer, _ = wide_layer(bits, torch.float32, wide_rows=5)
    used = []
    monkeypatch.setattr(cpu_kernels, "dense_product", lambda flat, weight: used.append(("copy", len(flat))) or flat @ weight.T)
    kernel = layer.kernel
    monkeypatch.setattr(layer, "kernel", lambda flat: used.append(("kernel", len(flat))) or kernel(flat))
    for rows in (1, 4, 5, 9):
        layer(torch.randn(rows, 128))
    # rows of every leading dimension count: a batch of 2 x 3 tokens is 6 rows
    layer(torch.randn(2, 3, 128))
    assert used == [("kernel", 1), ("kernel", 4), ("copy", 5), ("copy", 9), ("copy", 6)]


@pytest.mark.parametrize("kernel_s, wide_s, rows", [
    ([1, 2, 3, 4], [2, 3, 2, 3], 24),       # faster from 24 rows on
    ([1, 2, 3, 4], [0.5, 3, 2, 3], 24),     # a noisy win at 8 rows, then a loss, does not count
    ([1, 2, 3, 4], [2, 3, 4, 5], None),     # never faster: no copy
    ([2, 2, 3, 4], [1, 1, 1, 1], 8),        # faster everywhere
    ([1, 2, 3, 4], [2, 3, 2, 4], None),     # a tie at the widest is no win
])
def test_the_wide_copy_starts_where_it_is_faster_at_every_wider_width(kernel_s, wide_s, rows):
    assert cpu_kernels.first_faster_width([8, 16, 24, 32], kernel_s, wide_s) == rows


def test_every_layer_keeps_the_wide_copy_its_shape_measured_and_it_is_counted_in_the_weight_bytes(monkeypatch):
    measured = {}
    monkeypatch.setattr(cpu_kernels, "measured_wide_rows",
                        lambda bits, inputs, outputs, *args, **kwargs: measured.setdefault((bits, inputs, outputs), 8 + bits))
    model = tiny_llama(0, vocab_size=64, hidden=64).eval().to(torch.bfloat16)
    plain = quantize.weight_only(copy.deepcopy(model), "int4-wo")
    wide = quantize.weight_only(copy.deepcopy(model), "int4-wo", wide_copy=True)
    up, head = wide.model.layers[0].mlp.up_proj, wide.lm_head
    assert up.wide_rows == 12 and head.wide_rows == 16  # the int8 head's own measurement, not the int4 layers'
    assert (8, head.in_features, head.out_features) in measured
    assert plain.model.layers[0].mlp.up_proj.wide_rows is None and plain.lm_head.wide_rows is None
    assert models_weight_bytes(wide) > models_weight_bytes(plain)
    # the copies are memory, but a one-token step reads the quantized weights only: the bandwidth bound is unchanged
    assert hardware.bytes_read_per_token(wide) == hardware.bytes_read_per_token(plain)
    ids = torch.tensor([PROMPT * 3])  # 21 tokens: the prefill takes the copies
    with torch.no_grad():
        torch.testing.assert_close(wide(ids).logits.float(), plain(ids).logits.float(), atol=0.1, rtol=0.05)


def test_dtype_auto_keeps_a_wide_copy_and_an_explicit_quantization_does_not(folders, monkeypatch):
    from specdec_lab.models import dense_path
    from specdec_lab.models.load import load as load_model

    monkeypatch.setattr(cpu_kernels, "measured_wide_rows", lambda *args, **kwargs: 16)
    monkeypatch.setattr(dense_path, "resolve", lambda spec, dtype, quantization, **kwargs: ("bfloat16", "int4-wo"))
    auto = load_model(str(folders["target"]), dtype="auto")
    explicit = load_model(str(folders["target"]), dtype="bfloat16", quantization="int4-wo")
    assert auto.model.model.layers[0].mlp.up_proj.wide_rows == 16
    assert explicit.model.model.layers[0].mlp.up_proj.wide_rows is None


@pytest.mark.parametrize("name", ["int8-wo", "int4-wo"])
def test_weight_only_weights_are_smaller(load, name):
    assert load("target", name).weight_bytes < 0.6 * load("target", "none").weight_bytes


@pytest.mark.parametrize("target_name, draft_name", [("int4-wo", "none"), ("none", "int4-wo"), ("int8-wo", "int4-wo")])
def test_speculative_on_weight_only_models_equals_the_targets_own_greedy(load, target_name, draft_name):
    """Lossless means equal to that target backend's own greedy output (fp32)."""
    target = load("target", target_name).model
    expected = autoregressive.generate(target, PROMPT, 24, stop_ids=[]).tokens
    for draft in (load("draft", draft_name).model, load("target", "int8-wo" if target_name != "int8-wo" else "int4-wo").model):
        result = speculative.generate(target, DraftModelCandidates(draft, 4), PROMPT, 24, stop_ids=[])
        assert result.tokens == expected


@pytest.mark.parametrize("kwargs, message", [
    (dict(bits=3), r"bits must be one of \(8, 4\), got 3"),
    (dict(bits=4, group_size=48), r"group_size must be one of .*got 48"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cpu_kernels.quantize_weight_only(tiny_llama(0), **kwargs)


def test_int4_refuses_a_layer_it_cannot_group():
    model = torch.nn.Sequential(torch.nn.Linear(40, 8))
    with pytest.raises(ValueError, match=r"layer '0' has 40 inputs.*int8-wo"):
        cpu_kernels.quantize_weight_only(model, 4)


def test_weight_only_on_cuda_is_refused_before_loading():
    with pytest.raises(ValueError, match=r"int4-wo.*CPU kernels.*device='cpu'"):
        quantize.check_quantization("int4-wo", torch.bfloat16, "cuda")


def test_weight_left_linear_computes_what_nn_linear_computes():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True)
    fast = copy.deepcopy(linear)
    weight = fast.weight
    cpu_kernels.use_weight_left_linear(torch.nn.Sequential(fast))
    assert type(fast) is cpu_kernels.WeightLeftLinear and fast.weight is weight  # the class changes, not the weights
    for shape in ((1, 64), (1, 1, 64), (2, 64), (2, 7, 64)):  # one row (torch.mv) and several (W @ x^T)
        x = torch.randn(*shape)
        torch.testing.assert_close(fast(x), linear(x), atol=1e-5, rtol=1e-5)
    assert fast.state_dict().keys() == linear.state_dict().keys()


@pytest.mark.parametrize("dot_products", [True, False])
def test_weight_left_linear_in_bf16_with_and_without_bf16_dot_products(monkeypatch, dot_products):
    """On a CPU without bf16 dot products, many rows are multiplied in fp32 (one rounding, at the
    end); one row and a few rows, and every row where the CPU has them, stay in bf16. Each path must
    compute what nn.Linear computes, up to bf16 rounding."""
    monkeypatch.setattr(cpu_kernels, "BF16_DOT_PRODUCTS", dot_products)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    fast = copy.deepcopy(linear)
    cpu_kernels.use_weight_left_linear(torch.nn.Sequential(fast))
    for rows in (1, 3, cpu_kernels.FP32_PRODUCT_ROWS, 2 * cpu_kernels.FP32_PRODUCT_ROWS + 1):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        exact = torch.nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
        out = fast(x)
        assert out.dtype == torch.bfloat16 and out.shape == (rows, 48)
        torch.testing.assert_close(out.float(), exact, atol=0.05, rtol=0.02)
        assert out.is_contiguous()  # a transposed view would send every multi-token attention to the math path
        widened = cpu_kernels.widen_to_fp32(x)
        assert widened == (not dot_products and rows >= cpu_kernels.FP32_PRODUCT_ROWS)
        if widened:  # fp32 products rounded once, then the bias added in bf16: to the last bit
            product = torch.nn.functional.linear(x.float(), linear.weight.float()).to(torch.bfloat16)
            torch.testing.assert_close(out, product + linear.bias, atol=0, rtol=0)


@pytest.mark.parametrize("flags, has", [(["avx2"], False), (["avx512f", "avx512_bf16", "avx2"], True),
                                        (["amx_bf16", "avx2"], True), (None, True)])
def test_bf16_dot_products_come_from_the_cpu_flags(flags, has):
    assert cpu_kernels.has_bf16_dot_products(flags) is has


def test_bf16_cpu_loads_use_weight_left_linear_and_fp32_does_not(folders):
    from specdec_lab import models

    bf16 = models.load(folders["target"], dtype="bfloat16")
    assert type(bf16.model.model.layers[0].mlp.up_proj) is cpu_kernels.WeightLeftLinear
    assert type(models.load(folders["target"], dtype="float32").model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    plain = models.load(folders["target"], dtype="bfloat16", fast_cpu_linear=False)
    assert type(plain.model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(bf16.model(ids).logits, plain.model(ids).logits, atol=0.1, rtol=0.05)


def test_linear_kernel_table_times_every_backend():
    from specdec_lab import hardware

    table = hardware.linear_kernel_table(64, 96, rows=(1, 3), dtype=torch.float32, repeats=2, bandwidth=1e10)
    assert len(table) == 4 * 2 and (table.ms > 0).all() and (table.fraction_of_bandwidth > 0).all()
    stored = table.groupby("kernel").weight_mb.first()
    assert stored["int4 weight-only (groups of 32)"] < stored["int8 weight-only"] < stored["fp32 W @ x^T (kit)"]


def test_a_tied_output_head_becomes_int8_and_the_embedding_table_stays():
    """Qwen2.5's LM head is its embedding table. Quantizing the head unties it: the head reads int8,
    the embedding keeps its float table (one row looked up per token), and the bytes a token reads
    count the head, not the embedding table."""
    from specdec_lab import hardware

    model = tiny_llama(0, vocab_size=64, hidden=64)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    embedding = model.get_input_embeddings().weight.detach().clone()
    quantized = quantize.weight_only(model, "int4-wo")
    assert isinstance(quantized.lm_head, Int8WeightOnlyLinear)
    assert torch.equal(quantized.get_input_embeddings().weight, embedding)
    head_bytes = sum(t.numel() * t.element_size() for t in quantized.lm_head.buffers())
    read = hardware.bytes_read_per_token(quantized)
    assert read == models_weight_bytes(quantized) - embedding.numel() * embedding.element_size()
    assert read >= head_bytes


@pytest.mark.parametrize("values, fitted", [
    ([1.0, 1.1, 1.3], [1.0, 1.1, 1.3]),  # already in order: unchanged
    ([2.0, 1.0, 1.2, 1.5], [1.4, 1.4, 1.4, 1.5]),  # a noisy T(1) above T(2), T(3): pooled with them
    ([1.0, 1.5, 1.1, 2.0], [1.0, 1.3, 1.3, 2.0]),  # a dip in the middle
    ([1.5, 2.0, 0.1], [1.2, 1.2, 1.2]),  # the pooled pair falls below the value before it: pool again
])
def test_nondecreasing_pools_the_values_that_break_the_order(values, fitted):
    assert hardware.nondecreasing(values) == pytest.approx(fitted)


def test_interleaved_costs_hold_their_ratio_while_the_machine_slows_down(monkeypatch):
    """A scripted machine on which the draft's step costs 1 s and the target's 2 s, and every forward costs twice as
    much from the 11th one on (a drift, as a 2-vCPU machine's). Timed in turn, each model sees the slow half alike and
    the ratio stays 0.5; timed one model after the other (a curve each), the draft's forwards all run fast and the
    target's all slow, and the ratio comes out 0.25. Also catches a warm-up round kept in the medians."""
    draft, target = tiny_llama(0), tiny_llama(1)
    cost = {id(draft): 1.0, id(target): 2.0}
    now, forwards = [0.0], [0]

    def scripted(model):
        forward = model.forward

        def timed_forward(*args, **kwargs):
            if kwargs["input_ids"].shape[1] == 1:  # the timed one-token steps (the prefix prefill is free)
                forwards[0] += 1
                now[0] += cost[id(model)] * (2 if forwards[0] >= 11 else 1)
            return forward(*args, **kwargs)
        monkeypatch.setattr(model, "forward", timed_forward)

    scripted(draft)
    scripted(target)
    monkeypatch.setattr(hardware, "clock", lambda device: now[0])
    draft_ms, target_ms = hardware.interleaved_forward_costs([(draft, 1), (target, 1)], prefix_tokens=4, repeats=8)
    assert draft_ms / target_ms == pytest.approx(0.5)
    assert draft_ms == pytest.approx(1500)  # 4 fast and 4 slow timed steps: the warm-up round's fast one is left out


@pytest.mark.parametrize("repeats", [0, -1, 2.5, True])
def test_interleaved_costs_refuse_a_count_of_rounds_that_is_not_a_positive_integer(repeats):
    with pytest.raises(ValueError, match="repeats"):
        hardware.interleaved_forward_costs([(tiny_llama(0), 1)], prefix_tokens=4, repeats=repeats)


def test_cost_curve_ratios_come_from_the_nondecreasing_fit(monkeypatch):
    """A scripted clock: T(1) = 3 s above T(2) = 1 s and T(4) = 2 s (the warm-up round takes 1 s each).
    Ratios to the raw T(1) would be 1/3 and 2/3; the fit pools all three at 2 s."""
    elapsed = iter([1, 1, 1, 2, 3, 1])  # per forward in the order run: n = 4, 1, 2 in each round
    now = [0.0]

    def clock(device, started=[False]):
        started[0] = not started[0]
        if not started[0]:  # an end: the forward took the next scripted time
            now[0] += next(elapsed)
        return now[0]

    monkeypatch.setattr(hardware, "clock", clock)
    curve = hardware.forward_cost_curve(tiny_llama(), [4, 1, 2], prefix_tokens=8, repeats=1)
    assert curve.n.tolist() == [1, 2, 4]
    assert curve.ms.tolist() == pytest.approx([3000, 1000, 2000])
    assert curve.ms_fit.tolist() == pytest.approx([2000, 2000, 2000])
    assert curve.relative_to_one.tolist() == pytest.approx([1.0, 1.0, 1.0])
