"""Unit tests of the server's pure parts: delta streaming, detokenisation, schemas, metrics, load tool."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from asymagent.integrations.loadtest import check_loopback, percentile
from asymagent.integrations.server.chat import cache_key_for
from asymagent.integrations.server.metrics import ServerMetrics, accepted_per_position
from asymagent.integrations.server.schemas import ChatCompletionRequest
from asymagent.integrations.server.deltas import DeltaStreamer
from asymagent.integrations.server.worker import IncrementalDetokenizer
from asymagent.stats import StepStats


def _result(text="", tool_calls=None):
    return SimpleNamespace(text=text, tool_calls=tool_calls or [], invalid_tool_calls=[])


def _assemble(deltas):
    """Rebuild content and tool calls from delta dicts the way OpenAI clients do."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            slot = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                assert slot["id"] is None, "id must come only in a call's first delta"
                slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
                assert tc["type"] == "function"
            slot["arguments"] += tc["function"].get("arguments", "")
    return content, [calls[i] for i in sorted(calls)]


def _pieces(text, size):
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7])  # piece sizes: per character up to multi-token rounds
def test_streamed_tool_calls_assemble_to_the_final_calls(size):
    raw = ('{"name": "get_weather", "arguments": {"city": "Paris", "days": {"n": 2}}}\n'
           '{"name": "add", "arguments": {"a": 1, "b": 2}}')
    final = [{"id": "call_x", "type": "function", "function": {
                 "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": {"n": 2}})}},
             {"id": "call_y", "type": "function", "function": {
                 "name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}]
    s = DeltaStreamer(tools_enabled=True)
    deltas = [d for piece in _pieces(raw, size) for d in s.push(piece)]
    streamed_before_finish = len(deltas)
    deltas += s.finish(_result("", final))
    content, calls = _assemble(deltas)
    assert content == ""
    assert [c["name"] for c in calls] == ["get_weather", "add"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Paris", "days": {"n": 2}},
                                                           {"a": 1, "b": 2}]
    # Both headers and most argument fragments went out while generating, not at the end.
    assert streamed_before_finish >= 4


def test_hermes_tool_call_after_content():
    raw = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    s = DeltaStreamer(tools_enabled=True)
    deltas = [d for piece in _pieces(raw, 2) for d in s.push(piece)]
    deltas += s.finish(_result("Let me check.", [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": '{"x": 1}'}}]))
    content, calls = _assemble(deltas)
    assert content == "Let me check."
    assert len(calls) == 1 and json.loads(calls[0]["arguments"]) == {"x": 1}


@pytest.mark.parametrize("raw, lead", [
    ('{{"name": "get_weather", "arguments": {"city": "Oslo"}}}', ""),
    # the spellings the reference pair writes (docs/serving.md, "Under auto on the reference pair")
    ("{{'name': 'get_weather', 'arguments': {\"city\": \"Oslo\"}}}", ""),
    ('<{{name": "get_weather", "arguments": {"city": "Oslo"}}}>', ""),
    ('{{name: "get_weather", arguments: {"city": "Oslo"}}}', ""),
    ('{{name="get_weather", arguments={"city": "Oslo"}}}', ""),
    ("Checking: {{ 'name': 'get_weather', 'arguments': {\"city\": \"Oslo\"} }}", "Checking:"),
])
@pytest.mark.parametrize("size", [1, 4])
def test_streamed_call_doubled_in_braces_is_a_call_not_content(size, raw, lead):
    """Qwen2.5-Coder's `{{"name": ..., "arguments": ...}}}` (its template's call form), in every
    spelling of its keys: nothing of it leaks as content while streaming (only the text before
    it), and the call's deltas add up to the engine's parsed call."""
    from asymagent.chat.output_parsing import parse_output

    parsed = parse_output(raw)
    s = DeltaStreamer(tools_enabled=True)
    deltas = [d for piece in _pieces(raw, size) for d in s.push(piece)]
    assert "".join(d.get("content", "") for d in deltas) == lead
    deltas += s.finish(_result(parsed.content, parsed.tool_calls))
    content, calls = _assemble(deltas)
    assert content == lead and [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["arguments"] == parsed.tool_calls[0]["function"]["arguments"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Oslo"}


def test_plain_text_streams_as_content_and_holds_back_stop_strings():
    s = DeltaStreamer(tools_enabled=False, stop=["END"])
    deltas = []
    for piece in ["Hello", " wor", "ld E", "N", "D and more"]:
        deltas += s.push(piece)
    sent = "".join(d["content"] for d in deltas)
    assert "E" not in sent.replace("Hello world", "")  # no part of the stop string leaked
    deltas += s.finish(_result("Hello world "))
    content, calls = _assemble(deltas)
    assert content.strip() == "Hello world" and calls == []


def test_brace_text_that_is_not_a_call_comes_out_as_content():
    s = DeltaStreamer(tools_enabled=True)
    deltas = [d for piece in _pieces("{not json at all", 3) for d in s.push(piece)]
    assert deltas == []  # undecided/tools-looking text is held until the engine's verdict
    deltas += s.finish(_result("{not json at all"))
    assert _assemble(deltas) == ("{not json at all", [])


def test_detokenizer_never_splits_multibyte_characters(smollm_tokenizer):
    text = "🙂 ok 日本語 naïve"
    ids = smollm_tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(smollm_tokenizer)
    pieces = [detok.feed([i]) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    # "🙂" is two byte-level tokens in SmolLM2's vocabulary: the first one yields nothing.
    assert pieces[0] == ""


def test_detokenizer_deltas_concatenate_to_the_full_decode(smollm_tokenizer):
    import random

    rng = random.Random(0)
    texts = ["Héllo wörld — ünïcödé ✓✓ 👍🏽 family 👨‍👩‍👧",
             "code:  x = {'a': 1}\t end\n\n  double  spaces\n"]
    for text in texts:
        ids = smollm_tokenizer.encode(text, add_special_tokens=False)
        for _ in range(10):  # random round sizes of 1-3 tokens, like speculative rounds
            detok, out, i = IncrementalDetokenizer(smollm_tokenizer), "", 0
            while i < len(ids):
                k = rng.randint(1, 3)
                out += detok.feed(ids[i:i + k])
                i += k
            assert out == smollm_tokenizer.decode(ids, skip_special_tokens=True)


def test_request_schema_rejects_bad_input():
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest.model_validate(ok).max_new_tokens(64) == 64
    bad = [
        {**ok, "messages": []},
        {**ok, "max_tokens": 0},
        {**ok, "max_completion_tokens": -3},
        {**ok, "temperature": 2.5},
        {**ok, "top_p": 0},
        {**ok, "n": 0},
        {**ok, "messages": [{"role": "robot", "content": "x"}]},
        {**ok, "messages": [{"role": "tool", "content": "x"}]},  # no tool_call_id
        {**ok, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        {**ok, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strnig"}}}}}]},
        {**ok, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "required": ["zz"], "properties": {}}}}]},
        {**ok, "tool_choice": "required"},  # no tools
        {**ok, "mode": "turbo"},
        {**ok, "stream_options": {"include_usage": True}},  # without stream
    ]
    for body in bad:
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate(body)


def test_accepted_per_position_inverts_acceptance_rates():
    # 10 rounds; 6 accept draft 0, 3 of those also accept draft 1 -> rates [0.6, 0.5].
    stats = StepStats(rounds=10, acceptance_by_position=[0.6, 0.5])
    assert accepted_per_position(stats) == [6, 3]
    stats.reached_by_position = [10, 6]
    assert accepted_per_position(stats) == [6, 3]


def test_metrics_registry_per_app_and_vllm_names():
    a, b = ServerMetrics("m"), ServerMetrics("m")  # two apps in one process: no clash
    stats = StepStats(rounds=4, drafted=8, accepted=5, acceptance_by_position=[0.75, 2 / 3],
                      new_tokens=9, decode_s=0.8, compression_ratio=0.5, full_context_tokens=100,
                      draft_source={"suffix": 3, "model": 1, "plain": 2},
                      recalls=1, recall_prefill_tokens=37)
    a.observe(stats, e2e_s=1.0, ttft_s=0.2, queue_s=0.0, finish_reason="stop")
    text = a.exposition().decode()
    assert 'asymagent:spec_decode_num_drafts_total{model_name="m"} 4.0' in text
    assert 'asymagent:spec_decode_num_draft_tokens_total{model_name="m"} 8.0' in text
    assert 'asymagent:spec_decode_num_accepted_tokens_total{model_name="m"} 5.0' in text
    # 0.75 * 4 rounds = 3 accepted at position 0; 2/3 of those 3 = 2 at position 1.
    assert ('asymagent:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"}'
            ' 2.0') in text
    assert 'asymagent:draft_source_steps_total{model_name="m",source="suffix"} 3.0' in text
    assert 'asymagent:draft_source_steps_total{model_name="m",source="plain"} 2.0' in text
    assert 'asymagent:recalls_total{model_name="m"} 1.0' in text  # issue 26's recalls
    assert 'asymagent:recall_prefill_tokens_total{model_name="m"} 37.0' in text
    assert "asymagent:time_to_first_token_seconds_bucket" in text
    assert "asymagent:e2e_request_latency_seconds_count" in text
    assert 'asymagent:spec_decode_num_drafts_total{model_name="m"} 0.0' in b.exposition().decode()


def test_cache_key_follows_the_conversation_prefix():
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "task A"}]
    later = first + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]
    other = [{"role": "system", "content": "s"}, {"role": "user", "content": "task B"}]
    assert cache_key_for(first, None, "asym") == cache_key_for(later, None, "asym")
    assert cache_key_for(first, None, "asym") != cache_key_for(other, None, "asym")
    assert cache_key_for(first, None, "asym") != cache_key_for(first, None, "full")


def test_loadtest_refuses_non_loopback_and_percentiles():
    assert check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_loopback("http://localhost:1") == "http://localhost:1"
    assert check_loopback("http://[::1]:9") == "http://[::1]:9"
    for url in ("http://10.0.0.1:8000", "http://example.com", "ftp://127.0.0.1"):
        with pytest.raises(ValueError):
            check_loopback(url)
    # percentile of 1..101: index (100 * q / 100) -> exactly q + 1.
    values = [float(v) for v in range(1, 102)]
    assert percentile(values, 50) == 51.0 and percentile(values, 95) == 96.0


def test_parallel_tool_calls_reaches_the_engine_call():
    from asymagent.integrations.server.chat import chat_task, chat_turn
    from asymagent.integrations.server.context import Limits

    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}
    for given, passed in ((None, True), (True, True), (False, False)):
        req = ChatCompletionRequest.model_validate({**ok, "parallel_tool_calls": given})
        task = chat_task(chat_turn(req, Limits()), req, Limits(), None)
        assert task.request.parallel_tool_calls is passed  # OpenAI's default: true
