"""End-to-end tests of `asymagent serve`: real Engine (tiny random models + the real SmolLM2
tokenizer), real uvicorn on 127.0.0.1, driven by the official openai client, langchain-openai and
raw HTTP. Every server is started in-process on a free port and stopped at the end."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from asymagent.integrations.server import create_app
from asymagent.agents.tools import schema_errors
from conftest import make_tiny_llama
from server_probe import metric

VOCAB = 49152  # SmolLM2's vocabulary, so the real tokenizer drives the tiny models
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"]}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def tiny_engine(tokenizer, hidden: int = 64, kv_heads: int = 2, max_sessions: int = 4,
                max_positions: int = 2048):
    from asymagent.engine import Engine

    verifier = make_tiny_llama(vocab_size=VOCAB, hidden=hidden, kv_heads=kv_heads, seed=0,
                               max_positions=max_positions)
    drafter = make_tiny_llama(vocab_size=VOCAB, hidden=hidden, kv_heads=kv_heads, layers=1,
                              seed=1, max_positions=max_positions)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=tokenizer,
                  max_sessions=max_sessions)


@contextlib.contextmanager
def serving(app):
    """Run `app` with uvicorn on a free 127.0.0.1 port in a thread; yield its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30  # startup is ~0.1 s; 30 s bounds a wedged start
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server failed to start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def server(smollm_tokenizer):
    engine = tiny_engine(smollm_tokenizer)
    app = create_app(engine, max_queue=8, request_timeout=120, default_max_tokens=16)
    with serving(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_client_plain(client, server):
    assert [m.id for m in client.models.list().data] == ["asymagent"]
    r = client.chat.completions.create(model="asymagent", messages=USER, max_tokens=8, seed=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert 1 <= r.usage.completion_tokens <= 8  # max_tokens bounds the completion
    ext = r.model_extra["asymagent"]
    assert ext["mode"] == "asym" and ext["stats"]["new_tokens"] == r.usage.completion_tokens
    assert r.usage.model_extra["drafted_tokens"] == ext["stats"]["drafted"]
    # Same seed, same request -> same output (greedy default; determinism rule).
    again = client.chat.completions.create(model="asymagent", messages=USER, max_tokens=8, seed=0)
    assert again.choices[0].message.content == choice.message.content
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok"


def test_tool_choice_required_gives_a_schema_valid_call(client):
    r = client.chat.completions.create(model="asymagent", messages=USER, tools=[WEATHER],
                                       tool_choice="required", max_tokens=48)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    assert schema_errors(json.loads(call.function.arguments),
                         WEATHER["function"]["parameters"]) == []


def test_stream_helper_assembles_a_streamed_tool_call(client):
    with client.chat.completions.stream(
            model="asymagent", messages=USER, tools=[WEATHER], max_tokens=48,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert schema_errors(json.loads(call.function.arguments),
                         WEATHER["function"]["parameters"]) == []
    # The raw chunks follow OpenAI's shape: index always; id/type/name only in the first delta.
    chunks = list(client.chat.completions.create(
        model="asymagent", messages=USER, tools=[WEATHER], tool_choice="required",
        max_tokens=48, stream=True))
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert len(deltas) >= 2 and all(d.index == 0 for d in deltas)
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name
    assert all(d.id is None and d.function.name is None for d in deltas[1:])


def test_stream_include_usage(client):
    chunks = list(client.chat.completions.create(
        model="asymagent", messages=USER, max_tokens=8, stream=True,
        stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens >= 1
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")


def test_langchain_create_agent_with_a_real_tool(server):
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls = []

    @tool
    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city."""
        calls.append((city, unit))
        return f"Sunny, 21 {unit} in {city}"

    @wrap_model_call
    def force_one_call(request, handler):
        # A random tiny model only calls a tool when forced: force the first turn, forbid after.
        done = any(isinstance(m, ToolMessage) for m in request.messages)
        return handler(request.override(tool_choice="none" if done else "required"))

    model = ChatOpenAI(base_url=server[0] + "/v1", api_key="unused", model="asymagent",
                       max_tokens=24, temperature=0, stream_usage=True, max_retries=0)
    agent = create_agent(model, tools=[get_weather], middleware=[force_one_call])
    out = agent.invoke({"messages": [{"role": "user", "content": "Weather in Paris?"}]},
                       {"recursion_limit": 8})
    kinds = [type(m).__name__ for m in out["messages"]]
    # user -> forced call -> tool result -> final answer (tool_choice none): 4 messages.
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert len(calls) == 1
    assert out["messages"][1].tool_calls[0]["name"] == "get_weather"
    assert out["messages"][-1].usage_metadata["output_tokens"] >= 1


def test_growing_conversation_reuses_its_kv_prefix(server):
    url = server[0] + "/v1/chat/completions"
    convo = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "Plan a trip to Rome in three steps."}]
    first = httpx.post(url, timeout=60, json={"model": "asymagent", "messages": convo,
                                              "max_tokens": 4}).json()
    convo += [{"role": "assistant", "content": "Step one: book flights."},
              {"role": "user", "content": "And step two?"}]
    second = httpx.post(url, timeout=60, json={"model": "asymagent", "messages": convo,
                                               "max_tokens": 4}).json()
    s1, s2 = first["asymagent"]["stats"], second["asymagent"]["stats"]
    assert s2["full_context_tokens"] > s1["full_context_tokens"]
    # Same conversation -> same cache session: the second call prefills only what is new (the
    # two appended messages + the generation prompt), not the whole history again.
    new_tokens = s2["full_context_tokens"] - s1["full_context_tokens"]
    assert s2["verifier_prefill_tokens"] <= new_tokens + s1["new_tokens"] + 8
    assert s2["verifier_prefill_tokens"] < s2["full_context_tokens"]


def test_a_history_over_the_context_is_served_where_the_verifier_reads_it_compressed(server):
    # A tool output of ~3000 tokens: the full view is over the tiny models' 2048 positions, its
    # compressed view (head, tail and the kept rows) is not. Modes asym (the default) and
    # compressed answer; full and spec, whose verifier would read the whole history, get 400.
    url = server[0] + "/v1/chat/completions"
    rows = "\n".join(f"row {i}: order ORD-{10000 + i} shipped to depot {i % 7}" for i in range(220))
    convo = [{"role": "user", "content": "List the orders."},
             {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "list_orders", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": rows}]
    body = {"model": "asymagent", "messages": convo, "max_tokens": 4}
    for mode in ("asym", "compressed"):
        r = httpx.post(url, timeout=60, json={**body, "mode": mode})
        assert r.status_code == 200, (mode, r.text)
        stats = r.json()["asymagent"]["stats"]
        assert stats["full_context_tokens"] > 2048 > stats["verifier_context_tokens"] + 4
        assert r.json()["usage"]["prompt_tokens"] == stats["full_context_tokens"]
    for mode in ("full", "spec"):
        r = httpx.post(url, timeout=60, json={**body, "mode": mode})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # a completion that would not fit after the compressed view is still refused, naming both
    r = httpx.post(url, timeout=60, json={**body, "max_tokens": 2000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "compressed to" in r.json()["error"]["message"]


def test_the_servers_context_limit_is_the_verifiers():
    # a drafter with a shorter window than the verifier's only proposes tokens: it does not
    # shorten what the server admits (the engine checks the verifier's view alone)
    from types import SimpleNamespace

    from asymagent.integrations.server.worker import context_limit

    model = lambda n: SimpleNamespace(config=SimpleNamespace(max_position_embeddings=n))  # noqa: E731
    assert context_limit(SimpleNamespace(verifier=model(4096), drafter=model(1024))) == 4096
    assert context_limit(SimpleNamespace(verifier=model(None), drafter=model(1024))) is None


def test_no_completion_cap_by_default_the_context_bounds_it(smollm_tokenizer):
    """Without max_tokens (and without --max-tokens) a completion runs to the end token or the
    context limit, as OpenAI and vLLM (agent SDKs treat a cut answer as an error); --max-tokens
    is an opt-in cap; an explicit max_tokens still over the context is a 400."""
    engine = tiny_engine(smollm_tokenizer, max_positions=160)
    body = {"model": "asymagent", "messages": USER, "mode": "full"}
    with serving(create_app(engine, max_queue=4, request_timeout=120)) as url:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        usage = r["usage"]
        assert r["choices"][0]["finish_reason"] == "length"  # a random model never ends
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 160
        resp = httpx.post(url + "/v1/responses", json={"model": "asymagent", "input": "Hi",
                                                       "mode": "full"}, timeout=120).json()
        assert resp["usage"]["input_tokens"] + resp["usage"]["output_tokens"] == 160
        over = httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 200}, timeout=60)
        assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
    with serving(create_app(engine, max_queue=4, default_max_tokens=7)) as url:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        assert r["usage"]["completion_tokens"] == 7


def test_served_model_names_several(smollm_tokenizer):
    """vLLM's --served-model-name takes several names: each is listed and accepted, answers
    carry the first; any other name is still a 404."""
    import argparse

    from asymagent.integrations.serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["m", "--served-model-name", "a", "b"]).model_name == ["a", "b"]
    assert parser.parse_args([]).model_name == ["asymagent"]
    app = create_app(tiny_engine(smollm_tokenizer), model_name=["gpt-local", "mine"],
                     default_max_tokens=2)
    with serving(app) as url:
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["gpt-local", "mine"]
        assert httpx.get(url + "/v1/models/mine").json()["id"] == "mine"
        for name in ("gpt-local", "mine"):
            r = httpx.post(url + "/v1/chat/completions", json={"model": name, "messages": USER},
                           timeout=60)
            assert r.status_code == 200 and r.json()["model"] == "gpt-local"
        r = httpx.post(url + "/v1/chat/completions", json={"model": "other", "messages": USER})
        assert r.status_code == 404


def test_bad_input_is_4xx_with_an_error_body(server):
    url = server[0] + "/v1/chat/completions"
    ok = {"model": "asymagent", "messages": USER}
    cases = {
        "zero max_tokens": ({**ok, "max_tokens": 0}, 400),
        "negative max_completion_tokens": ({**ok, "max_completion_tokens": -5}, 400),
        "bad temperature": ({**ok, "temperature": -1}, 400),
        "empty messages": ({**ok, "messages": []}, 400),
        "unknown role": ({**ok, "messages": [{"role": "wizard", "content": "x"}]}, 400),
        "malformed tool schema": ({**ok, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": "nope"}}}]}, 400),
        "tool_choice names a missing tool": ({**ok, "tools": [WEATHER], "tool_choice": {
            "type": "function", "function": {"name": "nope"}}}, 400),
        "n over the bound": ({**ok, "n": 9}, 400),
        "schema the grammar cannot compile": ({**ok, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"type": "string", "pattern": "[x"}}}}}]},
            400),
        "unknown model": ({**ok, "model": "gpt-9"}, 404),
        "context over the limit": ({**ok, "max_tokens": 100, "messages": [
            {"role": "user", "content": "hello " * 2100}]}, 400),
    }
    for name, (body, status) in cases.items():
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == status, (name, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], name
    r = httpx.post(url, json=cases["context over the limit"][0], timeout=60)
    message = r.json()["error"]["message"]
    # Both lengths named: the limit (the tiny models' 2048 positions) and the request's size,
    # split into prompt and completion (the 100 max_tokens asked for).
    limit, requested, prompt, completion = map(int, re.search(
        r"maximum context length is (\d+) tokens.*requested (\d+) tokens \((\d+) in the "
        r"messages, (\d+) in the completion\)", message).groups())
    assert limit == 2048 and completion == 100
    assert requested == prompt + completion > limit
    assert r.json()["error"]["code"] == "context_length_exceeded"
    # Not JSON at all, and an unknown path: still OpenAI error bodies, never a 500.
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.get(server[0] + "/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()
    # The server still serves after all that.
    assert httpx.post(url, json={**ok, "max_tokens": 2}, timeout=60).status_code == 200


def test_concurrent_requests_all_succeed(client):
    def one(i: int):
        return client.chat.completions.create(
            model="asymagent", max_tokens=6,
            messages=[{"role": "user", "content": f"Request number {i}"}])

    with ThreadPoolExecutor(8) as pool:  # 8 in flight > 1 worker: 7 of them wait in the queue
        results = list(pool.map(one, range(8)))
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in results)


def test_disconnect_mid_stream_cancels_then_a_normal_request_works(server):
    url = server[0]
    before = metric(url, "asymagent:request_aborted_total")
    # Sampled (seeded): the greedy tiny model repeats "\n", which streams nothing until the end.
    body = {"model": "asymagent", "messages": USER, "max_tokens": 1500, "stream": True,
            "temperature": 1.0, "seed": 0}
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 3:
                break  # leave mid-stream: closing the response drops the connection
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"model": "asymagent", "messages": USER, "max_tokens": 3})
    assert r.status_code == 200
    deadline = time.monotonic() + 30  # the abort is recorded when the worker notices it
    while metric(url, "asymagent:request_aborted_total") < before + 1:
        assert time.monotonic() < deadline, "the dropped stream was never cancelled"
        time.sleep(0.05)
    # 1500 tokens take many seconds on the tiny model; the abort freed the worker long before.
    assert metric(url, "asymagent:aborted_generation_tokens_total") < 1500
    assert time.monotonic() - t0 < 60


def test_queue_full_is_429_and_timeout_is_504(smollm_tokenizer):
    engine = tiny_engine(smollm_tokenizer)
    gate, entered = threading.Event(), threading.Event()
    real_chat = engine.chat

    def gated_chat(**kwargs):
        # Holds the worker inside a generation until the test opens the gate, so "busy worker,
        # full queue" is a state the test controls instead of a race against decoding speed.
        entered.set()
        gate.wait(30)
        return real_chat(**kwargs)

    engine.chat = gated_chat
    app = create_app(engine, max_queue=1, request_timeout=2.0)
    body = {"model": "asymagent", "messages": USER, "max_tokens": 64}
    post = lambda: httpx.post(url + "/v1/chat/completions", json=body, timeout=60)  # noqa: E731
    with serving(app) as url, ThreadPoolExecutor(2) as pool:
        running = pool.submit(post)
        assert entered.wait(30)  # the worker holds request 1
        queued = pool.submit(post)
        deadline = time.monotonic() + 30
        while app.state.worker.depth < 1:  # request 2 waits in the queue (capacity 1)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = post()
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        time.sleep(2.2)  # past the 2 s request timeout of requests 1 and 2
        gate.set()
        # Request 1 is cut off after its first round, request 2 never starts: clean 504s.
        for future in (running, queued):
            r = future.result(timeout=60)
            assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        ok = httpx.post(url + "/v1/chat/completions", timeout=60,
                        json={**body, "max_tokens": 2})
        assert ok.status_code == 200  # the server serves normally afterwards


def test_api_key_enforced(smollm_tokenizer):
    app = create_app(tiny_engine(smollm_tokenizer), api_key="sekret")
    body = {"model": "asymagent", "messages": USER, "max_tokens": 2}
    with serving(app) as url:
        assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401
        wrong = httpx.post(url + "/v1/chat/completions", json=body,
                           headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models").status_code == 401
        good = httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": "Bearer sekret"})
        assert good.status_code == 200
        assert httpx.get(url + "/health").status_code == 200  # probes need no key


def test_rss_flat_over_200_requests(smollm_tokenizer):
    import psutil

    # hidden 128 with 4 KV heads of 32 dims: one conversation's KV caches hold
    # 2 (K, V) x 4 x 32 x 4 B = 1 KB per token per layer, in 6 layer-caches (verifier full +
    # compressed at 2 layers, drafter full + base at 1 layer). Measured on this setup: RSS grows
    # ~2 MB over the 200 requests with the engine's LRU of 4 sessions, and ~33 MB when sessions
    # are never dropped (max_sessions=1000). Leaking one [T, V] logits tensor per request
    # (~45 x 49152 x 4 B = 8.8 MB) would add far more.
    engine = tiny_engine(smollm_tokenizer, hidden=128, kv_heads=4)
    app = create_app(engine, max_queue=4)
    proc = psutil.Process()
    with serving(app) as url, httpx.Client(timeout=60) as http:
        def burst(start: int, count: int) -> None:
            for i in range(start, start + count):
                body = {"model": "asymagent", "max_tokens": 3, "stream": i % 2 == 1,
                        "messages": [{"role": "user", "content": f"Conversation {i}: plan it."}]}
                r = http.post(url + "/v1/chat/completions", json=body)
                assert r.status_code == 200

        burst(0, 30)  # warm-up: allocator pools, tokenizer caches, metric series
        rss0 = proc.memory_info().rss
        burst(30, 200)
        grown = proc.memory_info().rss - rss0
    # 16 MB: 8x the measured growth, half of what leaking every session adds.
    assert grown < 16 * 2**20, f"RSS grew {grown / 2**20:.1f} MB over 200 requests"
