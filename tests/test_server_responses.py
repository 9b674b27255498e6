"""POST /v1/responses (the OpenAI Responses API) through the official openai client against the real
server on 127.0.0.1: plain and streamed text (the documented event sequence), forced function
calls and their outputs fed back, text.format json_schema, previous_response_id from the bounded
store, and the refusals. Tiny random models with the real SmolLM2 tokenizer (test_server.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server import serving, tiny_engine

from asymagent.integrations.server import create_app
from asymagent.trace_capture import TraceWriter
from asymagent.traces import load_traces

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 12},
               "unit": {"type": "string", "enum": ["C", "F"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
REPORT = {"type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7},
                                           "ok": {"type": "boolean"}},
          "required": ["days", "ok"], "additionalProperties": False}


# Qwen2.5-(Coder-)Instruct's own chat template (the reference pair's), verbatim: tools in the system
# prompt, calls as <tool_call> blocks, tool results as <tool_response> blocks in a user turn.
QWEN25_TEMPLATE = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''


@pytest.fixture(scope="module")
def server(smollm_tokenizer, tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("traces")
    app = create_app(tiny_engine(smollm_tokenizer), max_queue=8, request_timeout=120,
                     default_max_tokens=12, max_model_len=1024,
                     trace_writer=TraceWriter(trace_dir))
    with serving(app) as url:
        yield url, trace_dir


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_plain_response(client):
    r = client.responses.create(model="asymagent", max_output_tokens=8, instructions="Be brief.",
                                input=[{"role": "developer", "content": "Answer in English."},
                                       {"role": "user", "content": [
                                           {"type": "input_text", "text": "Say hello."}]}])
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text == r.output[0].content[0].text
    assert 0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.model_extra["asymagent"]["stats"]["new_tokens"] == r.usage.output_tokens


def test_streamed_text_follows_the_documented_events(client):
    events = list(client.responses.create(model="asymagent", input="Tell me a story.",
                                          max_output_tokens=10, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) <= {"response.output_text.delta"}
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert done.text == deltas == final.output_text
    assert final.usage.output_tokens > 0 and events[0].response.status == "in_progress"


def test_forced_call_then_its_output(client, server):
    first = client.responses.create(model="asymagent", input="Weather in Oslo?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=40)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    args = json.loads(calls[0].arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("C", "F")
    # the openai-agents way: the whole conversation as items, the call's output appended
    items = [{"role": "user", "content": "Weather in Oslo?"},
             {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
              "arguments": calls[0].arguments},
             {"type": "function_call_output", "call_id": calls[0].call_id, "output": "12 C"}]
    second = client.responses.create(model="asymagent", input=items, tools=[WEATHER],
                                     tool_choice="none", max_output_tokens=6)
    assert [item.type for item in second.output] == ["message"]
    # the trace records the id the client saw
    traced = [ex.expected for ex in load_traces(server[1])]
    assert any(c["id"] == calls[0].call_id for m in traced for c in m.get("tool_calls") or [])


def test_streamed_call_arguments_and_trace_id(client, server):
    events = list(client.responses.create(model="asymagent", input="Weather in Lima?",
                                          tools=[WEATHER], tool_choice="required",
                                          max_output_tokens=40, stream=True))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added"
                 and e.item.type == "function_call")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    final = events[-1].response
    call = next(item for item in final.output if item.type == "function_call")
    assert kinds[-1] == "response.completed"
    assert done.arguments == deltas == call.arguments and json.loads(call.arguments)["unit"]
    assert added.item.call_id == call.call_id and done.item_id == call.id
    traced = [ex.expected for ex in load_traces(server[1])]
    assert any(c["id"] == call.call_id for m in traced for c in m.get("tool_calls") or [])


def test_json_schema_format(client):
    r = client.responses.create(model="asymagent", input="Report as JSON.", max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "report",
                                                 "schema": REPORT, "strict": True}})
    value = json.loads(r.output_text)
    assert set(value) == {"days", "ok"} and 1 <= value["days"] <= 7
    assert r.text.format.type == "json_schema"


def test_previous_response_id_continues_and_store_false_forgets(client):
    from openai import NotFoundError

    first = client.responses.create(model="asymagent", input="My name is Ada.", max_output_tokens=4)
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    second = client.responses.create(model="asymagent", input="What is my name?",
                                     previous_response_id=first.id, max_output_tokens=4)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens  # the history was read
    gone = client.responses.create(model="asymagent", input="x", max_output_tokens=2, store=False)
    with pytest.raises(NotFoundError, match="not found"):
        client.responses.create(model="asymagent", input="y", previous_response_id=gone.id,
                                max_output_tokens=2)


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "input_image_call"}]}, "input.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0.type"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"effort": "minimal"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"summary": "detailed"}}, "reasoning.summary"),
    ({"input": "hi", "text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"input": "hi", "context_management": []}, "context_management"),
])
def test_refusals_name_the_field(server, body, param):
    r = httpx.post(server[0] + "/v1/responses", json={"model": "asymagent", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param), r.json()


def test_neutral_reasoning_and_verbosity_are_accepted_and_echoed(server):
    """The openai-agents SDK's default model settings ask for no reasoning and low verbosity:
    values the served model can honour by doing nothing (OpenAI echoes them)."""
    body = {"model": "asymagent", "input": "hi", "max_output_tokens": 2,
            "reasoning": {"effort": "none"}, "text": {"verbosity": "low"}}
    r = httpx.post(server[0] + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["reasoning"] == {"effort": "none", "summary": None}
    assert out["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    plain = httpx.post(server[0] + "/v1/responses", json={"model": "asymagent", "input": "hi",
                                                          "max_output_tokens": 2}, timeout=60)
    assert plain.json()["reasoning"] is None and plain.json()["text"]["verbosity"] == "medium"
    chat = {"model": "asymagent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra, status in (({"reasoning_effort": "none", "verbosity": "low"}, 200),
                          ({"reasoning_effort": "low"}, 400), ({"verbosity": "loud"}, 400)):
        r = httpx.post(server[0] + "/v1/chat/completions", json={**chat, **extra}, timeout=60)
        assert r.status_code == status, r.text
        if status == 400:
            assert r.json()["error"]["param"] == next(iter(extra))


def test_unknown_route_names_the_path_and_the_endpoints(server):
    r = httpx.post(server[0] + "/v1/assistants", json={}, timeout=30)
    assert r.status_code == 404
    error = r.json()["error"]
    assert "/v1/assistants" in error["message"] and "POST /v1/responses" in error["message"]
    assert "POST /v1/chat/completions" in error["message"] and error["type"] == "not_found_error"


def test_models_carry_max_model_len(client):
    assert client.models.list().data[0].model_extra["max_model_len"] == 1024


def test_streamed_chat_call_id_is_the_traced_one(client, server):
    tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description",
                                                                      "parameters")}}
    ids = set()
    for chunk in client.chat.completions.create(
            model="asymagent", messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[tool], tool_choice="required", max_tokens=40, stream=True):
        for c in chunk.choices:
            ids |= {tc.id for tc in c.delta.tool_calls or [] if tc.id}
    assert len(ids) >= 1
    traced = {c["id"] for ex in load_traces(server[1]) for c in ex.expected.get("tool_calls") or []}
    assert ids <= traced


def test_each_refusal_is_logged_at_info_with_its_reason(server):
    import logging

    from asymagent.integrations.server.errors import refusals

    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    level = refusals.level
    refusals.addHandler(handler)
    refusals.setLevel(logging.INFO)
    try:
        r = httpx.post(server[0] + "/v1/chat/completions", timeout=30, json={
            "model": "asymagent", "messages": [{"role": "user", "content": "x"}],
            "temperature": 7})
        assert r.status_code == 400
        httpx.get(server[0] + "/v1/nowhere", timeout=30)
    finally:
        refusals.removeHandler(handler)
        refusals.setLevel(level)
    said = [rec.getMessage() for rec in records]
    assert all(rec.levelno == logging.INFO for rec in records)
    assert any(m.startswith("400 invalid_value (temperature)") and "temperature" in m for m in said)
    assert any(m.startswith("404 unknown_url") and "/v1/nowhere" in m for m in said)


def test_agents_sdk_items_render_as_the_qwen_template_renders_them(smollm_tokenizer):
    """The input the openai-agents SDK's default agent sends on its second turn (instructions, the
    user message, its function_call item with id and status, the function_call_output) renders
    into the Qwen2.5 template exactly as the template renders the same conversation (with the
    arguments as a dict, transformers' convention: the template would JSON-dump a string again)."""
    import copy

    from asymagent.chat.chat_format import ChatFormat
    from asymagent.integrations.server.response_items import ResponseRequest, input_messages

    tok = copy.deepcopy(smollm_tokenizer)
    tok.chat_template = QWEN25_TEMPLATE
    body = {"model": "asymagent", "instructions": "You are a helpful assistant.",
            "tools": [{**WEATHER, "strict": True}], "input": [
                {"content": "What is the weather in Oslo?", "role": "user"},
                {"arguments": '{"city": "Oslo", "unit": "C"}', "call_id": "call_1",
                 "name": "get_weather", "type": "function_call", "id": "fc_1",
                 "status": "completed"},
                {"call_id": "call_1", "output": "12 C and clear in Oslo",
                 "type": "function_call_output"}]}
    req = ResponseRequest.model_validate(body)
    messages = [{"role": "system", "content": req.instructions}] + input_messages(req)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    ours = ChatFormat(tok).render_text(messages, req.chat_tools())
    hf = copy.deepcopy(messages)
    for call in hf[2]["tool_calls"]:
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    theirs = tok.apply_chat_template(hf, tools=req.chat_tools(), tokenize=False,
                                     add_generation_prompt=True)
    assert ours == theirs
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
            '"Oslo", "unit": "C"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
            '12 C and clear in Oslo\n</tool_response><|im_end|>\n<|im_start|>assistant\n') in ours
