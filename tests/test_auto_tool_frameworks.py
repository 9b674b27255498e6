"""The framework matrix under tool_choice "auto" (issue 57) on a tiny qwen2 server with Qwen2.5's template.

Each framework's default agent, given only a base URL and the model name, with one and with two
tools: the scripted model (tests/scripted_model.py) calls get_weather(Paris) once and answers
with the tool's result; a tool that raises gets the sorry answer; a second user turn calls again.
openai-agents (Responses and Chat Completions), LangChain `create_agent` with ChatOpenAI on both
APIs, pydantic-ai, litellm. A framework that is not installed is skipped with its name."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from scripted_model import scripted
from test_auto_tool_calls import ANSWER, QUESTION, SORRY, pair_script, qwen_tok, server  # noqa: F401 (fixtures)

ASK = QUESTION[0]["content"]
RESULT = "18 C, sunny"


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def make_tools(calls: list, two: bool, raises: bool) -> list:
    """Plain Python tools: get_weather (records its city; raises when asked) and get_time."""
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        if raises:
            raise RuntimeError("the weather service is down")
        return RESULT

    def get_time(tz: str) -> str:
        """Local time in a time zone."""
        calls.append(tz)
        return "12:00"

    return [get_weather, get_time] if two else [get_weather]


def openai_agents(url: str, fns: list, responses: bool) -> list[str]:
    need("agents")
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                        Runner, function_tool, set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="weather", instructions="Be brief.", model=kind(model="asymagent",
                  openai_client=client), tools=[function_tool(f) for f in fns],
                  model_settings=ModelSettings(max_tokens=64))
    async def two_turns():  # one event loop: the client's connections belong to it
        first = await Runner.run(agent, ASK, max_turns=4)
        again = first.to_input_list() + [{"role": "user", "content": "And now? Try again."}]
        second = await Runner.run(agent, again, max_turns=4)
        return [str(first.final_output), str(second.final_output)]

    return asyncio.run(two_turns())


def langchain(url: str, fns: list, responses: bool) -> list[str]:
    need("langchain_openai")
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="asymagent", max_retries=0,
                     max_tokens=64, use_responses_api=responses)
    agent = create_agent(llm, tools=[tool(f) for f in fns])
    state = agent.invoke({"messages": [{"role": "user", "content": ASK}]}, {"recursion_limit": 8})
    first = state["messages"][-1].text
    state = agent.invoke({"messages": state["messages"] + [
        {"role": "user", "content": "And now? Try again."}]}, {"recursion_limit": 8})
    return [first, state["messages"][-1].text]


def pydantic_ai(url: str, fns: list) -> list[str]:
    need("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("asymagent", provider=OpenAIProvider(base_url=url + "/v1",
                                                                  api_key="unused"))
    agent = Agent(model, tools=fns)
    first = agent.run_sync(ASK, model_settings={"max_tokens": 64})
    second = agent.run_sync("And now? Try again.", message_history=first.all_messages(),
                            model_settings={"max_tokens": 64})
    return [first.output, second.output]


def litellm(url: str, fns: list) -> list[str]:
    need("litellm")
    import json
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import (the
    import litellm as ll  # framework_matrix probe does the same): tests reach only 127.0.0.1
    from pydantic import TypeAdapter

    tools = [{"type": "function", "function": {
        "name": f.__name__, "description": f.__doc__,
        "parameters": TypeAdapter(f).json_schema()}} for f in fns]
    messages, answers = [{"role": "user", "content": ASK}], []
    for _ in range(2):
        for _ in range(3):
            r = ll.completion(model="openai/asymagent", api_base=url + "/v1", api_key="unused",
                              messages=messages, tools=tools, max_tokens=64)
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for call in msg.tool_calls:
                fn = {f.__name__: f for f in fns}[call.function.name]
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": fn(**json.loads(call.function.arguments))})
        answers.append(msg.content)
        messages.append({"role": "user", "content": "And now? Try again."})
    return answers


FRAMEWORKS = {
    "openai-agents/responses": lambda url, fns: openai_agents(url, fns, True),
    "openai-agents/chat": lambda url, fns: openai_agents(url, fns, False),
    "langchain/chat": lambda url, fns: langchain(url, fns, False),
    "langchain/responses": lambda url, fns: langchain(url, fns, True),
    "pydantic-ai/chat": pydantic_ai,
    "litellm/chat": litellm,
}


@pytest.mark.parametrize("two", [False, True], ids=["one-tool", "two-tools"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_default_agent_calls_once_and_answers(server, qwen_tok, monkeypatch, framework, two):
    scripted(monkeypatch, qwen_tok, pair_script)
    calls: list = []
    answers = FRAMEWORKS[framework](server, make_tools(calls, two, raises=False))
    assert calls == ["Paris", "Paris"], calls  # once per user turn, {"city": "Paris"}
    assert answers == [ANSWER, ANSWER]


@pytest.mark.parametrize("framework", ["openai-agents/responses", "openai-agents/chat"])
def test_a_tool_that_raises_gets_an_answer(server, qwen_tok, monkeypatch, framework):
    """openai-agents sends the tool's error back as its output (its default failure function)."""
    scripted(monkeypatch, qwen_tok, pair_script)
    calls: list = []
    answers = FRAMEWORKS[framework](server, make_tools(calls, False, raises=True))
    assert calls == ["Paris", "Paris"] and answers == [SORRY, SORRY]
