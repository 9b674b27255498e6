"""Parallel tool calls: the grammar admits 1..MAX_PARALLEL_CALLS call objects when `parallel`,
exactly one otherwise, and what it admits parses into that many tool calls."""

from __future__ import annotations

import json

import pytest

from asymagent.chat.chat_format import parse_output
from asymagent.chat.ebnf_text import repeated_root, split_literals
from asymagent.chat.response_format import ResponseFormatConstraint, split_output
from asymagent.chat.tool_constraint import MAX_PARALLEL_CALLS, ToolCallConstraint

V = 49152
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def call(city: str) -> str:
    return json.dumps({"name": "get_weather", "arguments": {"city": city}})


def feed(c, text: str) -> bool:
    """Advance `c` over `text`'s tokens; False at the first token the grammar refuses."""
    return all(c.advance(t) for t in c.tokenizer.encode(text, add_special_tokens=False))


def test_parallel_grammar_admits_two_calls_and_they_parse_into_two(smollm_tokenizer):
    c = ToolCallConstraint(smollm_tokenizer, WEATHER, "required", vocab_size=V, parallel=True)
    text = call("Oslo") + "\n" + call("Lima")
    assert feed(c, call("Oslo"))
    # after one call the turn may end or go on: nothing is forced, the stop and "\n" both allowed
    assert c.is_completed() and c.forced_tokens() == []
    mask = c.allowed_mask()
    assert all(mask[s] for s in c.stop_ids) and mask[smollm_tokenizer.encode("\n")[0]]
    assert feed(c, "\n" + call("Lima")) and c.is_completed()
    assert c.advance(c.stop_ids[0]) and c.is_terminated()
    parsed = parse_output(c.text())
    assert c.text() == text and parsed.content == ""
    assert [json.loads(t["function"]["arguments"])["city"] for t in parsed.tool_calls] == \
        ["Oslo", "Lima"]


def test_one_call_without_parallel(smollm_tokenizer):
    c = ToolCallConstraint(smollm_tokenizer, WEATHER, "required", vocab_size=V)
    assert feed(c, call("Oslo"))
    assert c.forced_tokens() == [smollm_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert not c.advance(smollm_tokenizer.encode("\n")[0])  # no second call


def test_at_most_max_parallel_calls(smollm_tokenizer):
    c = ToolCallConstraint(smollm_tokenizer, WEATHER, "required", vocab_size=V, parallel=True)
    assert feed(c, "\n".join(call(f"C{i}") for i in range(MAX_PARALLEL_CALLS)))
    assert c.forced_tokens() == [smollm_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert not c.advance(smollm_tokenizer.encode("\n")[0])


def test_hermes_parallel_blocks(smollm_tokenizer):
    c = ToolCallConstraint(smollm_tokenizer, WEATHER, "required", vocab_size=V, parallel=True,
                           hermes=True)
    text = "\n".join(f"<tool_call>\n{call(x)}\n</tool_call>" for x in ("Oslo", "Lima"))
    assert feed(c, text) and c.is_completed()
    assert len(parse_output(c.text()).tool_calls) == 2


def test_response_format_union_with_parallel_calls(smollm_tokenizer):
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
    c = ResponseFormatConstraint(smollm_tokenizer, fmt, tools=WEATHER, vocab_size=V, parallel=True)
    text = call("Oslo") + "\n" + call("Lima")
    assert feed(c, text) and c.is_completed()
    assert len(split_output(text, ["get_weather"], max_calls=c.max_calls).tool_calls) == 2
    # one call only without parallel
    assert split_output(text, ["get_weather"]).tool_calls == []
    one = ResponseFormatConstraint(smollm_tokenizer, fmt, tools=WEATHER, vocab_size=V)
    assert feed(one, call("Oslo")) and not one.advance(smollm_tokenizer.encode("\n")[0])


def test_repeated_root_renames_root_references_only_outside_literals():
    ebnf = 'root ::= (("{" "\\"root\\"" ": " root_1 "}") | ("[" root "]"))\nroot_1 ::= (([0-9]))\n'
    out = repeated_root(ebnf, 3, separator="\n")
    assert out.splitlines()[0] == 'root ::= ((asymagent_item ("\\n" asymagent_item){0, 2}))'
    assert 'asymagent_item ::= (("{" "\\"root\\"" ": " root_1 "}") | ("[" asymagent_item "]"))' in out
    assert split_literals('a "x]" [\\]"] b') == [("code", "a "), ("string", '"x]"'),
                                                  ("code", " "), ("class", '[\\]"]'),
                                                  ("code", " b")]
    with pytest.raises(ValueError):
        repeated_root(ebnf, 0)


def _call_msg(i: int, city: str) -> dict:
    return {"id": f"c{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


@pytest.mark.slow
def test_default_engine_calls_the_weather_tool_twice_for_two_cities():
    """Issue 27: "weather in Oslo and in Lima" under tool_choice required with
    parallel_tool_calls yields two calls in one turn (one earlier turn shows the 135M model the
    two-call form); without parallel calls the grammar admits exactly one."""
    from asymagent.engine import Engine

    engine = Engine.from_default()
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    messages = [
        {"role": "user", "content": "What is the weather in Paris and in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [_call_msg(1, "Paris"),
                                                            _call_msg(2, "Rome")]},
        {"role": "tool", "tool_call_id": "c1", "content": "Paris: 18 C, sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "Rome: 24 C, clear"},
        {"role": "assistant", "content": "Paris is 18 C and sunny; Rome is 24 C and clear."},
        {"role": "user", "content": "What is the weather in Oslo and in Lima?"}]
    two = engine.chat(messages, tools=tools, tool_choice="required", parallel_tool_calls=True,
                      max_new_tokens=64, mode="asym")
    assert two.finish_reason == "tool_calls" and two.text == ""
    assert [c["function"]["name"] for c in two.tool_calls] == ["get_weather"] * 2
    assert len({c["id"] for c in two.tool_calls}) == 2
    one = engine.chat(messages, tools=tools, tool_choice="required", parallel_tool_calls=False,
                      max_new_tokens=64, mode="asym")
    assert len(one.tool_calls) == 1
    assert one.tool_calls[0]["function"] == two.tool_calls[0]["function"]  # same first call
