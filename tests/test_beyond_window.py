"""Beyond the window: only the verifier's view is bound by the model's context limit.

In modes compressed and asym the verifier reads the compressed view; the full view (asym's
drafter, suffix drafts and the copy delta) may be longer than the model's context, so a long
agent history whose compressed view fits still decodes (Engine's ContextLengthError).
"""

from __future__ import annotations

import pytest

from asymagent.decoding.plan import plan_request
from asymagent.engine import ContextLengthError, Engine
from asymagent.spec_config import SpecConfig, mode_of
from test_engine_models import make_model, noisy_copy, random_prompts

LIMIT = 64  # the tiny models' max_position_embeddings


@pytest.fixture(scope="module")
def models():
    verifier = make_model(seed=0, max_positions=LIMIT)
    return verifier, noisy_copy(verifier, 0.05)


def engine_of(models, **spec) -> Engine:
    return Engine(verifier=models[0], drafter=models[1], spec=SpecConfig(**spec))


def views(full: int, kept: int) -> tuple:
    """A full prompt of `full` tokens and a compressed view of it: its first 8 and last
    `kept` - 8 tokens (a head/tail cut)."""
    prompt = random_prompts(1, length=full, seed=3)[0]
    return prompt, prompt[:8] + prompt[-(kept - 8):]


def test_asym_decodes_a_history_longer_than_the_model_whose_compressed_view_fits(models):
    prompt, compressed = views(100, 30)  # full view over the 64-position limit
    # the drafter model alone drafts (no copied drafts), no copy delta: asym's greedy tokens are
    # then the verifier's on the compressed view, i.e. mode compressed's
    engine = engine_of(models, lookup_ngram=0, copy_weight=0.0)
    ref = engine.generate(prompt, mode="compressed", compressed_prompt_ids=compressed,
                          max_new_tokens=12, cache_key="c")
    out = engine.generate(prompt, mode="asym", compressed_prompt_ids=compressed,
                          max_new_tokens=12, cache_key="a")
    assert out.token_ids == ref.token_ids and len(out.token_ids) >= 1
    # the drafter read the whole full view (past its own 64 positions) and its drafts were used
    assert out.stats.full_context_tokens == 100 and out.stats.verifier_context_tokens == 30
    assert out.stats.draft_source.get("model", 0) >= 1 and out.stats.accepted >= 1
    assert out.stats.drafter_prefill_tokens >= 100
    # the defaults (suffix drafts and the copy delta over the whole full view) run as well
    default = engine_of(models).generate(prompt, mode="asym", compressed_prompt_ids=compressed,
                                         max_new_tokens=12)
    assert 1 <= default.stats.new_tokens <= 12


def test_modes_whose_verifier_reads_the_full_view_still_refuse_it(models):
    prompt, compressed = views(100, 30)
    engine = engine_of(models)
    for mode in ("full", "spec"):
        with pytest.raises(ContextLengthError, match="prompt_ids has 100 tokens"):
            engine.generate(prompt, mode=mode, compressed_prompt_ids=compressed, max_new_tokens=4)
    long_compressed = prompt[:LIMIT]  # the verifier's own view over the limit
    for mode in ("compressed", "asym"):
        with pytest.raises(ContextLengthError, match="compressed_prompt_ids has 64 tokens"):
            engine.generate(prompt, mode=mode, compressed_prompt_ids=long_compressed,
                            max_new_tokens=4)
    assert len(engine.caches) == 0  # refused before any session was made


def test_generation_is_bounded_by_the_verifiers_view_not_the_drafters(models):
    engine = engine_of(models, lookup_ngram=0, copy_weight=0.0)
    # full view 60 of 64 positions, compressed 20: the verifier has room for 44 more tokens;
    # bounding by the full view (as before) would stop asym after 4
    prompt, compressed = views(60, 20)
    ref = engine.generate(prompt, mode="compressed", compressed_prompt_ids=compressed,
                          max_new_tokens=12, cache_key="c")
    out = engine.generate(prompt, mode="asym", compressed_prompt_ids=compressed,
                          max_new_tokens=12, cache_key="a")
    assert out.token_ids == ref.token_ids
    assert len(out.token_ids) > 4 or out.finish_reason == "stop"
    # and the verifier's own limit still holds: compressed 60 of 64 -> at most 4 new tokens
    prompt, compressed = views(100, 60)
    out = engine.generate(prompt, mode="asym", compressed_prompt_ids=compressed,
                          max_new_tokens=12, cache_key="b")
    assert 1 <= len(out.token_ids) <= 4


def test_escalation_is_planned_only_when_the_verifier_could_read_the_full_view(models):
    spec = SpecConfig(escalate_jsd=1e-9, escalate_window=1)
    plan = plan_request(mode_of("asym"), spec, 0.0, two_views=True, full_fits=False)
    assert not plan.escalation and "longer than the model's context" in plan.reasons["escalation"]
    assert plan_request(mode_of("asym"), spec, 0.0, two_views=True).escalation
    engine = Engine(verifier=models[0], drafter=models[1], spec=spec)
    prompt, compressed = views(50, 30)
    fits = engine.generate(prompt, mode="asym", compressed_prompt_ids=compressed,
                           max_new_tokens=8, cache_key="fits")
    assert fits.stats.escalated  # JSD > 0 after one round: it escalates where it can
    prompt, compressed = views(100, 30)
    beyond = engine.generate(prompt, mode="asym", compressed_prompt_ids=compressed,
                             max_new_tokens=8, cache_key="beyond")
    assert not beyond.stats.escalated and beyond.stats.new_tokens >= 1
