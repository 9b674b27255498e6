"""The per-row low-bit probe (evals/probes/lowbit_rows.py) on a tiny layer: its pure-torch tiled
int4 computes the min/max grid's linear, and `measure` reports every kind it was asked for."""

from __future__ import annotations

import torch

from asymagent.evals.probes.lowbit_rows import TiledInt4, decoder_ms, measure


def test_tiled_int4_is_its_grids_linear():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 128, generator=g).to(torch.bfloat16)  # [N, K]
    tiled = TiledInt4(w, tile=40)  # tiles of 40, 40, 16 output channels
    q = torch.stack((tiled.packed & 15, tiled.packed >> 4), -1).view(96, 4, 32).float()  # [N, G, 32]
    ref_w = (tiled.lo.float() + q * tiled.scale.float()).view(96, 128)  # [N, K], the grid's values
    x = torch.randn(5, 128, generator=g).to(torch.bfloat16)  # [5, K]
    out = tiled(x)  # [5, N]
    assert out.shape == (5, 96)
    torch.testing.assert_close(out.float(), x.float() @ ref_w.T, rtol=0.02, atol=0.05)
    assert (ref_w - w.float()).abs().max() < 0.3  # the grid is near the weight (16 levels per 32)


def test_measure_reports_each_kind_and_row_count():
    shapes = {"tiny": (64, 128)}
    per_shape = measure(["bf16", "int4w", "int8w", "int4_tiled"], (1, 2, 16), rounds=1, repeats=1, tile=32,
                        shapes=shapes)
    got = per_shape["tiny"]
    assert set(got["ms"]) == {"bf16", "int4w", "int8w", "int4_tiled"}
    assert all(set(by) == {"1", "2", "16"} and min(by.values()) > 0 for by in got["ms"].values())
    assert set(got["row_bits_same_in_any_company"]) == set(got["ms"])
    assert got["ratio_16_to_1"]["bf16"] == got["ms"]["bf16"]["16"] / got["ms"]["bf16"]["1"]
    total = decoder_ms({name: got for name in ("q_o", "k_v", "gate_up", "down")})
    assert total["bf16"]["1"] == 28 * 7 * got["ms"]["bf16"]["1"]
