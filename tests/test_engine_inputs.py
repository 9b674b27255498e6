"""Bad input: a clear ValueError naming the problem, raised before any compute."""

from __future__ import annotations

import pytest

from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model


@pytest.fixture(scope="module")
def engine():
    verifier = make_model(seed=0, max_positions=64)
    return Engine(verifier=verifier, drafter=make_model(seed=1, layers=1, max_positions=64))


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt_ids": []}, "empty"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"mode": "turbo"}, "unknown mode"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"prompt_ids": [5, 999]}, "outside the vocabulary"),
    ({"prompt_ids": list(range(3, 67))}, "max_position_embeddings"),  # 64 tokens, limit 64
    ({"compressed_prompt_ids": []}, "compressed_prompt_ids is empty"),
    ({"stop": ["x"]}, "tokenizer"),
])
def test_bad_generate_arguments(engine, kwargs, message):
    args = {"prompt_ids": [5, 6, 7], "mode": "spec", "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        engine.generate(**args)
    assert len(engine.caches) == 0  # rejected before any session (or forward) was made


def test_speculative_modes_need_a_drafter():
    engine = Engine(verifier=make_model(seed=0))
    for mode in ("spec", "asym"):
        with pytest.raises(ValueError, match="needs a drafter"):
            engine.generate([5, 6], mode=mode)
    assert engine.generate([5, 6], mode="full", max_new_tokens=2).stats.new_tokens == 2


def test_vocabulary_mismatch():
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        Engine(verifier=make_model(seed=0, vocab=256), drafter=make_model(seed=1, vocab=320))


def test_bad_draft_vocab_and_spec():
    with pytest.raises(ValueError, match="draft_vocab"):
        Engine(verifier=make_model(seed=0), drafter=make_model(seed=1), draft_vocab=[3, 400])
    with pytest.raises(ValueError, match="k must be"):
        SpecConfig(k=0)
    with pytest.raises(ValueError, match="acceptance"):
        SpecConfig(acceptance="maybe")


def test_chat_needs_tokenizer_and_messages(engine):
    with pytest.raises(ValueError, match="tokenizer"):
        engine.chat([{"role": "user", "content": "hi"}])


def test_chat_rejects_bad_messages(smollm_tokenizer):
    engine = Engine(verifier=make_model(seed=0, vocab=49152, hidden=32, layers=1),
                    tokenizer=smollm_tokenizer)
    for bad in ([], "hello", [{"content": "no role"}]):
        with pytest.raises(ValueError, match="messages"):
            engine.chat(bad, mode="full")
    with pytest.raises(ValueError, match="needs tools"):
        engine.chat([{"role": "user", "content": "hi"}], mode="full", tool_choice="required")


def test_generation_stops_at_the_context_limit(engine):
    # 60 prompt tokens, limit 64: tokens at positions 60..63 fit, so at most 4 new tokens
    r = engine.generate(list(range(3, 63)), mode="spec", max_new_tokens=20)
    assert 1 <= r.stats.new_tokens <= 4 and r.finish_reason in ("length", "stop")
