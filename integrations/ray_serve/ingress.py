"""The HTTP front of `serve --ray`: reads a request, finds its conversation, sends it to a replica.

A Ray Serve deployment behind Ray's HTTP proxy. For every path but /health and /metrics it reads
the body (413 past `max_body_bytes`, as the single server), takes the conversation key from the
JSON (affinity.py; a body that is not JSON has none: the replica answers its 400) and calls the
engine deployment with `conversation=KEY`, so the router (router.py) picks the replica that
holds the conversation. The replica's response (single server's app, asgi_call.py) streams back
part by part.

Faults: a replica that dies before its answer started (a non-streaming answer starts only when
it is complete) is retried once on another replica (Ray has already taken the dead one out and
starts a replacement); if that fails too the client gets a 503 `replica_unavailable`. A replica
that dies in the middle of a stream ends that stream with an SSE error event (503,
`replica_unavailable`) and `[DONE]`. Ray's own backpressure (every replica at its
`max_ongoing_requests` and the router's queue full) is a 429 with Retry-After; a replica's full
queue answers its own 429. Every wait is bounded by `request_timeout` + a grace: never a hang.

Stored Responses API answers live on the replica that made them: a request naming one
(`previous_response_id`, GET /v1/responses/{id}) inherits its conversation key
(response_owners.py). /health answers 200 with the live replica count and total queue depth (503 with no replica);
/metrics merges every replica's metrics (metrics_merge.py) and adds the router's counters.
"""

from __future__ import annotations

import asyncio
import json
import logging

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from asymagent.integrations.ray_serve.affinity import conversation_key
from asymagent.integrations.ray_serve.asgi_call import HttpRequest
from asymagent.integrations.ray_serve.metrics_merge import merge_expositions
from asymagent.integrations.ray_serve.response_owners import ResponseOwners, response_id_in
from asymagent.integrations.ray_serve.route_counts import ROUTES

log = logging.getLogger("asymagent.serve.ray")
GRACE_S = 60.0  # beyond request_timeout: the replica answers 504 itself well before this
METRICS_TIMEOUT_S = 10.0
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


def error_body(status: int, message: str, type_: str, code: str | None,
               headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": None,
                                   "code": code}}, status_code=status, headers=headers)


def sse_error_event(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


class TooLarge(Exception):
    pass


class Ingress:
    """Ray Serve deployment body (launch.py wraps it with `serve.deployment`)."""

    def __init__(self, engine, *, model_name: str, max_body_bytes: int,
                 request_timeout: float, retries: int = 1) -> None:
        self.engine = engine  # DeploymentHandle of the EngineReplica deployment
        self.model_name = model_name
        self.max_body_bytes = int(max_body_bytes)
        self.wait_s = float(request_timeout) + GRACE_S
        self.retries = int(retries)
        self.counts = {"retries": 0, "unavailable": 0, "backpressure": 0, "cut_streams": 0}
        self.owners = ResponseOwners()  # stored /v1/responses answers live on one replica

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path == "/health":
            return await self.health()
        if request.method == "GET" and path == "/metrics":
            return await self.metrics()
        try:
            body = await self.read_body(request)
        except TooLarge:
            return error_body(413, f"the request body is larger than {self.max_body_bytes} bytes",
                              "invalid_request_error", "request_too_large")
        try:
            parsed = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            parsed = None  # the replica's app answers the 400
        req = HttpRequest(method=request.method, path=path, query=request.url.query.encode(),
                          headers=[(k, v) for k, v in request.headers.items()
                                   if k != "content-length"] + [("content-length", str(len(body)))],
                          body=body)
        key = self.owners.key_for(request.method, path, parsed) or conversation_key(path, parsed)
        learn = request.method == "POST" and path == "/v1/responses"
        return await self.forward(req, key, learn=learn)

    async def read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise TooLarge()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise TooLarge()
            chunks.append(chunk)
        return b"".join(chunks)

    async def forward(self, req: HttpRequest, key: str | None, learn: bool = False) -> Response:
        payload = req.to_dict()
        for attempt in range(1 + self.retries):
            stream = self.engine.options(stream=True).handle_request.remote(payload,
                                                                             conversation=key)
            try:
                start = await asyncio.wait_for(stream.__anext__(), self.wait_s)
            except BackPressureError:
                self.counts["backpressure"] += 1
                return error_body(429, "every engine replica is at capacity; retry later",
                                  "rate_limit_error", "queue_full", {"Retry-After": "1"})
            except (RayActorError, DeploymentUnavailableError) as exc:
                stream.cancel()
                log.warning("replica died before answering (%s): %s", type(exc).__name__,
                            "retrying" if attempt < self.retries else "503")
                if attempt < self.retries:
                    self.counts["retries"] += 1
                    continue
                self.counts["unavailable"] += 1
                return error_body(503, "the engine replica serving this request died and the "
                                       "retry failed too; retry the request",
                                  "server_error", "replica_unavailable", {"Retry-After": "1"})
            except asyncio.TimeoutError:
                stream.cancel()
                return error_body(504, f"no answer from the engine replica within "
                                       f"{self.wait_s:g} s", "timeout_error", "timeout")
            except StopAsyncIteration:
                return error_body(500, "internal error (the replica sent no response)",
                                  "server_error", None)
            learn_key = key if learn and start["status"] == 200 else None
            response = StreamingResponse(self.rest(stream, start, learn_key),
                                         status_code=start["status"])
            response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1"))
                                    for k, v in start["headers"]]
            return response
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    async def rest(self, stream, start: dict, learn_key: str | None = None):
        """The response body after its start; a replica lost mid-stream ends an SSE stream with
        an error event (a plain body just ends: its Content-Length shows it short). With
        `learn_key` (a /v1/responses answer) the response's id is remembered with that key."""
        sse = any(k.lower() == "content-type" and v.startswith("text/event-stream")
                  for k, v in start["headers"])
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(stream.__anext__(), self.wait_s)
                except StopAsyncIteration:
                    return
                except (RayActorError, asyncio.TimeoutError) as exc:
                    self.counts["cut_streams"] += 1
                    log.warning("stream cut: %s", type(exc).__name__)
                    if sse:
                        yield sse_error_event("the engine replica serving this stream was lost "
                                              "mid-answer; retry the request",
                                              "replica_unavailable")
                    return
                if learn_key is not None:
                    response_id = response_id_in(chunk)
                    if response_id is not None:
                        self.owners.learn(learn_key, response_id)
                        learn_key = None
                yield chunk
        finally:
            stream.cancel()  # a no-op when finished; stops the generation if the client left

    async def replica_reports(self) -> list[dict]:
        reports = await self.engine.broadcast("metrics").results_async(
            timeout_s=METRICS_TIMEOUT_S, return_exceptions=True)
        return [r for r in reports if isinstance(r, dict)]

    async def health(self) -> Response:
        try:
            reports = await self.replica_reports()
        except Exception:  # no replica (yet), or none answered in time: unavailable, not a 500
            reports = []
        body = {"status": "ok" if reports else "unavailable", "model": self.model_name,
                "replicas": len(reports), "queue_depth": sum(r["queue_depth"] for r in reports)}
        return JSONResponse(body, status_code=200 if reports else 503)

    async def metrics(self) -> Response:
        try:
            reports = await self.replica_reports()
        except Exception:  # as /health: the ingress's own counters still answer
            reports = []
        text = merge_expositions([(r["replica"], r["exposition"]) for r in reports])
        return Response(text + self.own_metrics(len(reports)).encode(),
                        media_type=CONTENT_TYPE_METRICS)

    def own_metrics(self, replicas: int) -> str:
        """The router's and this ingress's counters, in Prometheus text."""
        m = f'model_name="{self.model_name}"'
        lines = ["# HELP asymagent:ray_replicas Engine replicas that answered this scrape.",
                 "# TYPE asymagent:ray_replicas gauge", f"asymagent:ray_replicas{{{m}}} {replicas}",
                 "# HELP asymagent:ray_routed_total Requests routed, by outcome (affine: to the "
                 "replica holding the conversation; new; moved: its replica was gone; unkeyed).",
                 "# TYPE asymagent:ray_routed_total counter"]
        for kind, count in ROUTES.snapshot().items():
            lines.append(f'asymagent:ray_routed_total{{{m},outcome="{kind}"}} {count}')
        for name, help_ in (("retries", "Requests retried on another replica after theirs died."),
                            ("unavailable", "Requests answered 503: the retry failed too."),
                            ("backpressure", "Requests answered 429 by Ray's backpressure."),
                            ("cut_streams", "Streams ended by an error event: replica lost.")):
            lines += [f"# HELP asymagent:ray_{name}_total {help_}",
                      f"# TYPE asymagent:ray_{name}_total counter",
                      f"asymagent:ray_{name}_total{{{m}}} {self.counts[name]}"]
        return "\n".join(lines) + "\n"
