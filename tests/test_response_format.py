"""response_format (json_object, json_schema) decoded under ResponseFormatConstraint by the engine.

A random model cannot write valid JSON by itself: every output being valid (and greedy
speculation being token-identical to the verifier alone) shows the grammar does the work.
"""

from __future__ import annotations

import json

import pytest
from conftest import make_tiny_llama

from asymagent.agents.tools import schema_errors
from asymagent.chat.response_format import ResponseFormatConstraint, format_schema, split_output
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig

V = 49152
# Bounded strings and numbers: a random model may otherwise write one string until the budget.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "days", "ok"],
          "properties": {"city": {"type": "string", "maxLength": 10},
                         "days": {"type": "integer", "minimum": 1, "maximum": 7},
                         "ok": {"type": "boolean"},
                         "unit": {"enum": ["C", "F"]}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Weather in Paris as JSON?"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["q"],
    "properties": {"q": {"type": "string", "maxLength": 8}}}}}


@pytest.fixture(scope="module")
def engine(smollm_tokenizer):
    return Engine(verifier=make_tiny_llama(vocab_size=V, seed=1),
                  drafter=make_tiny_llama(vocab_size=V, layers=1, seed=2),
                  tokenizer=smollm_tokenizer, spec=SpecConfig(k=3))


def test_format_schema_reads_openai_formats():
    assert format_schema(None) is None and format_schema({"type": "text"}) is None
    assert format_schema({"type": "json_object"}) == {"type": "object"}
    assert format_schema(FORMAT) == SCHEMA
    for bad in ({"type": "yaml"}, {"type": "json_schema"}, "json",
                {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}):
        with pytest.raises(ValueError, match="response_format"):
            format_schema(bad)


def test_uncompilable_schema_is_a_value_error(smollm_tokenizer):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}
    with pytest.raises(ValueError, match="cannot be compiled"):
        ResponseFormatConstraint(smollm_tokenizer, bad, vocab_size=V)


@pytest.mark.parametrize("mode", ["full", "compressed", "spec", "asym"])
def test_every_answer_is_valid_json_for_the_schema(engine, mode):
    for seed in range(4):  # 0-1 greedy, 2-3 sampled at temperature 1
        r = engine.chat(MESSAGES, mode=mode, max_new_tokens=60, seed=seed,
                        temperature=0.0 if seed < 2 else 1.0, response_format=FORMAT,
                        cache_key=f"rf-{mode}")
        assert r.finish_reason == "stop" and not r.tool_calls and not r.invalid_tool_calls
        assert schema_errors(json.loads(r.text), SCHEMA) == [], r.text
        assert r.stats.forced_tokens >= 4  # keys and punctuation came from the grammar


def test_greedy_speculation_under_the_format_is_lossless(engine):
    ref = engine.chat(MESSAGES, mode="full", max_new_tokens=60, response_format=FORMAT)
    for mode in ("spec", "asym"):
        r = engine.chat(MESSAGES, mode=mode, max_new_tokens=60, response_format=FORMAT)
        assert r.token_ids == ref.token_ids and r.stats.drafted > 0


def test_json_object_is_any_closed_object(engine, smollm_tokenizer):
    # The biases steer a random model to close strings and the object; the grammar keeps it JSON.
    close = {smollm_tokenizer.convert_tokens_to_ids(t): bias for t, bias in (("}", 20.0), ('"', 30.0))}
    for mode in ("full", "asym"):
        r = engine.chat(MESSAGES, mode=mode, max_new_tokens=30, logit_bias=close,
                        response_format={"type": "json_object"})
        assert isinstance(json.loads(r.text), dict) and r.finish_reason == "stop", r.text


def test_tools_under_auto_may_still_be_called(engine, smollm_tokenizer):
    """With tools and tool_choice auto the grammar is format | one call; a bias on the first
    key token picks the branch (the model's choice otherwise), and either branch is valid."""
    for key, want_call in (("name", True), ("city", False)):
        bias = {smollm_tokenizer.convert_tokens_to_ids(key): 50.0}
        for mode in ("full", "spec"):
            r = engine.chat(MESSAGES, tools=[TOOL], mode=mode, max_new_tokens=60,
                            logit_bias=bias, response_format=FORMAT)
            if want_call:
                call = r.tool_calls[0]["function"]
                assert call["name"] == "lookup" and len(json.loads(call["arguments"])["q"]) <= 8
                assert r.finish_reason == "tool_calls" and not r.text
            else:
                assert not r.tool_calls and schema_errors(json.loads(r.text), SCHEMA) == []


def test_a_format_object_that_looks_like_a_call_is_an_answer():
    text = '{"name": "Bob", "arguments": {"age": 3}}'
    assert split_output(text, []).content == text  # no tools: never a call
    parsed = split_output(text, ["lookup"])  # "Bob" is not a tool
    assert parsed.content == text and not parsed.tool_calls and not parsed.invalid_tool_calls
    call = split_output('{"name": "lookup", "arguments": {"q": "x"}}', ["lookup"])
    assert call.tool_calls[0]["function"]["name"] == "lookup" and not call.content
