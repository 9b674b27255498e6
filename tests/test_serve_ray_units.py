"""Units of `serve --ray` that need no Ray cluster: conversation keys, the metrics merge, the
ASGI bridge an engine replica serves through, and the `--ray` flag checks (Ray absent: one line,
exit 2, before any model loads)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from asymagent.integrations.ray_serve.affinity import conversation_key
from asymagent.integrations.ray_serve.asgi_call import HttpRequest, call_asgi
from asymagent.integrations.ray_serve.metrics_merge import merge_expositions

SYSTEM = {"role": "system", "content": "You are a file agent."}
USER = {"role": "user", "content": "Summarise the logs."}


def test_conversation_key_order_prompt_cache_key_then_user_then_leading_messages():
    chat = "/v1/chat/completions"
    body = {"messages": [SYSTEM, USER], "user": "u1", "prompt_cache_key": "conv-7"}
    assert conversation_key(chat, body) == "pck:conv-7"
    del body["prompt_cache_key"]
    assert conversation_key(chat, body) == "user:u1"
    del body["user"]
    first = conversation_key(chat, body)
    assert first.startswith("chat:")
    # An agent's later steps append to the conversation: same key.
    grown = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "and the errors?"}], "max_tokens": 9}
    assert conversation_key(chat, grown) == first
    other = {"messages": [SYSTEM, {"role": "user", "content": "Another task."}]}
    assert conversation_key(chat, other) != first


def test_conversation_key_responses_completions_and_no_key():
    r1 = conversation_key("/v1/responses", {"input": "hi", "instructions": "be brief"})
    r2 = conversation_key("/v1/responses", {"input": [{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "x"}],
                                            "instructions": "be brief"})
    assert r1 == r2 and r1.startswith("resp:")
    few_shot = "Q: 1+1\nA: 2\n" * 100
    assert conversation_key("/v1/completions", {"prompt": few_shot + "Q: 2+2"}) == \
        conversation_key("/v1/completions", {"prompt": few_shot + "Q: 3+3"})
    assert conversation_key("/v1/completions", {"prompt": [[1, 2, 3]]}).startswith("ids:")
    for path, body in (("/v1/chat/completions", None), ("/v1/chat/completions", [1]),
                       ("/v1/models", {}), ("/v1/chat/completions", {"messages": "x"}),
                       ("/v1/chat/completions", {"prompt_cache_key": ""})):
        assert conversation_key(path, body) is None


def test_merge_expositions_labels_each_replica_and_adds_the_total():
    from asymagent.integrations.server.metrics import ServerMetrics

    a, b = ServerMetrics("m"), ServerMetrics("m")
    a.prompt_tokens.labels("m").inc(5)
    b.prompt_tokens.labels("m").inc(7)
    a.waiting.labels("m").set(2)
    b.waiting.labels("m").set(3)
    a.e2e.labels("m").observe(0.3)
    b.e2e.labels("m").observe(3.0)
    text = merge_expositions([("r1", a.exposition().decode()),
                              ("r2", b.exposition().decode())]).decode()
    assert 'asymagent:prompt_tokens_total{model_name="m",replica="r1"} 5.0' in text
    assert 'asymagent:prompt_tokens_total{model_name="m",replica="r2"} 7.0' in text
    assert 'asymagent:prompt_tokens_total{model_name="m",replica="all"} 12.0' in text
    assert 'asymagent:num_requests_waiting{model_name="m",replica="all"} 5.0' in text
    assert 'asymagent:e2e_request_latency_seconds_bucket{le="0.5",model_name="m",replica="all"} 1.0' in text
    assert 'asymagent:e2e_request_latency_seconds_count{model_name="m",replica="all"} 2.0' in text
    assert "_created" not in text
    from prometheus_client.parser import text_string_to_metric_families

    assert any(f.name == "asymagent:prompt_tokens" for f in text_string_to_metric_families(text))


def _collect(app, req: HttpRequest, stop_after: int | None = None):
    async def run():
        parts = []
        gen = call_asgi(app, req)
        async for part in gen:
            parts.append(part)
            if stop_after is not None and len(parts) >= stop_after:
                await gen.aclose()
                break
        return parts
    return asyncio.run(run())


def test_call_asgi_streams_the_apps_response_and_reports_a_departed_caller():
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    seen = {"disconnected": False}

    async def echo(request: Request):
        body = await request.json()
        return JSONResponse({"got": body, "q": request.url.query}, status_code=201)

    async def stream(request: Request):
        async def chunks():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:  # Starlette cancels the stream when receive() reports the disconnect
                seen["disconnected"] = True
        return StreamingResponse(chunks(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/s", stream)])
    parts = _collect(app, HttpRequest("POST", "/echo", b"a=1",
                                      [("content-type", "application/json")], b'{"x": 1}'))
    assert parts[0]["status"] == 201 and isinstance(parts[1], bytes)
    assert b'"got":{"x":1}' in b"".join(parts[1:]) and b'"q":"a=1"' in parts[1]
    parts = _collect(app, HttpRequest("GET", "/s"), stop_after=3)
    assert parts[0]["status"] == 200 and parts[1] == b"data: 0\n\n"
    assert seen["disconnected"]  # the app saw the caller leave and stopped


def _serve_args(argv):
    from asymagent.integrations.cli import build_parser

    parser, _ = build_parser()
    return parser.parse_args(["serve", *argv])


def test_ray_flags_are_checked_before_any_model_loads(monkeypatch):
    from asymagent.integrations import serve

    with pytest.raises(ValueError, match="--replicas must be >= 1"):
        serve.check_args(_serve_args(["--ray", "--replicas", "0"]))
    with pytest.raises(ValueError, match="needs 400 CPUs"):
        serve.check_args(_serve_args(["--ray", "--replicas", "400"]))
    serve.check_args(_serve_args(["--ray", "auto", "--replicas", "400"]))  # a cluster may hold them
    with pytest.raises(ValueError, match="--replica-gpus needs --device cuda"):
        serve.check_args(_serve_args(["--ray", "auto", "--replica-gpus", "1"]))
    args = _serve_args(["--ray", "--replicas", "1", "--replica-cpus", "0.5"])
    assert args.ray == "" and args.replicas == 1 and args.replica_cpus == 0.5


def test_ray_missing_refuses_in_one_line_with_exit_2(monkeypatch, capsys):
    from asymagent.integrations import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    loaded = []
    monkeypatch.setattr("asymagent.integrations.serve_setup.load_engine",
                        lambda args: loaded.append(args))
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--ray", "--replicas", "1"])
    assert exc.value.code == 2 and not loaded
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'asymagent[ray]'" in err


def test_response_owners_route_a_stored_response_back_to_its_conversation():
    from asymagent.integrations.ray_serve.response_owners import ResponseOwners, response_id_in

    owners = ResponseOwners(max_ids=2)
    assert response_id_in(b'{"id": "resp_1", "object": "response"}') == "resp_1"
    event = (b'event: response.created\ndata: {"type": "response.created", "sequence_number": 0, '
             b'"response": {"id": "resp_2", "status": "in_progress"}}\n\n')
    assert response_id_in(event) == "resp_2"
    assert response_id_in(b'event: response.output_text.delta\ndata: {"type": "x"}\n\n') is None
    owners.learn("chat:abc", "resp_1")
    owners.learn("pck:k", "resp_2")
    assert owners.key_for("POST", "/v1/responses", {"previous_response_id": "resp_1"}) == "chat:abc"
    assert owners.key_for("GET", "/v1/responses/resp_2", None) == "pck:k"
    assert owners.key_for("POST", "/v1/responses", {"previous_response_id": "resp_9"}) is None
    owners.learn("x", "resp_3")  # the oldest id is forgotten past max_ids
    assert owners.key_for("GET", "/v1/responses/resp_1", None) is None


class _Stream:
    """Stands in for a Ray Serve streaming response: yields `parts`; an exception in them is
    raised at that point (as a dead replica's ActorDiedError is)."""

    def __init__(self, parts):
        self.parts, self.cancelled = list(parts), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.parts:
            raise StopAsyncIteration
        part = self.parts.pop(0)
        if isinstance(part, BaseException):
            raise part
        return part

    def cancel(self):
        self.cancelled = True


class _Handle:
    """A DeploymentHandle stand-in answering successive calls with the given streams."""

    def __init__(self, streams):
        self.streams, self.calls = list(streams), []

    def options(self, **kw):
        return self

    @property
    def handle_request(self):
        return self

    def remote(self, request, conversation=None):
        self.calls.append(conversation)
        return self.streams.pop(0)


def _ingress_answer(streams, path="/v1/chat/completions"):
    pytest.importorskip("ray.serve.request_router", reason="needs ray[serve] >= 2.46")
    from asymagent.integrations.ray_serve.asgi_call import HttpRequest
    from asymagent.integrations.ray_serve.ingress import Ingress

    handle = _Handle(streams)
    ingress = Ingress(handle, model_name="m", max_body_bytes=1000, request_timeout=5)

    async def run():
        response = await ingress.forward(HttpRequest("POST", path), "chat:k")
        body = b""
        if hasattr(response, "body_iterator"):
            async for chunk in response.body_iterator:
                body += chunk if isinstance(chunk, bytes) else chunk.encode()
        else:
            body = response.body
        return response, body

    response, body = asyncio.run(run())
    return response, body, handle, ingress


def test_ingress_retries_a_dead_replica_once_then_answers_503():
    from ray.exceptions import ActorDiedError

    ok = {"status": 200, "headers": [("content-type", "application/json")]}
    response, body, handle, ingress = _ingress_answer(
        [_Stream([ActorDiedError()]), _Stream([ok, b'{"fine": true}'])])
    assert response.status_code == 200 and body == b'{"fine": true}'
    assert handle.calls == ["chat:k", "chat:k"] and ingress.counts["retries"] == 1
    response, body, handle, ingress = _ingress_answer(
        [_Stream([ActorDiedError()]), _Stream([ActorDiedError()])])
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert b'"code":"replica_unavailable"' in body.replace(b" ", b"")


def test_ingress_ends_a_cut_stream_with_an_error_event_and_maps_backpressure_to_429():
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import BackPressureError

    sse = {"status": 200, "headers": [("content-type", "text/event-stream; charset=utf-8")]}
    response, body, _, ingress = _ingress_answer(
        [_Stream([sse, b"data: {\"x\": 1}\n\n", ActorDiedError()])])
    assert response.status_code == 200 and ingress.counts["cut_streams"] == 1
    assert body.startswith(b"data: {\"x\": 1}\n\n") and b"replica_unavailable" in body
    assert body.endswith(b"data: [DONE]\n\n")
    response, body, _, _ = _ingress_answer([_Stream([BackPressureError(
        num_queued_requests=9, max_queued_requests=8)])])
    assert response.status_code == 429 and response.headers["retry-after"] == "1"


class _Replica:
    def __init__(self, name):
        self.replica_id = name


class _Pending:
    def __init__(self, key):
        self.kwargs = {"conversation": key}


def test_new_conversations_spread_over_replicas_even_when_they_start_at_once():
    pytest.importorskip("ray.serve.request_router")
    from asymagent.integrations.ray_serve.router import ConversationRouter

    router = object.__new__(ConversationRouter)  # its state only: no Ray cluster
    router.initialize_state()
    replicas = [_Replica("a"), _Replica("b")]

    def choose(key):
        return asyncio.run(router.choose_replicas(replicas, _Pending(key)))

    # four conversations choose before any of them is routed (they arrived together)
    first = {key: choose(key)[0][0].replica_id for key in ("c1", "c2", "c3", "c4")}
    assert sorted(first.values()) == ["a", "a", "b", "b"]
    assert choose("c4")[0][0].replica_id in ("a", "b")  # asked again: its old claim lapses
    assert sum(router.held.values()) == 4
    routed = {"c1": "a", "c2": "a", "c3": "a", "c4": "b"}  # where Ray sent them (fallbacks taken)
    for key, replica in routed.items():
        router.on_request_routed(_Pending(key), replica, None)
    assert dict(router.held) == {"a": 3, "b": 1} and router.claims == {}
    assert [r[0].replica_id for r in choose("c5")] == ["b", "a"]  # the least-held first, then the rest
    router.on_request_routed(_Pending("c2"), "b", None)  # a conversation moved (its replica was gone)
    assert dict(router.held) == {"a": 2, "b": 3}  # c5's claim on b, c2 now on b
