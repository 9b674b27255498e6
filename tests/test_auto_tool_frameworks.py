"""The framework matrix under tool_choice "auto" (issue 57) on a tiny qwen2 server with Qwen2.5's template.

Each framework's default agent, given only a base URL and the model name, with one and with two
tools: the scripted model (tests/scripted_model.py) calls get_weather(Paris) once and answers
with the tool's result; a tool that raises gets the sorry answer; a second user turn calls again.
openai-agents (Responses and Chat Completions), LangChain `create_agent` with ChatOpenAI on both
APIs, pydantic-ai, litellm (the runners are evals/probes/framework_matrix.py's, which runs them against
a real server with --auto). A framework that is not installed is skipped with its name."""

from __future__ import annotations

import importlib.util
import json

import pytest
from scripted_model import scripted
from test_auto_tool_calls import ANSWER, QUESTION, SORRY, pair_script, qwen_tok, server  # noqa: F401 (fixtures)

from asymagent.evals.probes import framework_matrix as fm

ASK = QUESTION[0]["content"]
assert ASK == fm.AUTO_QUESTION


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def make_tools(calls: list, two: bool, raises: bool) -> list:
    return fm.auto_tools(calls, two, raises)


def _runner(name: str):
    module, run = fm.AUTO_FRAMEWORKS[name]

    def go(url: str, fns: list) -> list[str]:
        need(module)
        return run(url, "asymagent", fns)

    return go


# the probe's runners (python -m asymagent.evals.probes.framework_matrix --auto runs the same
# against a real server: docs/serving.md, "Under auto on the reference pair")
FRAMEWORKS = {name: _runner(name) for name in fm.AUTO_FRAMEWORKS}


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


PLAIN_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def first_prompts(monkeypatch, qwen_tok, runs: dict) -> dict:
    """{name: the prompt ids the server rendered for run()'s first request} (the scripted model
    answers every request as the pair's script, so each run goes to its end)."""
    from asymagent.decoding.logit_processors import LogitProcessors

    scripted(monkeypatch, qwen_tok, pair_script)
    inner, seen = LogitProcessors.of, []

    def of(cls, sampling, prompt_ids=()):
        seen.append(list(prompt_ids))
        return inner(sampling, prompt_ids)

    monkeypatch.setattr(LogitProcessors, "of", classmethod(of))
    prompts = {}
    for name, run in runs.items():
        seen.clear()
        run()
        prompts[name] = seen[0]
    return prompts


def test_one_conversation_renders_one_prompt_on_every_path(server, qwen_tok, monkeypatch):
    """Issue 57, "one prompt for one conversation", with the frameworks' own requests: the
    server renders openai-agents' Responses and Chat Completions requests token for token alike,
    LangChain's on both APIs alike, and the openai client's on both alike; LangChain's differs from
    the openai client's only where its request does (the schema's key order). What openai-agents sends is its
    own: its instructions replace the template's default system prompt, and its tool schema has
    titles, `additionalProperties: false` and `strict` (why the pair answered it without calling,
    docs/serving.md); pydantic-ai sends `additionalProperties` and `strict` too."""
    from openai import OpenAI

    need("agents")
    need("langchain_openai")
    client = OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    flat = {"type": "function", **PLAIN_TOOL["function"]}
    runs = {
        "openai/chat": lambda: client.chat.completions.create(
            model="asymagent", messages=QUESTION, tools=[PLAIN_TOOL]),
        "openai/responses": lambda: client.responses.create(model="asymagent", input=ASK,
                                                            tools=[flat]),
        **{name: (lambda f=FRAMEWORKS[name]: f(server, make_tools([], False, False)))
           for name in ("openai-agents/responses", "openai-agents/chat", "langchain/chat",
                        "langchain/responses")}}
    prompts = first_prompts(monkeypatch, qwen_tok, runs)
    assert prompts["openai-agents/responses"] == prompts["openai-agents/chat"]
    assert prompts["langchain/chat"] == prompts["langchain/responses"]
    assert prompts["openai/chat"] == prompts["openai/responses"]
    # LangChain sends the same schema with its keys in another order (properties, required, type)
    # and the template writes that order (`tojson`): its prompt is the openai client's with that
    # one object reordered. (This test asserted the two prompts equal while the renderer's cache
    # was keyed on sorted JSON, which served the openai client's text to LangChain's request.)
    params = PLAIN_TOOL["function"]["parameters"]
    langchain_order = {k: params[k] for k in ("properties", "required", "type")}
    lc, oa = (qwen_tok.decode(prompts[k]) for k in ("langchain/chat", "openai/chat"))
    assert json.dumps(params) in oa and lc != oa
    assert lc == oa.replace(json.dumps(params), json.dumps(langchain_order))
    agents = qwen_tok.decode(prompts["openai-agents/chat"])
    assert agents.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"title": "City"' in agents and '"additionalProperties": false' in agents and \
        '"strict": true' in agents


def test_chat_asym_spec_renders_the_servers_prompt_on_both_apis(server, qwen_tok, monkeypatch):
    """Issue 57, "one prompt for one conversation", ChatAsymSpec included: one LangChain
    conversation (a question, the model's call, the tool's result) with one bound tool renders
    the same prompt ids through ChatAsymSpec (the engine in process) as through ChatOpenAI against
    the server, on chat completions and on the Responses API."""
    need("langchain_openai")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from asymagent.integrations.langchain import ChatAsymSpec
    from test_auto_tool_calls import qwen_engine

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "18 C, sunny"

    conv = [HumanMessage(ASK),
            AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}]),
            ToolMessage("18 C, sunny", tool_call_id="call_1")]
    local = ChatAsymSpec(engine=qwen_engine(qwen_tok), max_tokens=16, mode="full")

    def remote(responses: bool):
        return ChatOpenAI(base_url=server + "/v1", api_key="x", model="asymagent", max_retries=0,
                          max_tokens=16, use_responses_api=responses)

    runs = {"ChatAsymSpec": lambda: local.bind_tools([get_weather]).invoke(conv),
            "ChatOpenAI/chat": lambda: remote(False).bind_tools([get_weather]).invoke(conv),
            "ChatOpenAI/responses": lambda: remote(True).bind_tools([get_weather]).invoke(conv)}
    prompts = first_prompts(monkeypatch, qwen_tok, runs)
    assert prompts["ChatAsymSpec"] == prompts["ChatOpenAI/chat"] == prompts["ChatOpenAI/responses"]
    text = qwen_tok.decode(prompts["ChatAsymSpec"])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text
