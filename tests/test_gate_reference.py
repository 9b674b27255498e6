"""Tests of the gate's torch reference: hand-built cases, -inf safety, validation, dispatch."""

from __future__ import annotations

import math

import pytest
import torch

from asymagent.kernels import GateResult, fused_gate, fused_gate_reference
from asymagent.kernels.fused_gate import gate_backend

NEG = float("-inf")


def _probs_to_logits(rows: list[list[float]]) -> torch.Tensor:
    """[[p...], ...] -> [1, R, V] logits (log p; a 0 becomes -inf)."""
    return torch.tensor(rows, dtype=torch.float32).log()[None]


def test_identical_views_jsd_zero_and_gamma_eff_is_gamma():
    # a == b: JSD = 0, so gamma_eff = gamma = 0.5 and the rule is p_v(d) > 0.5 * p_b(d).
    base = _probs_to_logits([[0.4, 0.3, 0.2, 0.1]] * 2)  # p_b(d=0) = 0.4 -> threshold 0.2
    # verifier rows: p_v(0) = 0.21 (just above 0.2: accept) then p_v(0) = 0.19 (just below)
    ver = _probs_to_logits([[0.21, 0.39, 0.2, 0.2], [0.19, 0.41, 0.2, 0.2]])
    res = fused_gate_reference(ver, base, base, torch.tensor([[0]]), beta=1.0, gamma=0.5)
    assert torch.all(res.jsd.abs() < 1e-6)  # identical distributions: JSD is 0 up to rounding
    assert res.num_accepted.tolist() == [1]  # 0.21 > 0.2 accepted, row 1 is the bonus row
    # beta * delta = 0 when the views agree: the fused argmax is the verifier's (token 1)
    assert res.next_token.tolist() == [1]
    res = fused_gate_reference(ver[:, 1:], base[:, 1:], base[:, 1:],
                               torch.zeros((1, 0), dtype=torch.long), beta=1.0, gamma=0.5)
    assert res.num_accepted.tolist() == [0]  # K = 0: nothing to accept, emit the argmax
    two = torch.cat([ver[:, 1:], ver[:, 1:]], dim=1)  # p_v(0) = 0.19 at both positions
    res = fused_gate_reference(two, base, base, torch.tensor([[0]]), beta=1.0, gamma=0.5)
    assert res.num_accepted.tolist() == [0]  # 0.19 < 0.2 rejected


def test_disjoint_supports_jsd_ln2_halves_gamma():
    # p_a on tokens {0,1}, p_b on {2,3}: JSD = ln 2, gamma_eff = gamma / 2 = 0.25.
    aug = _probs_to_logits([[0.5, 0.5, 0.0, 0.0]] * 2)
    base = _probs_to_logits([[0.0, 0.0, 0.5, 0.5]] * 2)
    # draft 2 has p_b = 0.5 -> threshold 0.25 * 0.5 = 0.125; p_v(2) = 0.15 passes, although the
    # plain gamma rule (0.5 * 0.5 = 0.25) would reject it: the relaxation is at work.
    ver = _probs_to_logits([[0.6, 0.1, 0.15, 0.15], [0.1, 0.2, 0.3, 0.4]])
    res = fused_gate_reference(ver, aug, base, torch.tensor([[2]]), beta=1.0, gamma=0.5)
    assert torch.allclose(res.jsd, torch.full((1, 2), math.log(2.0)), atol=1e-6)
    assert res.num_accepted.tolist() == [1]
    # no token is supported by both views, so delta is 0 everywhere: fused = verifier (token 3)
    assert res.next_token.tolist() == [3]
    ver_low = _probs_to_logits([[0.6, 0.2, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]])
    res = fused_gate_reference(ver_low, aug, base, torch.tensor([[2]]), beta=1.0, gamma=0.5)
    assert res.num_accepted.tolist() == [0]  # p_v(2) = 0.1 < 0.125
    assert res.next_token.tolist() == [0]  # verifier argmax at the rejected position


def _peaked_case(k: int, vocab: int = 16, seed: int = 0):
    """Verifier and drafter agree on a peaked token per row; base is flatter (positive delta)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn((1, k + 1, vocab), generator=g)
    peak = torch.randint(0, vocab, (k + 1,), generator=g)
    ver = noise.clone()
    ver[0, torch.arange(k + 1), peak] += 8.0  # verifier puts ~0.98 on the peak token
    aug = ver.clone()
    base = 0.5 * ver  # flatter compressed view
    return ver, aug, base, peak


def test_all_accept_emits_fused_bonus_or_verifier_argmax():
    k = 4
    ver, aug, base, peak = _peaked_case(k)
    # At row K make the verifier prefer token A narrowly while the delta favours token B.
    tok_a, tok_b = int(peak[k]), (int(peak[k]) + 1) % ver.shape[-1]
    ver[0, k, tok_b] = ver[0, k, tok_a] - 0.5  # verifier: A beats B by 0.5 logits
    aug[0, k, tok_b] = aug[0, k, tok_a] + 6.0  # full view: B much likelier than in base view
    drafts = peak[None, :k]
    fused = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    assert fused.num_accepted.tolist() == [k]  # every draft is the verifier's peak token
    assert fused.next_token.tolist() == [tok_b]  # fused bonus: delta overturns a 0.5 lead
    plain = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5, fuse_bonus=False)
    assert plain.num_accepted.tolist() == [k]
    assert plain.next_token.tolist() == [tok_a]  # official behaviour: verifier argmax at K+1


def test_first_reject_stops_even_if_later_drafts_pass():
    k = 3
    ver, aug, base, peak = _peaked_case(k, seed=1)
    drafts = peak[None, :k].clone()
    drafts[0, 0] = (drafts[0, 0] + 3) % ver.shape[-1]  # a token the verifier gives ~1e-4
    for rule in ("cda", "greedy", "exact"):
        res = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5, acceptance=rule)
        assert res.num_accepted.tolist() == [0], rule
        fused_row0 = ver[0, 0] + (aug[0, 0].log_softmax(-1) - base[0, 0].log_softmax(-1))
        assert res.next_token.tolist() == [int(fused_row0.argmax())], rule


def test_fused_argmax_equals_log_prob_definition():
    # The reference scores v + beta*((a - max a) - (b - max b)); the definition is
    # log p_v + beta*(log p_a - log p_b). They differ by a per-row constant: same argmax.
    g = torch.Generator().manual_seed(3)
    ver, aug, base = (torch.randn((4, 3, 500), generator=g) * 4 for _ in range(3))
    drafts = torch.zeros((4, 2), dtype=torch.long)
    for beta in (0.0, 0.7, 2.0):
        res = fused_gate_reference(ver, aug, base, drafts, beta=beta, gamma=0.5,
                                   acceptance="greedy")
        target = ver.log_softmax(-1) + beta * (aug.log_softmax(-1) - base.log_softmax(-1))
        expect = target.argmax(-1).gather(1, res.num_accepted[:, None]).squeeze(1)
        assert torch.equal(res.next_token, expect)


def test_masked_logits_never_nan_and_masked_tokens_never_emitted():
    g = torch.Generator().manual_seed(4)
    batch, k, vocab = 6, 3, 64
    ver, aug, base = (torch.randn((batch, k + 1, vocab), generator=g) * 3 for _ in range(3))
    ver[..., 40:] = NEG  # a constraint masks tokens 40.. for the verifier
    aug[..., 50:] = NEG  # reduced draft vocabulary (full view)
    base[..., 30:45] = NEG  # a different mask in the compressed view (p_b = 0 on drafts 30..44)
    drafts = torch.randint(30, 60, (batch, k), generator=g)  # includes p_v = 0 and p_b = 0 drafts
    for rule, temp in (("cda", 0.0), ("greedy", 0.0), ("exact", 0.0), ("exact", 0.8)):
        res = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5, acceptance=rule,
                                   temperature=temp, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(res.jsd).all(), rule
        assert ((res.jsd >= 0) & (res.jsd <= math.log(2) + 1e-6)).all(), rule
        assert (res.next_token < 40).all(), rule  # the verifier's mask is respected
        # a draft with p_v = 0 (token >= 40) is never accepted
        for row in range(batch):
            n = int(res.num_accepted[row])
            assert (drafts[row, :n] < 40).all(), rule
    # cda: p_b(d) = 0 < p_v(d) always passes (the rule is p_v > gamma_eff * 0)
    drafts = torch.full((batch, k), 35)
    res = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    assert res.num_accepted.tolist() == [k] * batch


def test_result_types_and_low_precision_inputs():
    g = torch.Generator().manual_seed(5)
    ver, aug, base = (torch.randn((2, 3, 100), generator=g) for _ in range(3))
    drafts = torch.randint(0, 100, (2, 2), generator=g)
    ref = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    assert isinstance(ref, GateResult)
    assert ref.num_accepted.dtype == torch.int64 and ref.num_accepted.shape == (2,)
    assert ref.next_token.dtype == torch.int64 and ref.next_token.shape == (2,)
    assert ref.jsd.dtype == torch.float32 and ref.jsd.shape == (2, 3)
    for dtype in (torch.float16, torch.bfloat16):
        low = fused_gate_reference(ver.to(dtype), aug.to(dtype), base.to(dtype), drafts,
                                   beta=1.0, gamma=0.5)
        # rounding logits to 8-11 bits moves the JSD by far less than 0.02 nats at this scale
        assert torch.allclose(low.jsd, ref.jsd, atol=2e-2)


@pytest.mark.parametrize("bad, match", [
    (dict(acceptance="maybe"), "acceptance"),
    (dict(gamma=0.0), "gamma"),
    (dict(beta=-1.0), "beta"),
    (dict(temperature=-0.5), "temperature"),
])
def test_bad_parameters_raise(bad, match):
    ver = torch.zeros((1, 3, 10))
    kwargs = dict(beta=1.0, gamma=0.5) | bad
    with pytest.raises(ValueError, match=match):
        fused_gate(ver, ver, ver, torch.zeros((1, 2), dtype=torch.long), **kwargs)


def test_bad_shapes_raise():
    ver = torch.zeros((1, 3, 10))
    drafts = torch.zeros((1, 2), dtype=torch.long)
    with pytest.raises(ValueError, match="differ"):
        fused_gate(ver, torch.zeros((1, 3, 11)), ver, drafts, beta=1.0, gamma=0.5)
    with pytest.raises(ValueError, match="draft_tokens"):
        fused_gate(ver, ver, ver, torch.zeros((1, 3), dtype=torch.long), beta=1.0, gamma=0.5)
    with pytest.raises(ValueError, match=r"\[B, K\+1, V\]"):
        fused_gate(ver[0], ver, ver, drafts, beta=1.0, gamma=0.5)
    with pytest.raises(ValueError, match="proposal_logits"):
        fused_gate(ver, ver, ver, drafts, beta=1.0, gamma=0.5, acceptance="exact",
                   temperature=1.0, proposal_logits=ver)
    with pytest.raises(ValueError, match=r"in \[0, 10\)"):
        fused_gate(ver, ver, ver, drafts + 10, beta=1.0, gamma=0.5)
    with pytest.raises(ValueError, match="int64"):
        fused_gate(ver, ver, ver, drafts.float(), beta=1.0, gamma=0.5)


def test_dispatch_env(monkeypatch):
    monkeypatch.delenv("ASYMAGENT_GATE", raising=False)
    assert gate_backend(torch.device("cpu")) == "torch"
    monkeypatch.setenv("ASYMAGENT_GATE", "triton")
    assert gate_backend(torch.device("cpu")) == "triton"
    monkeypatch.setenv("ASYMAGENT_GATE", "compile")
    assert gate_backend(torch.device("cpu")) == "compile"
    monkeypatch.setenv("ASYMAGENT_GATE", "cuda-please")
    with pytest.raises(ValueError, match="ASYMAGENT_GATE"):
        gate_backend(torch.device("cpu"))


def test_one_drafter_view_shortcut_matches_two_equal_views():
    # base_logits=None (one view: asym without compression) skips JSD/delta; an equal copy does not
    g = torch.Generator().manual_seed(6)
    ver, aug = (torch.randn((3, 4, 80), generator=g) * 2 for _ in range(2))
    drafts = aug[:, :3].argmax(-1)
    for rule, temp in (("cda", 0.0), ("greedy", 0.0), ("exact", 1.0)):
        kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp)
        same = fused_gate_reference(ver, aug, None, drafts,
                                    generator=torch.Generator().manual_seed(0), **kwargs)
        copy = fused_gate_reference(ver, aug, aug.clone(), drafts,
                                    generator=torch.Generator().manual_seed(0), **kwargs)
        assert torch.equal(same.num_accepted, copy.num_accepted), rule
        assert torch.equal(same.next_token, copy.next_token), rule
        assert torch.equal(same.jsd, torch.zeros(3, 4))
        assert torch.allclose(copy.jsd, same.jsd, atol=1e-6)  # JSD(p, p) = 0 up to rounding


def test_no_drafter_rows_means_the_verifier_is_the_target():
    # mode spec: drafter_logits=None, base_logits=None; the verifier's rows stand in for both
    g = torch.Generator().manual_seed(7)
    ver, prop = (torch.randn((2, 4, 60), generator=g) * 2 for _ in range(2))
    drafts = prop[:, :3].argmax(-1)
    for rule, temp in (("greedy", 0.0), ("exact", 0.8)):
        kwargs = dict(beta=0.0, gamma=1.0, acceptance=rule, temperature=temp,
                      proposal_logits=prop[:, :3])
        none = fused_gate_reference(ver, None, None, drafts,
                                    generator=torch.Generator().manual_seed(1), **kwargs)
        rows = fused_gate_reference(ver, ver.clone(), ver.clone(), drafts,
                                    generator=torch.Generator().manual_seed(1), **kwargs)
        assert torch.equal(none.num_accepted, rows.num_accepted), rule
        assert torch.equal(none.next_token, rows.next_token), rule
    with pytest.raises(ValueError, match="base_logits needs drafter_logits"):
        fused_gate_reference(ver, None, ver, drafts, beta=0.0, gamma=1.0, acceptance="greedy")


def test_compile_backend_falls_back_to_eager_when_compilation_fails(monkeypatch):
    import importlib

    gate = importlib.import_module("asymagent.kernels.fused_gate")

    def broken():
        def compiled(*args, **kwargs):
            raise RuntimeError("no C++ compiler")
        return compiled

    monkeypatch.setattr(gate, "compiled_reference", broken)
    monkeypatch.setattr(gate, "_COMPILED", {})
    monkeypatch.setenv("ASYMAGENT_GATE", "compile")
    g = torch.Generator().manual_seed(7)
    ver, aug, base = (torch.randn((2, 3, 30), generator=g) for _ in range(3))
    drafts = torch.randint(0, 30, (2, 2), generator=g)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        out = fused_gate(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    ref = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    assert torch.equal(out.next_token, ref.next_token)
    assert gate._COMPILED["failed"]  # remembered: later calls go straight to eager
    with pytest.raises(ValueError, match="acceptance"):  # bad input is not swallowed
        fused_gate(ver, aug, base, drafts, beta=1.0, gamma=0.5, acceptance="nope")
