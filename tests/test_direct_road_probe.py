"""The direct-road probe (evals/probes/direct_road.py) on a tiny bf16 Qwen2 whose down projections
are FloorLinear: both roads give the same logits, each forward is undone (every repeat sees the
same context), and the projections' kinds are counted. Its timings are a benchmark's, not asserted."""

from types import SimpleNamespace

import pytest
import torch

from asymagent.evals.probes.direct_road import _kinds, measure
from asymagent.kv.attention import use_gqa_attention
from asymagent.kv.lean_forward import attach
from asymagent.modeling.packed_linear import kernel_available, pack_linears
from conftest import floor_linear_downs, make_tiny_qwen2


@pytest.mark.skipif(kernel_available() is not None, reason=f"no packed bf16 kernel: {kernel_available()}")
def test_direct_road_probe_on_floor_linear_downs(monkeypatch):
    model = make_tiny_qwen2(hidden=128, heads=4, kv_heads=2, layers=2).to(torch.bfloat16)
    use_gqa_attention(model)
    assert pack_linears(model).packed > 0
    floor_linear_downs(model, monkeypatch)
    assert attach(model).fused
    assert _kinds(model) == {"PackedLinear": 2, "FloorLinear": 2}
    out = measure(SimpleNamespace(verifier=model), context=40, rows_list=[1, 3], repeats=2)
    assert set(out) == {"1", "3"}
    for figures in out.values():
        assert figures["same_logits"] is True
        assert figures["direct_ms"] > 0 and figures["general_ms"] > 0
