"""int4 weight-only layers from a GGUF file's own Q4_K blocks (models.gguf_int4): the 6-bit scale /
min unpacking of all 8 sub-blocks, (q, scale, zero) against gguf-py's reference dequantizer, the
int4 kernel with those grids, the GGUF -> HF names and llama's row permutation, a whole tiny GGUF
file swapped into a tiny model (exact layers and the fallback count), and the early errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from specdec_lab import models  # noqa: E402
from specdec_lab.models import cpu_kernels, gguf_int4, quantize  # noqa: E402
from specdec_lab.models.cpu_kernels import Int4WeightOnlyLinear, Int8WeightOnlyLinear  # noqa: E402
from tiny import tiny_llama  # noqa: E402

Q4_K = gguf.GGMLQuantizationType.Q4_K


# --- synthetic Q4_K blocks ------------------------------------------------------------------------

def random_q4_k_bytes(rows: int, columns: int, seed: int = 0, d_range=(1e-4, 2e-3),
                      dmin_range=(1e-4, 2e-3)) -> np.ndarray:
    """[rows, columns / 256 * 144] uint8: random scales, mins and quants, finite fp16 d and dmin
    (random bytes there could spell inf or NaN)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * columns // 256, 144), dtype=np.uint8)
    d = rng.uniform(*d_range, size=len(blocks)).astype(np.float16)
    dmin = (rng.uniform(*dmin_range, size=len(blocks)) * rng.choice([-1, 1], size=len(blocks))).astype(np.float16)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def reference_dequantize(row_bytes: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(row_bytes, Q4_K).copy())


def pack_scales_and_mins(sc: list[int], m: list[int]) -> np.ndarray:
    """llama.cpp's packing (quantize_row_q4_K_ref), written out independently of the module."""
    packed = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        packed[j + 4] = m[j] | ((m[j + 4] >> 4) << 6)
        packed[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4)
    return packed


# --- the math ---------------------------------------------------------------------------------------

def test_every_sub_block_scale_and_min_unpacks_from_its_six_bits():
    """Each of the 8 sub-blocks, every 6-bit value: sub-blocks 4-7 keep their high 2 bits in the top
    of bytes 0-7, so values >= 16 there are what a wrong unpacking gets wrong."""
    rng = np.random.default_rng(0)
    for value in range(64):
        for sub_block in range(8):
            sc = rng.integers(0, 64, size=8).tolist()
            m = rng.integers(0, 64, size=8).tolist()
            sc[sub_block], m[(sub_block + 3) % 8] = value, 63 - value
            got_sc, got_m = gguf_int4.unpack_q4_k_scales_and_mins(pack_scales_and_mins(sc, m)[None])
            assert got_sc[0].tolist() == sc and got_m[0].tolist() == m, (value, sub_block)


def test_scale_and_min_unpacking_agrees_with_gguf_py_on_random_bytes():
    packed = np.random.default_rng(1).integers(0, 256, size=(500, 12), dtype=np.uint8)
    sc, m = gguf_int4.unpack_q4_k_scales_and_mins(packed)
    reference_sc, reference_m = gguf.quants.Q4_K.get_scale_min(packed)
    np.testing.assert_array_equal(sc, reference_sc)
    np.testing.assert_array_equal(m, reference_m)


def test_grid_dequantizes_bit_for_bit_to_what_gguf_py_dequantizes():
    """(q - 8) * scale + zero = d * sc * q - dmin * m, with q in 0..15 and one group per Q4_K
    sub-block. scale = d * sc is exact in fp32, and so is zero = 8 * scale - dmin * m when d and
    dmin are within a factor 2^7 or so (17 significant bits each, 24 in fp32): then the one
    rounding left is the reference's own."""
    row_bytes = random_q4_k_bytes(rows=6, columns=768)
    grid = gguf_int4.q4_k_to_int4_grid(row_bytes, rows=6, columns=768)
    assert grid.q.shape == (6, 768) and grid.scale.shape == grid.zero.shape == (6, 24)
    assert grid.q.dtype == torch.int32 and int(grid.q.min()) >= 0 and int(grid.q.max()) <= 15
    assert torch.equal(cpu_kernels.int4_dequantize(*grid, 32), reference_dequantize(row_bytes))


def test_grid_is_within_an_ulp_of_gguf_py_when_dmin_is_far_smaller_than_d():
    """Then zero = 8 * scale - dmin * m needs more than fp32's 24 bits: one more rounding."""
    row_bytes = random_q4_k_bytes(rows=6, columns=768, d_range=(0.5, 1.0), dmin_range=(1e-4, 2e-4))
    grid = gguf_int4.q4_k_to_int4_grid(row_bytes, rows=6, columns=768)
    reference, ours = reference_dequantize(row_bytes), cpu_kernels.int4_dequantize(*grid, 32)
    ulp = torch.finfo(torch.float32).eps * (grid.zero.abs() + 8 * grid.scale.abs()).repeat_interleave(32, dim=1)
    assert ((ours - reference).abs() <= ulp).all(), (ours - reference).abs().max()
    assert not torch.equal(ours, reference)  # the case is real, not vacuous


def test_int4_kernel_with_the_grid_computes_x_times_the_reference_weights():
    torch.manual_seed(0)
    row_bytes = random_q4_k_bytes(rows=48, columns=512, seed=2)
    grid = gguf_int4.q4_k_to_int4_grid(row_bytes, rows=48, columns=512)
    weight = reference_dequantize(row_bytes)
    linear = torch.nn.Linear(512, 48, bias=True)
    x = torch.randn(2, 3, 512)
    expected = x @ weight.T + linear.bias.data
    layer = Int4WeightOnlyLinear(linear, torch.float32, 32, grid=grid)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-4)
    # bf16: the kernel takes bf16 scales and zeros with bf16 activations (rounded, 8 significant bits)
    layer = Int4WeightOnlyLinear(linear, torch.bfloat16, 32, grid=grid)
    out = layer(x.to(torch.bfloat16)).float()
    assert (out - expected).abs().max() < 0.02 * expected.abs().max()


# --- names and row order ----------------------------------------------------------------------------

HEADS, KV_HEADS = 4, 2  # tiny_llama


def write_tiny_gguf(path, architecture: str, tensors: dict[str, tuple[np.ndarray, object]]) -> str:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    for name, (data, raw_type) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_hf_names_map_to_gguf_names(tmp_path):
    path = write_tiny_gguf(tmp_path / "names.gguf", "qwen2", {})
    names = gguf_int4.hf_to_gguf_names(gguf.GGUFReader(path), [
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.embed_tokens.weight", "lm_head.weight", "model.layers.0.not_a_layer.weight"])
    assert names == {
        "model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
        "model.layers.0.self_attn.q_proj.bias": "blk.0.attn_q.bias",
        "model.layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
        "model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
        "model.embed_tokens.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
        "model.layers.0.not_a_layer.weight": None,
    }


@pytest.mark.parametrize("heads", [HEADS, KV_HEADS])
def test_llama_row_permutation_is_the_one_transformers_undoes(heads):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = np.arange(256 * 3, dtype=np.float32).reshape(256, 3)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(rows, heads, heads)
    ours = gguf_int4.undo_llama_rope_permutation(torch.from_numpy(rows), heads)
    np.testing.assert_array_equal(ours.numpy(), theirs)


# --- a whole tiny GGUF into a tiny model ------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """llama, hidden 256: q, k, down in Q4_K (q, k with llama.cpp's row order), up in F32, v in
    Q8_0, o and gate absent from the file; the LM head is int8 whatever the file says."""
    rng = np.random.default_rng(3)
    q4_k = {"blk.0.attn_q.weight": (256, 256), "blk.0.attn_k.weight": (128, 256), "blk.0.ffn_down.weight": (256, 512)}
    tensors = {name: (random_q4_k_bytes(rows, columns, seed=i), Q4_K)
               for i, (name, (rows, columns)) in enumerate(q4_k.items())}
    tensors["blk.0.ffn_up.weight"] = (rng.normal(0, 0.05, size=(512, 256)).astype(np.float32), None)
    v = rng.normal(0, 0.05, size=(128, 256)).astype(np.float32)
    tensors["blk.0.attn_v.weight"] = (gguf.quants.quantize(v, gguf.GGMLQuantizationType.Q8_0),
                                      gguf.GGMLQuantizationType.Q8_0)
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama", tensors)
    return path, {name: data for name, (data, _) in tensors.items()}


def transformers_order(gguf_name: str, row_bytes: np.ndarray) -> torch.Tensor:
    """What transformers loads for a Q4_K tensor: gguf-py's dequantizer, then its llama row order."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(config={"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS})
    weights = gguf.quants.dequantize(row_bytes, Q4_K)
    return torch.from_numpy(np.ascontiguousarray(processor.process(weights, gguf_name).weights))


def model_loaded_from(tiny_file):
    """A tiny llama holding the file's values where the file has them, as a load would."""
    _, tensors = tiny_file
    model = tiny_llama(0, vocab_size=64, layers=1, hidden=256)
    layer = model.model.layers[0]
    with torch.no_grad():
        for module, gguf_name in [(layer.self_attn.q_proj, "blk.0.attn_q.weight"),
                                  (layer.self_attn.k_proj, "blk.0.attn_k.weight"),
                                  (layer.mlp.down_proj, "blk.0.ffn_down.weight")]:
            module.weight.copy_(transformers_order(gguf_name, tensors[gguf_name]))
        layer.mlp.up_proj.weight.copy_(torch.from_numpy(tensors["blk.0.ffn_up.weight"]))
    return model


def test_file_grids_come_out_in_torch_layout_and_transformers_row_order(tiny_file):
    path, tensors = tiny_file
    grids = gguf_int4.read_int4_grids(gguf.GGUFReader(path), [
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight"])
    assert [name for name, grid in grids.items() if grid is None] == [
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight"]
    for hf_name, gguf_name in [("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"),
                               ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight"),
                               ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight")]:
        expected = transformers_order(gguf_name, tensors[gguf_name])
        torch.testing.assert_close(cpu_kernels.int4_dequantize(*grids[hf_name], 32), expected, atol=1e-7, rtol=0)


def test_model_swap_takes_q4_k_layers_exactly_and_counts_the_rest(tiny_file):
    path, _ = tiny_file
    model = model_loaded_from(tiny_file)
    reference = model_loaded_from(tiny_file)
    report = gguf_int4.quantize_from_gguf(model, path)
    assert (report.exact_layers, report.exact_parameters) == (3, 256 * 256 + 128 * 256 + 256 * 512)
    assert dict(report.requantized_layers) == {"F32": 1, "Q8_0": 1, "absent": 2}
    assert dict(report.requantized_parameters) == {"F32": 512 * 256, "Q8_0": 128 * 256,
                                                   "absent": 256 * 256 + 512 * 256}
    assert report.lm_head == "int8 re-quantized" and "3 layers" in str(report)
    layer = model.model.layers[0]
    assert all(isinstance(m, Int4WeightOnlyLinear) for m in (layer.self_attn.q_proj, layer.mlp.up_proj))
    assert isinstance(model.lm_head, Int8WeightOnlyLinear)
    # the exact layers compute with the file's weights (fp32: up to an ulp of the kernel's sum)
    x = torch.randn(3, 256)
    with torch.no_grad():
        for name in ("self_attn.q_proj", "self_attn.k_proj"):
            expected = x @ reference.model.layers[0].get_submodule(name).weight.T
            torch.testing.assert_close(layer.get_submodule(name)(x), expected, atol=1e-5, rtol=1e-4)
        logits = model(torch.tensor([[1, 5, 9, 14]])).logits
    assert torch.isfinite(logits).all()


def test_a_file_that_does_not_match_the_model_is_refused(tiny_file):
    """Rows in another order (as a missing llama un-permutation would give) fail the load-time check."""
    path, _ = tiny_file
    model = model_loaded_from(tiny_file)
    with torch.no_grad():
        q_proj = model.model.layers[0].self_attn.q_proj
        q_proj.weight.copy_(q_proj.weight.flip(0))
    with pytest.raises(ValueError, match=r"q_proj.*name mapping or row order.*int4-wo"):
        gguf_int4.quantize_from_gguf(model, path)


# --- wiring and early errors ------------------------------------------------------------------------

def test_int4_gguf_is_a_quantization_name():
    assert "int4-gguf" in quantize.QUANTIZATIONS and "int4-wo" in quantize.QUANTIZATIONS
    assert "Q4_K" in quantize.label("int4-gguf", "bfloat16")
    assert "Q4_K blocks" in quantize.describe("int4-gguf", "bfloat16", "cpu")


def test_a_model_without_a_gguf_file_is_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match=r"'int4-gguf'.*{}.*neither a zoo name nor a \.gguf.*'int4-wo'".format(
            tmp_path.name)):
        models.load(str(tmp_path), quantization="int4-gguf")  # an empty folder: refused before reading it
    with pytest.raises(ValueError, match=r"int4-gguf.*CPU kernels.*device='cpu'"):
        models.load("qwen2.5-coder-0.5b-instruct", quantization="int4-gguf", device="cuda")
    with pytest.raises(ValueError, match=r"int4-gguf.*gguf_path="):
        quantize.weight_only(tiny_llama(0, vocab_size=64, hidden=64), "int4-gguf")
    # a zoo name and a .gguf path pass the check (nothing is loaded)
    for spec in ("qwen2.5-coder-0.5b-instruct", "some/where/model.gguf"):
        quantize.check_quantization("int4-gguf", torch.bfloat16, "cpu", spec=spec)
