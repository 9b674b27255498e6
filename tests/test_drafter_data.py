"""Training data for the drafter: synthetic domains, rendering, mixing, determinism, held-out split."""

from __future__ import annotations

import json
import random

import pytest

from asymagent.training.data import TokenStream, parse_mix, render_messages
from asymagent.training.domains import DOMAINS, HELD_OUT_DOMAIN, TRAIN_DOMAINS, episode, tools_for


def test_parse_mix_normalises_and_rejects_bad_entries():
    assert parse_mix("agent:3,text:1") == {"agent": 0.75, "text": 0.25}
    with pytest.raises(ValueError, match="NAME:WEIGHT"):
        parse_mix("agent:1,web:1")
    with pytest.raises(ValueError, match="no positive weight"):
        parse_mix("agent:0")


@pytest.mark.parametrize("domain", DOMAINS, ids=lambda d: d.name)
def test_episodes_have_valid_tool_calls(domain):
    rng = random.Random(7)
    for _ in range(5):
        msgs = episode(domain, rng)
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "assistant"
        names = {t["function"]["name"] for t in tools_for(domain)}
        for prev, msg in zip(msgs, msgs[1:]):
            if msg["role"] == "tool":  # every tool output answers a JSON call to a listed tool
                call = json.loads(prev["content"])
                assert prev["role"] == "assistant" and call["name"] in names
                assert isinstance(call["arguments"], dict)


def test_held_out_domain_is_not_trained_on():
    assert HELD_OUT_DOMAIN not in {d.name for d in TRAIN_DOMAINS}
    assert len(TRAIN_DOMAINS) >= 15  # breadth: docs/architecture.md §5 (one domain generalised poorly)


def test_token_stream_rows_are_deterministic_and_exact_length(smollm_tokenizer):
    stream = TokenStream(smollm_tokenizer, 256, parse_mix("agent:1"), seed=3)
    a = stream.batch(5, 2)
    assert a.shape == (2, 256)
    assert a.tolist() == stream.batch(5, 2).tolist()  # same (seed, step): same data on resume
    assert a.tolist() != stream.batch(6, 2).tolist()
    text = smollm_tokenizer.decode(a[0])
    assert "<|im_start|>system" in text and "search_shipments" not in text


def test_render_uses_chat_template(smollm_tokenizer):
    ids = render_messages(smollm_tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert smollm_tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
