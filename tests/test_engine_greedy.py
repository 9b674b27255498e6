"""Greedy losslessness of the engine: spec (and asym with beta=0, exact, no compression) == full."""

from __future__ import annotations

import pytest

from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts

N_PROMPTS = 12
NEW = 24


@pytest.fixture(scope="module")
def verifier():
    return make_model(seed=0)


@pytest.fixture(scope="module")
def full_outputs(verifier):
    engine = Engine(verifier=verifier)
    return [engine.generate(p, mode="full", max_new_tokens=NEW).token_ids
            for p in random_prompts(N_PROMPTS)]


def _drafter(kind: str, verifier):
    if kind == "random":  # different weights: mostly rejects
        return make_model(seed=1, layers=1)
    if kind == "same":  # the verifier itself: every draft accepted
        return verifier
    return noisy_copy(verifier, noise=0.6)  # agrees often, not always


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("kind", ["random", "same", "noisy"])
def test_spec_greedy_equals_full(verifier, full_outputs, k, kind):
    # the drafter alone (lookup drafts have their own K and tests: tests/test_prompt_lookup.py),
    # at a fixed K: the bounds below are K's (adaptive K, which picks K from wall-clock timings,
    # is the next test)
    spec = SpecConfig(k=k, lookup_ngram=0, adaptive_k=False)
    engine = Engine(verifier=verifier, drafter=_drafter(kind, verifier), spec=spec)
    accepted, drafted = 0, 0
    for prompt, expected in zip(random_prompts(N_PROMPTS), full_outputs):
        r = engine.generate(prompt, mode="spec", max_new_tokens=NEW)
        assert r.token_ids == expected
        s = r.stats
        accepted, drafted = accepted + s.accepted, drafted + s.drafted
        assert s.new_tokens == len(r.token_ids)
        # tokens per verifier forward in speculative rounds: at least the recovered/bonus token,
        # at most K drafts + 1 bonus
        assert 1.0 <= s.mean_accepted_len <= k + 1
        assert all(0.0 <= x <= 1.0 for x in s.acceptance_by_position)
        assert len(s.acceptance_by_position) <= k
    rate = accepted / drafted
    if kind == "same":
        assert rate == 1.0  # the drafter is the verifier: argmax always matches
    elif kind == "random":
        assert rate < 0.5  # unrelated weights agree rarely (measured ~0.1)
    else:
        assert 0.0 < rate < 1.0  # both paths exercised


@pytest.mark.parametrize("k", [1, 3])
def test_asym_beta0_exact_no_compression_equals_full(verifier, full_outputs, k):
    spec = SpecConfig(k=k, beta=0.0, acceptance="exact")
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=spec)
    for prompt, expected in zip(random_prompts(N_PROMPTS), full_outputs):
        r = engine.generate(prompt, mode="asym", max_new_tokens=NEW)
        assert r.token_ids == expected
        # one view: the base pass is the drafter itself, handed to the gate as the same tensor,
        # which skips delta and JSD (both exactly 0)
        assert r.stats.mean_jsd == 0.0


@pytest.mark.parametrize("kind", ["random", "noisy"])
def test_spec_greedy_equals_full_with_adaptive_k(verifier, full_outputs, kind):
    """Adaptive K changes K (and may switch speculation off) from timings, never the output."""
    spec = SpecConfig(k=2, lookup_ngram=0, adaptive_k=True)
    engine = Engine(verifier=verifier, drafter=_drafter(kind, verifier), spec=spec)
    for prompt, expected in zip(random_prompts(N_PROMPTS), full_outputs):
        r = engine.generate(prompt, mode="spec", max_new_tokens=NEW)
        assert r.token_ids == expected
        assert r.stats.rounds == 0 or 1.0 <= r.stats.mean_accepted_len <= spec.k_max + 1


@pytest.mark.parametrize("mode,acceptance", [("spec", "greedy"), ("asym", "greedy"), ("asym", "cda")])
def test_one_view_rounds_take_the_gate_shortcut(verifier, monkeypatch, mode, acceptance):
    """spec, and asym without compression, tell the gate there is one drafter view (base None).

    The gate then skips two log-softmaxes, delta and JSD over [K+1, V] (~4 ms a round on CPU at
    V=49k); mode spec passes no drafter rows at all (its target is the verifier), nor does asym
    when nothing reads them (greedy, beta 0); asym with cda passes them (cda reads them)."""
    import asymagent.decoding.round as round_mod

    seen = []
    real = round_mod.fused_gate

    def spy(v, a, b, *args, **kwargs):
        seen.append((a is None, b is None))
        return real(v, a, b, *args, **kwargs)

    monkeypatch.setattr(round_mod, "fused_gate", spy)
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6),
                    spec=SpecConfig(k=2, lookup_ngram=0, acceptance=acceptance))
    engine.generate(random_prompts(1)[0], mode=mode, max_new_tokens=8)
    assert seen and all(seen_b for _, seen_b in seen)
    assert all(seen_a == (acceptance != "cda") for seen_a, _ in seen)


def test_asym_with_compression_reads_three_caches(verifier):
    """asym with a compressed view: verifier and base see the short view, drafter the full one
    (beta > 0: the drafter model's delta needs the base pass)."""
    spec = SpecConfig(k=3, beta=1.0)
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=spec)
    prompt = random_prompts(1, length=30)[0]
    r = engine.generate(prompt, mode="asym", max_new_tokens=NEW, compressed_prompt_ids=prompt[10:])
    s = r.stats
    assert (s.verifier_context_tokens, s.full_context_tokens) == (20, 30)
    assert s.compression_ratio == pytest.approx(20 / 30)
    assert s.verifier_prefill_tokens == 20  # cold caches: the whole compressed view
    assert s.drafter_prefill_tokens == 30 + 20  # drafter on the full view + base on the short one
    assert s.mean_jsd > 0.0  # the two drafter views differ
    session = engine.caches.session("default")
    # after the call every cache holds its view minus pending tokens (cropped to the commit)
    assert len(session.get("verifier_compressed")) <= 20 + len(r.token_ids)
    assert len(session.get("drafter_compressed")) <= 20 + len(r.token_ids)
    assert len(session.get("drafter_full")) <= 30 + len(r.token_ids)


def test_asym_without_drafter_delta_skips_the_base_pass(verifier):
    """beta = 0 (the default), greedy, no escalation: nothing reads the drafter's compressed view,
    so it is never prefilled, and the output is the same as with the base pass built."""
    prompt = random_prompts(1, length=30)[0]
    outs = {}
    for acceptance in ("greedy", "cda"):  # cda reads the base row: the cache is built again
        engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6),
                        spec=SpecConfig(k=3, beta=0.0, acceptance=acceptance))
        r = engine.generate(prompt, mode="asym", max_new_tokens=NEW, compressed_prompt_ids=prompt[10:])
        assert r.stats.drafter_prefill_tokens == (30 if acceptance == "greedy" else 30 + 20)
        outs[acceptance] = r.token_ids
    compressed = Engine(verifier=verifier).generate(prompt[10:], mode="full", max_new_tokens=NEW)
    # beta 0, greedy: the target is the compressed verifier (+ the copy delta, 0 on random
    # prompts without repeats of >= 3 tokens), so asym emits mode compressed's tokens
    assert outs["greedy"] == compressed.token_ids


def test_asym_without_readers_skips_the_drafter_rows(verifier, monkeypatch):
    """beta = 0, greedy (asym's defaults): the gate's target is the verifier's rows, so the
    drafter's full-view rows at the verify positions are not computed (no bonus-row forward, no
    head pass); the tokens equal those of a run that computes them, with copied and model drafts."""
    import dataclasses

    import asymagent.engine as engine_mod
    from asymagent.decoding.model_drafter import DraftHead

    prompts = [p + p[:10] for p in random_prompts(3, length=30, seed=5)]  # copied drafts too
    drafter = noisy_copy(verifier, 0.4)
    plan, head_rows = engine_mod.plan_request, DraftHead.full_logits
    passes = []

    def counted(self, hidden):
        passes[-1] += 1
        return head_rows(self, hidden)

    monkeypatch.setattr(DraftHead, "full_logits", counted)

    def run(rows: bool) -> list:
        monkeypatch.setattr(engine_mod, "plan_request",
                            lambda *a, **kw: dataclasses.replace(plan(*a, **kw), drafter_rows=rows))
        engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=3))
        passes.append(0)
        outs = []
        for p in prompts:
            r = engine.generate(p, mode="asym", max_new_tokens=NEW, compressed_prompt_ids=p[8:])
            assert r.stats.rounds > 0
            outs.append(r.token_ids)
        return outs

    assert run(False) == run(True)
    assert passes == [0, passes[1]] and passes[1] > 0  # skipped, then really computed


def test_strict_prefix_uses_greedy_matching(verifier):
    """At temperature 0, rounds that start inside strict_prefix use the greedy rule, whose output
    is the chain of fused argmaxes (a function of the prefix only). gamma=0.05 relaxes cda enough
    that plain cda accepts drafts greedy would reject (checked below), so the prefix matters."""
    drafter = noisy_copy(verifier, 1.5)
    prompt = random_prompts(1, length=30, seed=0)[0]
    comp = prompt[12:]

    def run(**kw):
        engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=2, gamma=0.05, **kw))
        return engine.generate(prompt, mode="asym", compressed_prompt_ids=comp,
                               max_new_tokens=16).token_ids

    greedy, cda = run(acceptance="greedy"), run(acceptance="cda")
    assert cda != greedy  # relaxed acceptance changes this output
    assert run(acceptance="cda", strict_prefix=16) == greedy  # every round strict
    partial = run(acceptance="cda", strict_prefix=4)
    assert partial[:4] == greedy[:4]  # tokens 1-4 all come from rounds that start before 4


def test_drafter_prefill_waits_for_the_first_model_round(verifier, monkeypatch):
    """Greedy spec / asym: only the drafter model's drafts read its full-view cache, so its prefill
    is deferred to the first round that asks the model (RequestPlan.defer_drafter). The tokens and
    the counted drafter prefill equal the eager prefill's; a request whose rounds never ask the
    model feeds the drafter nothing, and the next request that asks catches up on both."""
    import dataclasses

    import asymagent.engine as engine_mod
    from asymagent.decoding.drafts import Drafts
    from asymagent.decoding.model_drafter import ModelDrafter

    plan = engine_mod.plan_request
    drafter = noisy_copy(verifier, 0.4)
    first, second = random_prompts(2, length=30, seed=7)
    second = first + second[:12]  # the next agent step: the same history, longer
    assert plan(engine_mod.mode_of("spec"), SpecConfig(), 0.0, two_views=False).defer_drafter
    assert not plan(engine_mod.mode_of("asym"), SpecConfig(acceptance="cda"), 0.0,
                    two_views=True).defer_drafter  # cda reads the drafter's rows

    def run(mode: str, defer: bool) -> list:
        monkeypatch.setattr(engine_mod, "plan_request", lambda *a, **kw: dataclasses.replace(
            plan(*a, **kw), defer_drafter=defer))
        engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=3, lookup_ngram=0))
        out = []
        for p in (first, second):
            r = engine.generate(p, mode=mode, max_new_tokens=NEW, compressed_prompt_ids=p[8:],
                                cache_key="agent")
            assert r.stats.draft_source.get("model", 0) > 0
            out.append((r.token_ids, r.stats.drafter_prefill_tokens))
        return out

    for mode in ("spec", "asym"):
        assert run(mode, True) == run(mode, False)

    monkeypatch.setattr(engine_mod, "plan_request", plan)
    engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=3))
    asked = ModelDrafter.propose
    monkeypatch.setattr(ModelDrafter, "propose", lambda self, k: Drafts(tokens=[], source="model"))
    r = engine.generate(first, mode="spec", max_new_tokens=NEW, cache_key="agent")
    full = Engine(verifier=verifier).generate(first, mode="full", max_new_tokens=NEW)
    assert r.token_ids == full.token_ids and r.stats.drafter_prefill_tokens == 0
    session = engine.caches.session("agent")
    assert len(session.get("drafter_full")) == 0  # never fed
    monkeypatch.setattr(ModelDrafter, "propose", asked)
    r = engine.generate(second, mode="spec", max_new_tokens=NEW, cache_key="agent")
    assert r.stats.draft_source.get("model", 0) > 0 or r.stats.rounds == r.stats.lookup_rounds
    if r.stats.draft_source.get("model", 0):
        assert r.stats.drafter_prefill_tokens == len(second)  # both requests' prompt, once


@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_copied_drafts_only_never_run_the_drafter_model(verifier, full_outputs, mode):
    """SpecConfig(draft_model=False): suffix drafts only; the drafter model is never prefilled or
    stepped, the output is still the verifier's (prompts that repeat themselves, so copies exist)."""
    engine = Engine(verifier=verifier, drafter=make_model(seed=1, layers=1),
                    spec=SpecConfig(draft_model=False))
    for prompt, want in zip(random_prompts(N_PROMPTS), full_outputs):
        r = engine.generate(prompt, mode=mode, max_new_tokens=NEW)
        assert r.token_ids == want
        assert r.stats.drafter_prefill_tokens == 0
        assert "model" not in r.stats.draft_source  # rounds: suffix drafts or plain steps
    # no copied drafts either: plain steps, the verifier's output still
    plain = Engine(verifier=verifier, drafter=make_model(seed=1, layers=1),
                   spec=SpecConfig(draft_model=False, lookup_ngram=0))
    r = plain.generate(random_prompts(1)[0], mode=mode, max_new_tokens=NEW)
    assert r.token_ids == full_outputs[0] and r.stats.drafted == 0
