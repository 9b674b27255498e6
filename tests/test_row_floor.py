"""Row floors (asymagent/modeling/row_floor.py): one position, one score on whatever CPU runs the tests.

The floors are probed on this machine; these tests then check, on other random data than the
probe's, that a position gets the same bits alone (a decode) and inside a few-row forward (a
verify) through the engine's attention function and its packed linears, and on the embedded
verifier end to end (asymagent/evals/probes/position_bits.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from asymagent.kv import attention
from asymagent.kv.attention import ATTENTION_CANDIDATES, attention_floor
from asymagent.modeling.packed_linear import LINEAR_CANDIDATES, linear_floor
from asymagent.modeling.row_floor import pad_rows
from asymagent.modeling.cpu_dtype import cpu_bf16_support


def test_pad_rows_repeats_cyclically_up_to_the_floor():
    x = torch.arange(6).reshape(1, 3, 2)  # [1, 3, 2]
    assert torch.equal(pad_rows(x, 2, 1), x)  # enough rows: unchanged
    assert pad_rows(x[:, :1], 4, 1).tolist() == [[[0, 1]] * 4]
    assert pad_rows(x[:, :2], 5, 1).tolist() == [[[0, 1], [2, 3], [0, 1], [2, 3], [0, 1]]]


def test_floors_are_candidates_and_amx_needs_no_more_than_measured():
    assert attention_floor(torch.bfloat16) in ATTENTION_CANDIDATES
    assert linear_floor(torch.bfloat16, (576, 1536)) in LINEAR_CANDIDATES
    assert attention_floor(torch.bfloat16) is attention_floor(torch.bfloat16)  # probed once
    if cpu_bf16_support() == "amx_bf16":  # measured there: one row vs 2+ rows; linears all alike
        assert attention_floor(torch.bfloat16) == 2
        assert all(linear_floor(torch.bfloat16, s) == 1 for s in ((576, 1536), (1536, 576)))


@pytest.mark.parametrize("grouped", [False, True])
def test_attention_position_scores_alike_in_decode_and_verify(monkeypatch, grouped, cpu_kind):
    """bf16, a causal mask over an aligned key count: each row of a T-row call (T = 1..32)
    equals the same row computed alone, on the per-head and the grouped-rows path."""
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    if grouped:
        monkeypatch.setattr(attention, "grouped_rows_exact", lambda threads=None: True)
    else:
        monkeypatch.setattr(attention, "GROUP_ROWS", 0)
    g = torch.Generator().manual_seed(11)
    for keys in (192, 1024, 3072):
        k = torch.randn(1, 3, keys, 64, generator=g).to(torch.bfloat16)  # [1, Hkv, L, D]
        v = torch.randn(1, 3, keys, 64, generator=g).to(torch.bfloat16)
        for rows in (1, 2, 3, 4, 5, 7, 9, 16, 32):
            q = torch.randn(1, 9, rows, 64, generator=g).to(torch.bfloat16)  # [1, Hq, T, D]
            past = keys - 64
            mask = (torch.arange(keys)[None, :] <= (torch.arange(rows) + past)[:, None])[None, None]
            many, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)  # [1, T, Hq, D]
            for t in range(rows):
                one, _ = attention.gqa_sdpa_forward(module, q[:, :, t:t + 1].contiguous(), k, v,
                                                    mask[:, :, t:t + 1], scaling=0.125)
                assert torch.equal(one[:, 0], many[:, t]), (grouped, keys, rows, t)


@pytest.mark.slow
def test_embedded_verifier_scores_a_position_alike_in_decode_and_verify():
    """End to end on the embedded verifier as the engine runs it (bf16 where the CPU has bf16
    units): 8 tokens decoded one at a time give the logits of one 8-token forward, bit for bit."""
    from asymagent.evals.probes.position_bits import model_positions
    from asymagent.evals.running.engine_setup import build_engine

    engine = build_engine("default").engine
    if next(engine.verifier.parameters()).dtype != torch.bfloat16:
        pytest.skip("float32 on this CPU: positions agree to rounding only (docs/kernels.md)")
    floors = engine.runtime["row_floors"]
    assert floors["attention"] == attention_floor(torch.bfloat16)
    assert floors["linear"]["576x1536"] == linear_floor(torch.bfloat16, (576, 1536))  # down_proj
    assert set(floors["linear"]) >= {"576x576", "192x576", "1536x576", "49152x576"}
    result = model_positions(engine.verifier, trials=2, context=120, rows=8, seed=3)
    assert result["identical"] == result["positions"] == 16, result
