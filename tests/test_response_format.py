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


def _fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}


def _feed(c, text: str) -> bool:
    return all(c.advance(t) for t in c.tokenizer.encode(text, add_special_tokens=False))


def _digits_allowed(c) -> bool:
    mask = c.allowed_mask()
    return any(bool(mask[c.tokenizer.convert_tokens_to_ids(d)]) for d in "0123456789")


@pytest.mark.parametrize("fmt", [
    _fmt({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}),
    {"type": "json_object"},  # xgrammar's any-JSON numbers too
])
def test_numbers_end_fraction_and_integer_digits_are_bounded(smollm_tokenizer, fmt):
    """Issue 27: a number under a schema had no end (3.14159265358979323846... to max_tokens)."""
    from asymagent.chat.ebnf_text import EXPONENT_DIGITS, FRACTION_DIGITS, INTEGER_DIGITS

    c = ResponseFormatConstraint(smollm_tokenizer, fmt, vocab_size=V)
    assert _feed(c, '{"x": 3.' + "1" * FRACTION_DIGITS)
    assert not _digits_allowed(c)  # the fraction is full: the number must end
    assert _feed(c, "}") and c.is_completed()
    c = ResponseFormatConstraint(smollm_tokenizer, fmt, vocab_size=V)
    assert _feed(c, '{"x": -' + "9" * INTEGER_DIGITS) and not _digits_allowed(c)
    assert _feed(c, "e+" + "1" * EXPONENT_DIGITS) and not _digits_allowed(c)
    assert _feed(c, "}") and json.loads(c.text())["x"] == -float("9" * INTEGER_DIGITS + "e+111")


def test_integer_digits_are_bounded_and_patterns_untouched(smollm_tokenizer):
    from asymagent.chat.ebnf_text import INTEGER_DIGITS

    schema = {"type": "object", "required": ["n", "m", "s"], "properties": {
        "n": {"type": "integer"}, "m": {"type": "integer", "minimum": 0},
        "s": {"type": "string", "pattern": "[0-9]*"}}}
    c = ResponseFormatConstraint(smollm_tokenizer, _fmt(schema), vocab_size=V)
    assert _feed(c, '{"n": ' + "1" * INTEGER_DIGITS) and not _digits_allowed(c)
    assert _feed(c, ', "m": ' + "2" * INTEGER_DIGITS) and not _digits_allowed(c)
    assert _feed(c, ', "s": "' + "3" * 40 + '"}') and c.is_completed()  # a string's digits: free


def test_ranged_numbers_keep_xgrammar_form(smollm_tokenizer):
    """A number with minimum and maximum was already bounded (6 fraction digits): unchanged."""
    schema = {"type": "object", "required": ["p"],
              "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}}}
    c = ResponseFormatConstraint(smollm_tokenizer, _fmt(schema), vocab_size=V)
    assert _feed(c, '{"p": 0.123456') and not _digits_allowed(c) and _feed(c, "}")
    assert not _feed(ResponseFormatConstraint(smollm_tokenizer, _fmt(schema), vocab_size=V),
                     '{"p": 2')


def test_a_root_number_is_not_cut_after_its_first_digit(smollm_tokenizer):
    """A complete number may still go on: the stop token is only forced when nothing else may
    follow (before, a root-level number ended after its first digit)."""
    c = ResponseFormatConstraint(smollm_tokenizer, _fmt({"type": "integer"}), vocab_size=V)
    assert _feed(c, "4") and c.is_completed() and c.forced_tokens() == []
    assert _feed(c, "2") and json.loads(c.text()) == 42
