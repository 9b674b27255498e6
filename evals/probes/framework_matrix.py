"""Which agent frameworks work against a running `asymagent serve`, on its Chat Completions and Responses paths.

    asymagent serve --port 8000 &
    python -m asymagent.evals.probes.framework_matrix --url http://127.0.0.1:8000 [--model asymagent]

    python -m asymagent.evals.probes.framework_matrix --url http://127.0.0.1:8000 --auto

Each framework is used as its docs show for an OpenAI-compatible server, unmodified: the
official `openai` client, pydantic-ai (`OpenAIChatModel` / `OpenAIResponsesModel`), the
openai-agents SDK (a model given by name with the default client pointed at the server, which
is its Responses path; `OpenAIChatCompletionsModel` for Chat), litellm (`completion` /
`responses`), langchain-openai (`ChatOpenAI`, `use_responses_api=True`) in a LangGraph agent
(`langchain.agents.create_agent`), instructor (`from_openai`, a pydantic model). A check works when the
framework's call returns its own result type without an error: a forced tool call where the
framework can force one, and a plain answer. It prints a markdown table framework x path x
works (a framework that is not installed: "not installed"). Talks HTTP only (127.0.0.1), so it
imports nothing of the server.

`--auto`: issue 57's matrix under `tool_choice` "auto" instead (the runners the tests use on a
tiny model, tests/test_auto_tool_frameworks.py): each framework's DEFAULT agent (openai-agents on
Responses and Chat Completions, LangChain `create_agent` on both APIs, pydantic-ai, litellm's
completion loop) with one tool `get_weather(city)` (and with a second tool, `get_time(tz)`),
asked "What's the weather in Paris? Answer in one sentence.", then a second user turn; plus the
openai client streamed vs not. A row meets the target when the agent called get_weather once
per user turn with {"city": "Paris"} and both answers carry the tool's result ("18 C").
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
import traceback

from asymagent.evals.probes.harness import finish, parser

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}
QUESTION = "What is the weather in Oslo? Use the tool."
MAX_TOKENS = 48


def get_weather(city: str, unit: str) -> str:
    """Current weather in a city."""
    return f"12 {unit} and clear in {city}"


# -------------------------------------------------------------------------------- the checks


def openai_chat(url: str, model: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "function": {"name": "get_weather",
                                             "description": "Current weather in a city.",
                                             "parameters": WEATHER_PARAMS}}
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                       tools=[tool], tool_choice="required", max_tokens=MAX_TOKENS)
    call = r.choices[0].message.tool_calls[0]
    json.loads(call.function.arguments)
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None
    return f"forced call {call.function.name}; stream with usage"


def openai_responses(url: str, model: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
            "parameters": WEATHER_PARAMS, "strict": True}
    r = client.responses.create(model=model, input=QUESTION, tools=[tool], tool_choice="required",
                                max_output_tokens=MAX_TOKENS)
    call = next(item for item in r.output if item.type == "function_call")
    json.loads(call.arguments)
    follow = client.responses.create(model=model, previous_response_id=r.id, max_output_tokens=8,
                                     input=[{"type": "function_call_output",
                                             "call_id": call.call_id, "output": "12 C"}])
    events = [e.type for e in client.responses.create(model=model, input="Hi", stream=True,
                                                      max_output_tokens=8)]
    assert events[0] == "response.created" and events[-1] in ("response.completed",
                                                              "response.incomplete")
    return f"forced call {call.name}; its output via previous_response_id ({follow.status}); stream"


def _pydantic_ai(url: str, model: str, responses: bool) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=url + "/v1", api_key="unused")
    if responses:
        from pydantic_ai.models.openai import OpenAIResponsesModel as Model
    else:
        from pydantic_ai.models.openai import OpenAIChatModel as Model
    agent = Agent(Model(model, provider=provider), tools=[get_weather])
    result = agent.run_sync(QUESTION, model_settings={"max_tokens": MAX_TOKENS})
    assert isinstance(result.output, str)
    return f"Agent.run_sync -> {len(result.output)} chars, {len(result.all_messages())} messages"


def pydantic_ai_chat(url: str, model: str) -> str:
    return _pydantic_ai(url, model, responses=False)


def pydantic_ai_responses(url: str, model: str) -> str:
    return _pydantic_ai(url, model, responses=True)


def _openai_agents(url: str, model: str, responses: bool) -> str:
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_default_openai_api, set_default_openai_client, set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    settings = ModelSettings(max_tokens=MAX_TOKENS, tool_choice="required")
    if responses:  # the SDK's default path: a model given by name, the default client
        set_default_openai_client(client, use_for_tracing=False)
        set_default_openai_api("responses")
        llm = model
    else:
        llm = OpenAIChatCompletionsModel(model=model, openai_client=client)
    # the SDK's documented way to end a forced-tool agent: the first tool result is the answer
    agent = Agent(name="weather", instructions="Answer with the tool.", model=llm,
                  tools=[function_tool(get_weather)], model_settings=settings,
                  tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=3))
    calls = [item for item in result.new_items if item.type == "tool_call_item"]
    assert calls and "and clear in" in str(result.final_output), result.final_output
    return f"Runner.run: tool call -> final output {str(result.final_output)!r}"


def openai_agents_chat(url: str, model: str) -> str:
    return _openai_agents(url, model, responses=False)


def openai_agents_responses(url: str, model: str) -> str:
    return _openai_agents(url, model, responses=True)


def litellm_chat(url: str, model: str) -> str:
    import litellm

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}
    r = litellm.completion(model=f"openai/{model}", api_base=url + "/v1", api_key="unused",
                           messages=[{"role": "user", "content": QUESTION}], tools=[tool],
                           tool_choice="required", max_tokens=MAX_TOKENS)
    call = r.choices[0].message.tool_calls[0]
    json.loads(call.function.arguments)
    return f"completion: forced call {call.function.name}"


def litellm_responses(url: str, model: str) -> str:
    import litellm

    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS}
    r = litellm.responses(model=f"openai/{model}", api_base=url + "/v1", api_key="unused",
                          input=QUESTION, tools=[tool], tool_choice="required",
                          max_output_tokens=MAX_TOKENS)
    call = next(item for item in r.output if getattr(item, "type", None) == "function_call")
    json.loads(call.arguments)
    return f"responses: forced call {call.name}"


def _langchain(url: str, model: str, responses: bool) -> str:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=model, max_retries=0,
                     max_tokens=MAX_TOKENS, use_responses_api=responses)
    forced = llm.bind_tools([tool(get_weather)], tool_choice="get_weather").invoke(QUESTION)
    assert forced.tool_calls and forced.tool_calls[0]["name"] == "get_weather"
    agent = create_agent(llm, tools=[tool(get_weather)])
    state = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]},
                         {"recursion_limit": 6})
    return (f"bind_tools forced call; create_agent (LangGraph) -> {len(state['messages'])} "
            "messages")


def langchain_chat(url: str, model: str) -> str:
    return _langchain(url, model, responses=False)


def langchain_responses(url: str, model: str) -> str:
    return _langchain(url, model, responses=True)


def _instructor(url: str, model: str, responses: bool) -> str:
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        city: str = Field(max_length=12)
        days: int = Field(ge=1, le=7)

    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    mode = instructor.Mode.RESPONSES_TOOLS if responses else instructor.Mode.TOOLS
    patched = instructor.from_openai(client, mode=mode)
    w = patched.create(model=model, response_model=Weather, max_retries=0,
                       messages=[{"role": "user", "content": "Weather in Oslo, 3 days."}],
                       **({"max_output_tokens": MAX_TOKENS} if responses
                          else {"max_tokens": MAX_TOKENS}))
    return f"response_model -> {type(w).__name__}(days={w.days})"


def instructor_chat(url: str, model: str) -> str:
    return _instructor(url, model, responses=False)


def instructor_responses(url: str, model: str) -> str:
    return _instructor(url, model, responses=True)


# -------------------------------------------------------------------------------- under auto

AUTO_QUESTION = "What's the weather in Paris? Answer in one sentence."
AUTO_AGAIN = "And now? Try again."
AUTO_RESULT = "18 C, sunny"
AUTO_MAX_TOKENS = 64


def auto_tools(calls: list, two: bool, raises: bool) -> list:
    """Plain Python tools: get_weather (records its city; raises when asked) and get_time."""
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        if raises:
            raise RuntimeError("the weather service is down")
        return AUTO_RESULT

    def get_time(tz: str) -> str:
        """Local time in a time zone."""
        calls.append(tz)
        return "12:00"

    return [get_weather, get_time] if two else [get_weather]


def auto_openai_agents(url: str, model: str, fns: list, responses: bool) -> list[str]:
    """openai-agents' default agent (tool errors go back to the model, its default), 2 turns."""
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                        Runner, function_tool, set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="weather", instructions="Be brief.", model=kind(model=model,
                  openai_client=client), tools=[function_tool(f) for f in fns],
                  model_settings=ModelSettings(max_tokens=AUTO_MAX_TOKENS))

    async def two_turns():  # one event loop: the client's connections belong to it
        first = await Runner.run(agent, AUTO_QUESTION, max_turns=4)
        again = first.to_input_list() + [{"role": "user", "content": AUTO_AGAIN}]
        second = await Runner.run(agent, again, max_turns=4)
        return [str(first.final_output), str(second.final_output)]

    return asyncio.run(two_turns())


def auto_langchain(url: str, model: str, fns: list, responses: bool) -> list[str]:
    """LangChain's `create_agent` with ChatOpenAI (Chat Completions or Responses), 2 turns."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=model, max_retries=0,
                     max_tokens=AUTO_MAX_TOKENS, use_responses_api=responses)
    agent = create_agent(llm, tools=[tool(f) for f in fns])
    state = agent.invoke({"messages": [{"role": "user", "content": AUTO_QUESTION}]},
                         {"recursion_limit": 8})
    first = state["messages"][-1].text
    state = agent.invoke({"messages": state["messages"] + [
        {"role": "user", "content": AUTO_AGAIN}]}, {"recursion_limit": 8})
    return [first, state["messages"][-1].text]


def auto_pydantic_ai(url: str, model: str, fns: list) -> list[str]:
    """pydantic-ai's Agent on OpenAIChatModel, 2 turns."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    llm = OpenAIChatModel(model, provider=OpenAIProvider(base_url=url + "/v1", api_key="unused"))
    agent = Agent(llm, tools=fns)
    first = agent.run_sync(AUTO_QUESTION, model_settings={"max_tokens": AUTO_MAX_TOKENS})
    second = agent.run_sync(AUTO_AGAIN, message_history=first.all_messages(),
                            model_settings={"max_tokens": AUTO_MAX_TOKENS})
    return [first.output, second.output]


def auto_litellm(url: str, model: str, fns: list) -> list[str]:
    """litellm.completion in the usual tool loop (at most 3 model calls per user turn), 2 turns."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm as ll
    from pydantic import TypeAdapter

    tools = [{"type": "function", "function": {
        "name": f.__name__, "description": f.__doc__,
        "parameters": TypeAdapter(f).json_schema()}} for f in fns]
    messages, answers = [{"role": "user", "content": AUTO_QUESTION}], []
    for _ in range(2):
        for _ in range(3):
            r = ll.completion(model=f"openai/{model}", api_base=url + "/v1", api_key="unused",
                              messages=messages, tools=tools, max_tokens=AUTO_MAX_TOKENS)
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for call in msg.tool_calls:
                fn = {f.__name__: f for f in fns}[call.function.name]
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": fn(**json.loads(call.function.arguments))})
        answers.append(msg.content)
        messages.append({"role": "user", "content": AUTO_AGAIN})
    return answers


# framework/path -> (the module that must be importable, runner(url, model, fns) -> 2 answers)
AUTO_FRAMEWORKS = {
    "openai-agents/responses": ("agents", lambda u, m, f: auto_openai_agents(u, m, f, True)),
    "openai-agents/chat": ("agents", lambda u, m, f: auto_openai_agents(u, m, f, False)),
    "langchain/chat": ("langchain_openai", lambda u, m, f: auto_langchain(u, m, f, False)),
    "langchain/responses": ("langchain_openai", lambda u, m, f: auto_langchain(u, m, f, True)),
    "pydantic-ai/chat": ("pydantic_ai", auto_pydantic_ai),
    "litellm/chat": ("litellm", auto_litellm),
}


def auto_row(framework: str, url: str, model: str, two: bool) -> dict:
    """One framework's default agent under auto: {"framework", "tools", "calls", "answers",
    "met", "detail", "seconds"}; met: get_weather(Paris) once per user turn and the tool's
    result in both answers."""
    module, run = AUTO_FRAMEWORKS[framework]
    row = {"framework": framework, "tools": 2 if two else 1, "calls": [], "answers": [],
           "met": None, "detail": "not installed", "seconds": 0.0}
    if not installed(module):
        return row
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    start = time.monotonic()
    try:
        row["answers"] = [str(a) for a in run(url, model, auto_tools(row["calls"], two, False))]
        row["detail"] = ""
    except Exception as exc:  # the row says why it failed
        row["detail"] = traceback.format_exception_only(type(exc), exc)[-1].strip()[:160]
    row["met"] = row["calls"] == ["Paris", "Paris"] and len(row["answers"]) == 2 and \
        all("18" in a for a in row["answers"])
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def streamed(client, raw: bool = False, **kwargs) -> tuple[str, list, list]:
    """(content, tool calls as (name, arguments), every content delta) of a streamed chat
    request; `raw`: the arguments as the string the deltas add up to (else parsed)."""
    content, deltas, calls = "", [], {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.content:
            deltas.append(d.content)
            content += d.content
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, ["", ""])
            entry[0] += (tc.function.name or "") if tc.function else ""
            entry[1] += (tc.function.arguments or "") if tc.function else ""
    return content, [(n, a if raw else json.loads(a)) for n, a in calls.values()], deltas


def auto_stream_row(url: str, model: str) -> dict:
    """The openai client, one tool, streamed and not: the same content and calls (arguments as
    strings), and no content delta holding call syntax."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    kwargs = dict(model=model, messages=[{"role": "user", "content": AUTO_QUESTION}],
                  tools=[tool], tool_choice="auto", max_tokens=AUTO_MAX_TOKENS, temperature=0.0)
    msg = client.chat.completions.create(**kwargs).choices[0].message
    plain = (msg.content or "", [(c.function.name, c.function.arguments)
                                 for c in msg.tool_calls or []])
    content, calls, deltas = streamed(client, raw=True, **kwargs)
    stream = (content, calls)
    syntax = [d for d in deltas if any(s in d for s in ("<tool_call>", "<tools>", '{"name"', "</"))]
    return {"framework": "openai client stream", "tools": 1, "plain": plain, "stream": stream,
            "met": stream == plain and not syntax and plain[1] == [
                ("get_weather", '{"city": "Paris"}')],
            "detail": f"content deltas with call syntax: {syntax}" if syntax else ""}


def auto_table(rows: list[dict]) -> str:
    mark = {True: "yes", False: "**no**", None: "not installed"}
    lines = ["| framework / path | tools | met | get_weather calls | answers (turn 1; turn 2) |",
             "|---|---|---|---|---|"]
    for r in rows:
        answers = "; ".join(repr(a)[:90] for a in r.get("answers", [])) or r.get("detail", "")
        if "plain" in r:
            answers = f"plain {r['plain']!r}, streamed {r['stream']!r} {r['detail']}"[:300]
        lines.append(f"| {r['framework']} | {r['tools']} | {mark[r['met']]} | "
                     f"{r.get('calls', '')} | {answers.replace('|', '/')} |")
    return "\n".join(lines)


def auto_main(url: str, model: str, json_path) -> int:
    rows = [auto_stream_row(url, model)]
    print(f"openai client stream: {rows[0]['met']}", flush=True)
    for two in (False, True):
        for framework in AUTO_FRAMEWORKS:
            rows.append(auto_row(framework, url, model, two))
            r = rows[-1]
            print(f"{framework:26s} tools={r['tools']} met={r['met']} calls={r['calls']} "
                  f"({r['seconds']} s) {r['answers']} {r['detail']}", flush=True)
    print(auto_table(rows))
    return finish(rows, json_path, indent=1, status=0)


# framework -> (the module that must be importable, {path: check})
FRAMEWORKS = {
    "openai": ("openai", {"chat": openai_chat, "responses": openai_responses}),
    "pydantic-ai": ("pydantic_ai", {"chat": pydantic_ai_chat, "responses": pydantic_ai_responses}),
    "openai-agents": ("agents", {"chat": openai_agents_chat, "responses": openai_agents_responses}),
    "litellm": ("litellm", {"chat": litellm_chat, "responses": litellm_responses}),
    "langchain-openai + langgraph": ("langchain_openai", {"chat": langchain_chat,
                                                          "responses": langchain_responses}),
    "instructor": ("instructor", {"chat": instructor_chat, "responses": instructor_responses}),
}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run_check(framework: str, path: str, url: str, model: str) -> dict:
    """{"framework", "path", "works": True/False/None (not installed), "detail", "seconds"}."""
    module, checks = FRAMEWORKS[framework]
    row = {"framework": framework, "path": path, "works": None, "detail": "not installed",
           "seconds": 0.0}
    if not installed(module):
        return row
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    start = time.monotonic()
    try:
        row.update(works=True, detail=checks[path](url, model))
    except Exception as exc:  # the row says why it failed
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        row.update(works=False, detail=last[:160])
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def table(rows: list[dict]) -> str:
    mark = {True: "yes", False: "**no**", None: "not installed"}
    lines = ["| framework | path | works | what ran |", "|---|---|---|---|"]
    for r in rows:
        detail = r["detail"].replace("|", "/")
        lines.append(f"| {r['framework']} | {r['path']} | {mark[r['works']]} | {detail} |")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    p = parser(__doc__, "framework_matrix", json_help="also write the rows as JSON to this file")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (loopback)")
    p.add_argument("--model", default="asymagent", help="the served model name")
    p.add_argument("--auto", action="store_true",
                   help="issue 57's matrix under tool_choice auto (default agents) instead")
    args = p.parse_args(argv)
    host = args.url.split("://", 1)[-1].split("/")[0].rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        p.error(f"--url must be a loopback address, got {args.url}")
    if args.auto:
        return auto_main(args.url.rstrip("/"), args.model, args.json)
    rows = []
    for framework, (_, checks) in FRAMEWORKS.items():
        for path in checks:
            rows.append(run_check(framework, path, args.url.rstrip("/"), args.model))
            print(f"{framework:30s} {path:9s} {rows[-1]['works']} ({rows[-1]['seconds']} s)",
                  flush=True)
    print(table(rows))
    return finish(rows, args.json, indent=1, status=0 if all(r["works"] is not False for r in rows) else 1)


if __name__ == "__main__":
    raise SystemExit(main())
