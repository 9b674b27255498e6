"""int8 weight-only matmuls through Inductor's CPU GEMM template (asymagent/modeling/compiled_int8.py):
the product of the layer's own weight, and a row's bits the same whatever rows share its call."""

from __future__ import annotations

import pytest
import torch

from asymagent.modeling.compiled_int8 import CHUNK, CompiledInt8, compiled_int8_missing
from asymagent.modeling.row_floor import ROW_COUNTS

WHY = compiled_int8_missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=f"no compiled int8 here: {WHY}")]


def _layer(seed: int, n_out: int = 48, n_in: int = 64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n_out, n_in), generator=g, dtype=torch.int8)  # [N, K]
    scale = torch.rand(n_out, generator=g) / n_in
    return q, scale, CompiledInt8(q, scale, torch.bfloat16)


@torch.inference_mode()
def test_each_layer_computes_its_own_weight():
    """Two layers of one shape, compiled apart: each multiplies by its own frozen weight (a shared
    compiled frame would give the second the first's)."""
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    for seed in (1, 2):
        q, scale, layer = _layer(seed)
        want = (x.float() @ q.float().T) * scale  # [5, N]
        torch.testing.assert_close(layer.matmul(x).float(), want, rtol=0.02, atol=0.02)


@torch.inference_mode()
def test_row_bits_are_the_same_in_any_company():
    """1..40 rows (more than one CHUNK too): row r's output equals row r computed alone."""
    _, _, layer = _layer(3)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)  # [40, K]
    alone = torch.cat([layer.matmul(x[r:r + 1]) for r in range(40)])  # [40, N]
    for rows in (*ROW_COUNTS, CHUNK, CHUNK + 1, 40):
        for lo in {0, 40 - rows}:
            assert torch.equal(layer.matmul(x[lo:lo + rows]), alone[lo:lo + rows]), (rows, lo)
