"""Engine features: reduced draft vocabulary, adaptive K, JSD escalation, the FLOPs formula."""

from __future__ import annotations

import pytest
import torch

from asymagent.decoding.adaptive_k import AdaptiveK
from asymagent.engine import Engine
from asymagent.decoding.flops import FlopCounter, non_embedding_params
from asymagent.spec_config import SpecConfig
from asymagent.decoding.adaptive_k import expected_tokens
from asymagent.decoding.model_drafter import DraftHead
from asymagent.decoding.sampling import top_p_filter
from test_engine_models import make_model, noisy_copy, random_prompts


@pytest.fixture(scope="module")
def verifier():
    return make_model(seed=0)


def test_reduced_draft_vocab_is_lossless_and_drafts_from_it(verifier):
    vocab = torch.arange(3, 200)  # ids 200..255 are never drafted (but may be emitted)
    drafter = noisy_copy(verifier, 0.6)
    head = DraftHead(drafter, vocab)
    hidden = torch.randn(64)
    small = head.draft_logits(hidden)  # [197]
    assert small.shape == (197,)
    full = head.to_full(small[None])[0]  # [256], -inf outside the draft vocabulary
    assert torch.isinf(full[:3]).all() and torch.isinf(full[200:]).all()
    torch.testing.assert_close(full[3:200], head.full_logits(hidden[None])[0, 3:200])
    assert head.token_id(0) == 3
    full_engine = Engine(verifier=verifier)
    spec = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=3), draft_vocab=vocab)
    emitted_outside = 0
    for p in random_prompts(6):
        r = spec.generate(p, mode="spec", max_new_tokens=16)
        assert r.token_ids == full_engine.generate(p, mode="full", max_new_tokens=16).token_ids
        emitted_outside += sum(t >= 200 for t in r.token_ids)
        s = spec.generate(p, mode="spec", max_new_tokens=16, temperature=1.0, seed=1)
        assert len(s.token_ids) >= 1
    assert emitted_outside > 0  # recovered/bonus tokens come from the full verifier vocabulary


def test_drafter_attribute_draft_vocab_is_used(verifier):
    drafter = noisy_copy(verifier, 0.6)
    drafter.asymagent_draft_vocab = torch.arange(3, 100)
    engine = Engine(verifier=verifier, drafter=drafter)
    assert engine.head.vocab is not None and engine.head.draft_weight.shape == (97, 64)


def test_adaptive_k_controller_synthetic():
    # drafts cost 1 ms each, a verify 10 ms whatever K, a plain step 9 ms.
    # 9 rounds in 10 accept every draft: alpha -> 0.98, and E(K) / (K + 10 ms) still grows at
    # K=8 (7.2 / 18 ms vs 2.9 / 12 ms at K=2), so the controller climbs to k_max.
    ctl = AdaptiveK(k=2, k_min=1, k_max=8)
    ctl.record_plain(0.009)
    for i in range(40):
        accepted = ctl.k if i % 10 else 0
        ctl.record_round(ctl.k, accepted, draft_s=0.001 * ctl.k, verify_s=0.010)
    assert ctl.enabled and ctl.k == 8 and ctl.alpha > 0.95
    # exactly one draft accepted per round: alpha -> 0.5, E = 1.5, 1.75, 1.875 for K = 1, 2, 3
    # over 11, 12, 13 ms: K=2 is best (0.146 tok/ms vs 0.136 and 0.144)
    ctl = AdaptiveK(k=2, k_min=1, k_max=8)
    ctl.record_plain(0.009)
    for _ in range(40):
        ctl.record_round(ctl.k, min(ctl.k, 1), draft_s=0.001 * ctl.k, verify_s=0.010)
    assert ctl.enabled and ctl.k == 2
    # a useless drafter: nothing accepted, drafts cost as much as a verify -> switch off
    ctl = AdaptiveK(k=2)
    ctl.record_plain(0.010)
    for _ in range(ctl.min_rounds):
        ctl.record_round(ctl.k, 0, draft_s=0.010 * ctl.k, verify_s=0.011)
    assert not ctl.enabled
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(1.0, 3) == 4.0


def test_adaptive_k_switches_off_a_useless_drafter(verifier):
    # an unrelated drafter 4x deeper and 4x wider than the verifier: drafts are almost never
    # accepted and each costs several verifier forwards, so the measured rate falls far below
    # the 10% margin even with the timing noise of a busy machine
    drafter = make_model(seed=3, layers=8, hidden=256)
    engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=3, adaptive_k=True))
    full = Engine(verifier=verifier)
    p = random_prompts(1, seed=9)[0]
    r = engine.generate(p, mode="spec", max_new_tokens=48)
    assert r.token_ids == full.generate(p, mode="full", max_new_tokens=48).token_ids
    assert r.stats.k == 0  # recorded: speculation switched off for this request
    assert r.stats.rounds < 20  # it stopped drafting early (48 tokens would need >= 12 rounds)


def test_escalation_finishes_with_full_context_verifier(verifier):
    drafter = noisy_copy(verifier, 0.6)
    spec = SpecConfig(k=2, escalate_jsd=1e-9, escalate_window=1)  # any JSD > 0 escalates
    engine = Engine(verifier=verifier, drafter=drafter, spec=spec)
    prompt = random_prompts(1, length=30, seed=4)[0]
    chunks = []
    r = engine.generate(prompt, mode="asym", max_new_tokens=12, compressed_prompt_ids=prompt[15:],
                        callback=chunks.append)
    assert r.stats.escalated and r.stats.rounds == 1  # escalated right after the first round
    first = chunks[0]
    # the full-context prefill covers the prompt + what was emitted before escalating
    assert r.stats.verifier_prefill_tokens == 15 + len(prompt) + len(first)
    rest = Engine(verifier=verifier).generate(prompt + first, mode="full",
                                             max_new_tokens=12 - len(first))
    assert r.token_ids == first + rest.token_ids  # then the verifier alone on the full view


def test_flops_formula_matches_parameter_count(verifier):
    params = sum(p.numel() for n, p in verifier.named_parameters()
                 if "embed_tokens" not in n and "lm_head" not in n)
    assert non_embedding_params(verifier.config) == params  # config formula == real count
    counter = FlopCounter.from_config(verifier.config)
    # 3 tokens after 5 cached: dense 2*N*3, attention 4 * L * d_attn * (3*5 + 3*4/2) pairs
    expected = 2 * params * 3 + 4 * 2 * 64 * (15 + 6)
    assert counter.forward(3, 5) == expected
    engine = Engine(verifier=verifier)
    r = engine.generate(list(range(3, 13)), mode="full", max_new_tokens=4)
    # prefill of 9 tokens, then 4 one-token forwards at contexts 9, 10, 11, 12
    total = counter.forward(9, 0) + sum(counter.forward(1, c) for c in (9, 10, 11, 12))
    assert r.stats.verifier_flops == pytest.approx(total)


def test_top_p_filter_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = top_p_filter(logits, 1.0, 0.7)  # 0.5 + 0.3 reaches 0.7: keep two
    assert torch.isfinite(kept).tolist() == [True, True, False, False]
    assert torch.equal(top_p_filter(logits, 1.0, 1.0), logits)
