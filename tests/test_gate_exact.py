"""Statistical tests of acceptance="exact": emitted tokens follow the fused target (or verifier).

Each test runs N independent rounds as one batch of N rows with fixed logit rows, drafts
sampled from the proposal, and checks the first token of each round's output (the accepted
draft 0, or the token emitted at position 0), the second token given one acceptance, and the
bonus token given all accepted, against the target distribution with a chi-square test.
Rows are independent of the drafted prefix here, so each output position i must be distributed
as the target of row i (the Leviathan/Chen guarantee).
"""

from __future__ import annotations

import pytest
import torch

from asymagent.kernels import draw_gate_noise, fused_gate, fused_gate_reference

N_ROUNDS = 40_000  # rounds per test: enough that a 5% probability error is ~8 sigma
P_MIN = 1e-4  # fixed seeds make the tests deterministic; a correct sampler passes at this level


def _chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the chi-square goodness-of-fit of `tokens` ([N] int) to `probs` ([V])."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()  # [V]
    expected = probs.double() * tokens.numel()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with target probability 0 was emitted"
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))


def _rounds(ver, aug, base, proposal, *, beta, temperature, seed, fuse_bonus=True):
    """Sample drafts from the proposal (None: the drafter's full view) and run the gate."""
    k = ver.shape[1] - 1
    gen = torch.Generator().manual_seed(seed)
    draft_from = aug[:, :k] if proposal is None else proposal
    q = torch.softmax(draft_from / temperature, dim=-1)  # [N, K, V]
    drafts = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=gen).view(-1, k)
    res = fused_gate(ver, aug, base, drafts, beta=beta, gamma=0.5, acceptance="exact",
                     temperature=temperature, generator=gen, fuse_bonus=fuse_bonus,
                     proposal_logits=proposal)
    return drafts, res


def _case(vocab: int, k: int, seed: int):
    """One set of logit rows [1, K+1, V] for each view, expanded to N rounds."""
    g = torch.Generator().manual_seed(seed)
    ver, aug, base = (torch.randn((1, k + 1, vocab), generator=g) * 1.5 for _ in range(3))
    return (t.expand(N_ROUNDS, -1, -1) for t in (ver, aug, base))


def _output_positions(drafts, res, k):
    """Token at output position 0, at position 1 (given n >= 1), and the bonus (given n == K)."""
    n = res.num_accepted
    first = torch.where(n >= 1, drafts[:, 0], res.next_token)
    given1 = n >= 1
    second = torch.where(n[given1] >= 2, drafts[given1, 1], res.next_token[given1])
    bonus = res.next_token[n == k]
    return first, second, bonus


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_exact_follows_fused_target(temperature):
    k, vocab, beta = 2, 12, 1.0
    ver, aug, base = _case(vocab, k, seed=11)
    drafts, res = _rounds(ver, aug, base, None, beta=beta, temperature=temperature,
                          seed=7)
    # the fused target written from the definition (log-prob form), independent of the gate
    fused = ver[0].log_softmax(-1) + beta * (aug[0].log_softmax(-1) - base[0].log_softmax(-1))
    target = torch.softmax(fused / temperature, dim=-1)  # [K+1, V]
    first, second, bonus = _output_positions(drafts, res, k)
    assert _chi_square_pvalue(first, target[0]) > P_MIN
    assert _chi_square_pvalue(second, target[1]) > P_MIN
    assert _chi_square_pvalue(bonus, target[k]) > P_MIN
    # the test must see both paths: some rejections (residual samples) and some bonus tokens
    assert 0.05 < (res.num_accepted == 0).float().mean() < 0.95
    assert bonus.numel() > 500  # >= ~40 expected counts for each likely bonus token


def test_exact_is_lossless_against_verifier_when_beta_zero():
    # mode spec: base == drafter and beta = 0, so the target is the verifier alone
    k, vocab = 3, 10
    ver, aug, _ = _case(vocab, k, seed=12)
    drafts, res = _rounds(ver, aug, aug, None, beta=0.0, temperature=1.0, seed=8)
    target = torch.softmax(ver[0], dim=-1)  # [K+1, V]
    first, second, bonus = _output_positions(drafts, res, k)
    assert _chi_square_pvalue(first, target[0]) > P_MIN
    assert _chi_square_pvalue(second, target[1]) > P_MIN
    assert _chi_square_pvalue(bonus, target[k]) > P_MIN


def test_exact_with_reduced_vocab_proposal_and_verifier_bonus():
    # drafts come from a reduced vocabulary (proposal -inf outside tokens 0..5), so the target
    # mass on tokens 6.. can only come from residual sampling; fuse_bonus=False: the bonus is
    # sampled from the verifier alone.
    k, vocab, beta = 2, 10, 0.5
    ver, aug, base = _case(vocab, k, seed=13)
    proposal = aug[:, :k].clone()
    proposal[..., 6:] = float("-inf")
    drafts, res = _rounds(ver, aug, base, proposal, beta=beta, temperature=1.0, seed=9,
                          fuse_bonus=False)
    fused = ver[0].log_softmax(-1) + beta * (aug[0].log_softmax(-1) - base[0].log_softmax(-1))
    target = torch.softmax(fused, dim=-1)  # [K+1, V]
    first, second, bonus = _output_positions(drafts, res, k)
    assert _chi_square_pvalue(first, target[0]) > P_MIN
    assert _chi_square_pvalue(second, target[1]) > P_MIN
    assert _chi_square_pvalue(bonus, torch.softmax(ver[0, k], dim=-1)) > P_MIN
    assert (first >= 6).any()  # residual sampling reached outside the draft vocabulary


def test_exact_at_temperature_zero_is_greedy_matching():
    g = torch.Generator().manual_seed(14)
    ver, aug, base = (torch.randn((8, 4, 30), generator=g) for _ in range(3))
    drafts = torch.randint(0, 30, (8, 3), generator=g)
    drafts[:4] = (ver + (aug.log_softmax(-1) - base.log_softmax(-1)))[:4, :3].argmax(-1)
    exact = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5, acceptance="exact")
    greedy = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5,
                                  acceptance="greedy")
    assert torch.equal(exact.num_accepted, greedy.num_accepted)
    assert torch.equal(exact.next_token, greedy.next_token)
    assert (greedy.num_accepted[:4] == 3).all()  # drafts equal to the fused argmax all pass


def test_seeded_sampling_is_deterministic_and_per_row_generators_are_independent():
    g = torch.Generator().manual_seed(15)
    ver, aug, base = (torch.randn((3, 3, 40), generator=g) for _ in range(3))
    drafts = torch.randint(0, 40, (3, 2), generator=g)
    kwargs = dict(beta=1.0, gamma=0.5, acceptance="exact", temperature=1.0)

    def run(gen):
        return fused_gate_reference(ver, aug, base, drafts, generator=gen, **kwargs)

    one, two = run(torch.Generator().manual_seed(5)), run(torch.Generator().manual_seed(5))
    assert torch.equal(one.next_token, two.next_token)
    assert torch.equal(one.num_accepted, two.num_accepted)
    # with one generator per row, row r depends on its own seed only
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    batch = run(gens)
    for row, seed in enumerate((1, 2, 3)):
        single = fused_gate_reference(ver[row:row + 1], aug[row:row + 1], base[row:row + 1],
                                      drafts[row:row + 1],
                                      generator=torch.Generator().manual_seed(seed), **kwargs)
        assert single.next_token.item() == batch.next_token[row].item()
        assert single.num_accepted.item() == batch.num_accepted[row].item()
    with pytest.raises(ValueError, match="generators"):
        draw_gate_noise(3, 2, 40, generator=gens[:2])


def test_noise_is_what_decides():
    # the same uniforms and exponentials give the same result whatever generator is passed
    g = torch.Generator().manual_seed(16)
    ver, aug, base = (torch.randn((2, 3, 25), generator=g) for _ in range(3))
    drafts = torch.randint(0, 25, (2, 2), generator=g)
    noise = draw_gate_noise(2, 2, 25, generator=torch.Generator().manual_seed(0))
    kwargs = dict(beta=1.0, gamma=0.5, acceptance="exact", temperature=1.0, noise=noise)
    one = fused_gate_reference(ver, aug, base, drafts,
                               generator=torch.Generator().manual_seed(1), **kwargs)
    two = fused_gate_reference(ver, aug, base, drafts,
                               generator=torch.Generator().manual_seed(2), **kwargs)
    assert torch.equal(one.next_token, two.next_token)
    assert (noise.exponential > 0).all() and ((noise.uniform >= 0) & (noise.uniform < 1)).all()
