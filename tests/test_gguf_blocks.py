"""int4w from a GGUF's own Q4_K blocks (asymagent/modeling/gguf_blocks.py): the file's grid exactly, int8 where the file keeps more bits.

A tiny GGUF is written in the test (random but valid Q4_K / Q6_K blocks, gguf's own writer) and
a tiny llama's layers are given its tensors' dequantised values, as transformers' GGUF loader
gives them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asymagent.modeling.gguf_blocks import GgufBlocks
from asymagent.modeling.weight_only import LowBitWeight, op_missing, quantize_weights
from conftest import make_tiny_llama

pytestmark = pytest.mark.skipif(op_missing("int4w") is not None, reason=f"int4w: {op_missing('int4w')}")


def _blocks(kind: str, n_out: int, n_in: int, seed: int) -> np.ndarray:
    """Raw rows [n_out, n_in / 256 * bytes] of random valid blocks (finite fp16 d / dmin)."""
    rng = np.random.default_rng(seed)
    per = {"Q4_K": 144, "Q6_K": 210}[kind]
    raw = rng.integers(0, 256, size=(n_out * n_in // 256, per), dtype=np.uint8)
    d = rng.uniform(2e-4, 8e-4, size=(raw.shape[0], 1)).astype(np.float16).view(np.uint8)  # [B, 2]
    if kind == "Q4_K":
        raw[:, 0:2] = d
        raw[:, 2:4] = rng.uniform(2e-4, 8e-4, size=(raw.shape[0], 1)).astype(np.float16).view(np.uint8)
    else:  # Q6_K: d is the block's last two bytes
        raw[:, -2:] = d
    return raw.reshape(n_out, -1)


def _dequantized(raw: np.ndarray, kind: str) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]).copy())  # [N, K] float32


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A GGUF holding a Q4_K [512, 256] tensor and a Q6_K [256, 512] one; their raw rows."""
    from gguf import GGMLQuantizationType, GGUFWriter

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    tensors = {"blk.0.ffn_gate.weight": ("Q4_K", _blocks("Q4_K", 512, 256, 1)),
               "blk.0.ffn_down.weight": ("Q6_K", _blocks("Q6_K", 256, 512, 2))}
    writer = GGUFWriter(str(path), "llama")
    for name, (kind, raw) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, {name: _dequantized(raw, kind) for name, (kind, raw) in tensors.items()}


def _model(weights: dict, dtype: torch.dtype):
    """A one-layer llama of hidden 256 whose gate and down projections hold the file's weights."""
    model = make_tiny_llama(hidden=256, layers=1, heads=4, kv_heads=2)  # intermediate 512
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(weights["blk.0.ffn_gate.weight"])
        mlp.down_proj.weight.copy_(weights["blk.0.ffn_down.weight"])
    return model.to(dtype).eval()


def _weights_of(lowbit: LowBitWeight, n_in: int) -> torch.Tensor:
    """[N, K] float32: the weights the kernel multiplies by (its product with the identity)."""
    return lowbit.matmul(torch.eye(n_in, dtype=lowbit.dtype)).float().T


def test_the_q4k_layer_takes_the_files_grid_exactly(gguf_file):
    path, weights = gguf_file
    model = _model(weights, torch.float32)
    report = quantize_weights(model, "int4w", gguf=str(path))
    assert report.sources == {"Q4_K": 1, "int8: Q6_K": 1, "min/max": 5, "int8: head": 1}
    gate = model.model.layers[0].mlp.gate_proj
    want = weights["blk.0.ffn_gate.weight"]  # [512, 256]
    got = _weights_of(gate.lowbit, 256)
    exact_err = float((got - want).abs().max())
    # the same weights rounded again by min/max (what int4w does without the file)
    minmax_err = float((_weights_of(LowBitWeight.make("int4w", want, torch.float32), 256) - want).abs().max())
    assert exact_err <= 1e-6 * float(want.abs().max())
    assert minmax_err > 100 * max(exact_err, 1e-12)
    assert model.model.layers[0].mlp.down_proj.lowbit.kind == "int8w"


def test_bf16_weights_find_their_grid(gguf_file):
    path, weights = gguf_file
    model = _model(weights, torch.bfloat16)
    report = quantize_weights(model, "int4w", gguf=str(path))
    assert report.sources["Q4_K"] == 1
    x = torch.randn(3, 256).to(torch.bfloat16)
    gate = model.model.layers[0].mlp.gate_proj
    ref = x.float() @ weights["blk.0.ffn_gate.weight"].T  # [3, 512]
    err = (gate(x).float() - ref).abs().max() / ref.abs().max()
    assert float(err) < 0.02  # bf16 activations and scales only


def test_a_weight_not_from_the_file_is_not_found(gguf_file):
    path, weights = gguf_file
    blocks = GgufBlocks(path)
    w = weights["blk.0.ffn_gate.weight"]
    assert blocks.find(w).grid is not None
    assert blocks.find(w.flip(0)) is None  # rows permuted (llama's q/k on load): another fingerprint
    assert blocks.find(torch.randn(512, 256)) is None
    changed = w.clone()
    changed[7, 11] += 1.0  # same first and last rows, one value off: found, but no exact grid
    found = blocks.find(changed)
    assert found.type_name == "Q4_K" and found.grid is None


def test_without_the_file_int4w_rounds_every_layer(gguf_file):
    _, weights = gguf_file
    report = quantize_weights(_model(weights, torch.float32), "int4w")
    assert report.sources == {"min/max": 7, "int8: head": 1}
