"""The divergence gate in the gate's torch reference (jsd_min: the delta only where the views part).

beta_eff,i = beta * [JSD(p_a,i || p_b,i) >= jsd_min] (kernels/gate_reference.py `gated_beta`):
a position under the threshold takes the verifier's own row, one above it the fused one;
jsd_min = 0 is plain delta-fusion bit for bit, and a threshold above ln 2 is beta = 0 exactly.
The Triton kernel's agreement is tested in test_kernel_fused_gate.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from asymagent.kernels import draw_gate_noise, fused_gate_reference
from asymagent.kernels.gate_reference import gated_beta


def divergent_rows(batch: int = 12, vocab: int = 40, seed: int = 0):
    """[B, 1, V] rows whose drafter views part by a different amount per sequence."""
    g = torch.Generator().manual_seed(seed)
    ver = torch.randn((batch, 1, vocab), generator=g)
    aug = torch.randn((batch, 1, vocab), generator=g)
    spread = torch.linspace(0.05, 3.0, batch)[:, None, None]  # [B, 1, 1] views apart by this much
    base = aug + spread * torch.randn((batch, 1, vocab), generator=g)
    return ver, aug, base


def midpoint_threshold(jsd: torch.Tensor) -> float:
    """A jsd_min halfway between the two middle JSDs: about half the rows on each side, far
    from every row's value (so the kernel's differently rounded JSD decides the same)."""
    values = jsd.flatten().sort().values
    mid = len(values) // 2
    assert values[mid] - values[mid - 1] > 1e-3, values  # a clear gap to cut in
    return float(values[mid - 1] + values[mid]) / 2


def test_gated_beta_zeroes_beta_under_the_threshold_only():
    jsd = torch.tensor([[0.0, 0.01, 0.05, 0.3]])  # [B, R]
    beta = torch.tensor([1.0, 1.0, 1.0, 0.0])  # [R] (row R-1: fuse_bonus=False)
    assert gated_beta(jsd, beta, 0.0).tolist() == [[1.0, 1.0, 1.0, 0.0]]
    assert gated_beta(jsd, beta, 0.05).tolist() == [[0.0, 0.0, 1.0, 0.0]]  # >= fires
    assert gated_beta(jsd, beta, 1.0).tolist() == [[0.0, 0.0, 0.0, 0.0]]  # above ln 2: never


@pytest.mark.parametrize("acceptance", ["greedy", "cda"])
def test_positions_under_the_threshold_emit_the_verifier_argmax(acceptance):
    ver, aug, base = divergent_rows()
    no_drafts = torch.zeros((ver.shape[0], 0), dtype=torch.long)  # K = 0: the emitted token is
    # the fused argmax of row 0 (asym's fused plain step)
    kw = dict(beta=1.0, gamma=0.5, acceptance=acceptance)
    plain = fused_gate_reference(ver, aug, base, no_drafts, **kw)
    top_v = ver[:, 0].argmax(-1)  # [B]
    jsd_min = midpoint_threshold(plain.jsd)
    on = plain.jsd[:, 0] >= jsd_min  # [B]
    moved = plain.next_token != top_v  # [B] rows whose argmax the delta moves
    assert (moved & on).any() and (moved & ~on).any()  # on both sides of the threshold
    gated = fused_gate_reference(ver, aug, base, no_drafts, jsd_min=jsd_min, **kw)
    assert torch.equal(gated.next_token, torch.where(on, plain.next_token, top_v))
    assert torch.equal(gated.jsd, plain.jsd)  # the JSD itself is what it was


@pytest.mark.parametrize("acceptance, temperature", [("greedy", 0.0), ("cda", 0.0),
                                                      ("exact", 0.8)])
def test_zero_threshold_is_plain_fusion_and_above_ln2_is_beta_zero(acceptance, temperature):
    g = torch.Generator().manual_seed(1)
    ver, aug, base = (torch.randn((3, 4, 50), generator=g) * 2 for _ in range(3))
    drafts = aug[:, :3].argmax(-1)  # [B, K]
    noise = draw_gate_noise(3, 3, 50, generator=torch.Generator().manual_seed(2))
    kw = dict(gamma=0.5, acceptance=acceptance, temperature=temperature, noise=noise)
    fused = fused_gate_reference(ver, aug, base, drafts, beta=1.0, **kw)
    zero = fused_gate_reference(ver, aug, base, drafts, beta=1.0, jsd_min=0.0, **kw)
    never = fused_gate_reference(ver, aug, base, drafts, beta=1.0, jsd_min=1.0, **kw)
    off = fused_gate_reference(ver, aug, base, drafts, beta=0.0, **kw)
    for a, b in ((zero, fused), (never, off)):
        assert torch.equal(a.num_accepted, b.num_accepted)
        assert torch.equal(a.next_token, b.next_token)
        assert torch.equal(a.jsd, b.jsd)
    assert float(fused.jsd.max()) < math.log(2.0) < 1.0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_threshold_raises(bad):
    ver = torch.zeros((1, 1, 4))
    with pytest.raises(ValueError, match="jsd_min"):
        fused_gate_reference(ver, ver, ver, torch.zeros((1, 0), dtype=torch.long), beta=1.0,
                             gamma=0.5, jsd_min=bad)
