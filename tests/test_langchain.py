"""ChatAsymSpec on a tiny random engine: LangChain's standard unit tests, streaming, forced calls."""

from __future__ import annotations

from functools import lru_cache

import pytest
from conftest import make_tiny_llama
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import BaseModel, Field

from asymagent.integrations.langchain import ChatAsymSpec, normalize_tool_choice
from asymagent.agents.tools import schema_errors

V = 49152  # the real SmolLM2 tokenizer's vocabulary


@lru_cache(maxsize=1)
def tiny_engine():
    from asymagent.engine import Engine
    from asymagent.modeling.loading import load_default_verifier
    from asymagent.spec_config import SpecConfig

    tok = load_default_verifier().tokenizer
    return Engine(verifier=make_tiny_llama(vocab_size=V, seed=1),
                  drafter=make_tiny_llama(vocab_size=V, layers=1, seed=2),
                  tokenizer=tok, spec=SpecConfig(k=3))


class ChatAsymSpecFlags:
    """What the unit and integration suites of langchain-tests share about ChatAsymSpec."""

    @property
    def chat_model_class(self):
        return ChatAsymSpec

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False  # one local engine: a per-call `model=` cannot switch weights


class TestChatAsymSpecStandard(ChatAsymSpecFlags, ChatModelUnitTests):
    @property
    def chat_model_params(self) -> dict:
        return {"engine": tiny_engine()}


class GetWeather(BaseModel):
    """Weather forecast for a city."""

    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


class Search(BaseModel):
    """Search the web."""

    query: str = Field(max_length=20)


# Bounded strings and integers: a random model may otherwise write one string until the token
# budget ends, and a call cut by max_tokens is (rightly) an invalid call, not a valid one.
TOOLS = [GetWeather, Search]
SCHEMAS = {t.__name__: t.model_json_schema() for t in TOOLS}


def llm(**kw) -> ChatAsymSpec:
    return ChatAsymSpec(engine=tiny_engine(), max_tokens=kw.pop("max_tokens", 40), **kw)


def aggregate(chunks):
    out = chunks[0]
    for c in chunks[1:]:
        out = out + c
    return out


def test_invoke_text_usage_and_stats():
    msg = llm(mode="asym").invoke([HumanMessage("Say hi.")])
    assert isinstance(msg, AIMessage)
    s = msg.response_metadata["step_stats"]
    assert s["mode"] == "asym" and s["new_tokens"] >= 1
    assert msg.usage_metadata["output_tokens"] == s["new_tokens"]
    assert msg.usage_metadata["input_tokens"] == s["full_context_tokens"] > 0
    assert msg.usage_metadata["total_tokens"] == s["full_context_tokens"] + s["new_tokens"]


@pytest.mark.parametrize("choice", [None, "any"])
def test_stream_aggregates_to_invoke(choice):
    model = llm(mode="spec")
    if choice:
        model = model.bind_tools(TOOLS, tool_choice=choice)
    prompt = [HumanMessage("Weather in Paris for two days?")]
    invoked = model.invoke(prompt)
    chunks = list(model.stream(prompt))
    agg = aggregate(chunks)
    assert isinstance(agg, AIMessageChunk)
    assert agg.content == invoked.content
    strip = lambda calls: [(c["name"], c["args"]) for c in calls]  # ids are fresh per call
    assert strip(agg.tool_calls) == strip(invoked.tool_calls)
    # cache_read (prefix reuse) depends on what the previous call left cached; the rest must match
    plain = lambda u: {k: v for k, v in u.items() if k != "input_token_details"}
    assert plain(agg.usage_metadata) == plain(invoked.usage_metadata)
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata
    assert all(c.usage_metadata is None for c in chunks[:-1])  # usage only once (not summed)
    if choice:
        tcc = [c.tool_call_chunks[0] for c in chunks if c.tool_call_chunks]
        assert tcc and all(t["index"] == 0 for t in tcc)  # one call -> index 0 throughout
        assert tcc[0]["id"] and tcc[0]["name"] in SCHEMAS
        assert all(t["id"] is None and t["name"] is None for t in tcc[1:])
        assert agg.response_metadata["finish_reason"] == "tool_calls"


def test_forced_tool_choice_always_schema_valid():
    names = set()
    for seed in range(8):  # sampled at temperature 1: a random model writes varied calls
        model = llm(mode="asym", temperature=1.0, seed=seed)
        choice = "any" if seed % 2 else "GetWeather"
        msg = model.bind_tools(TOOLS, tool_choice=choice).invoke("Weather?")
        assert len(msg.tool_calls) == 1 and not msg.invalid_tool_calls, msg
        call = msg.tool_calls[0]
        if choice == "GetWeather":
            assert call["name"] == "GetWeather"
        assert not schema_errors(call["args"], SCHEMAS[call["name"]]), call
        names.add(call["name"])
    assert "GetWeather" in names


def test_tool_messages_round_trip():
    model = llm(mode="full").bind_tools([GetWeather])
    history = [HumanMessage("Weather?"),
               AIMessage("", tool_calls=[{"name": "GetWeather", "id": "call_1",
                                          "args": {"city": "Rome", "days": 2}}]),
               ToolMessage("Rome: sunny for 2 days", tool_call_id="call_1")]
    msg = model.invoke(history)
    # the engine saw the whole history: prompt tokens grow with the tool exchange
    short = model.invoke(history[:1])
    assert msg.usage_metadata["input_tokens"] > short.usage_metadata["input_tokens"]


def test_bad_input():
    from asymagent.modeling.loading import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="not found"):  # before any weights load
        ChatAsymSpec(model="./no-such-model-dir")
    with pytest.raises(ValueError, match="mode"):
        ChatAsymSpec(engine=tiny_engine(), mode="fast")
    with pytest.raises(ValueError, match="not among the bound tools"):
        llm().bind_tools([GetWeather], tool_choice="Search")
    with pytest.raises(ValueError, match="unsupported generation arguments"):
        llm().invoke("hi", frobnicate=1)
    tools = [{"type": "function", "function": {"name": "a"}}]
    assert normalize_tool_choice(True, tools) == {"type": "function", "function": {"name": "a"}}
    assert normalize_tool_choice("required", tools) == "required"


def test_profile():
    p = llm().profile
    assert p["tool_calling"] and p["tool_choice"] and p["max_input_tokens"] == 2048  # tiny config


def test_with_structured_output_is_constrained():
    """LangChain's default structured output binds the schema as a forced tool: always valid."""
    for seed in range(3):
        out = llm(temperature=1.0, seed=seed).with_structured_output(GetWeather).invoke("Rome?")
        assert isinstance(out, GetWeather) and 1 <= out.days <= 7 and len(out.city) <= 12
