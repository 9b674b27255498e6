"""The serving context every endpoint handler shares: engine, worker, metrics, limits, tracing, auth.

One `ServingContext` per app (create_app builds it; a Ray Serve replica builds its own app). The
handlers (chat.py, completions.py, responses.py, models.py, health.py) are classes holding it.
It queues jobs and waits for their events (`start`, `finished`, `next_event`: each returns the
event or a `Failed` value), turns a `Failed` into the response (`respond`), checks the API key
(`check_key`, a FastAPI dependency) and a request's model and text (`check_request`), and
records every finished generation (metrics; a trace line with --trace-dir).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

from fastapi import Request  # module level: FastAPI resolves the dependency's annotation here

from asymagent.integrations.server.errors import (ApiError, Failed, error_body, gone,
                                                  model_not_found, refusals, timed_out)
from asymagent.integrations.server.logprobs import TokenTexts
from asymagent.integrations.server.metrics import ServerMetrics
from asymagent.integrations.server.schemas import MODES, finish_reason_for, lone_surrogate_at
from asymagent.integrations.server.worker import (EngineWorker, Finished, GenerationJob,
                                                  QueueFull, Started)

log = logging.getLogger("asymagent.serve")


@dataclass(frozen=True)
class Limits:
    """The server's defaults and bounds (asymagent serve's flags)."""

    request_timeout: float = 600.0
    default_mode: str = "asym"
    default_max_tokens: int | None = None  # None: no cap, the context limit bounds a completion
    default_temperature: float = 0.0
    max_queue: int = 16
    max_model_len: int | None = None

    def check(self) -> None:
        if self.default_mode not in MODES:
            raise ValueError(f"default_mode must be one of {MODES}, got {self.default_mode!r}")
        if self.request_timeout <= 0 or (self.default_max_tokens is not None
                                         and self.default_max_tokens < 1):
            raise ValueError("request_timeout must be > 0, default_max_tokens >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


class ServingContext:
    """What the handlers share; see the module docstring."""

    def __init__(self, engine, *, model_name, limits: Limits, api_key: str | None = None,
                 trace_writer=None):
        limits.check()
        # one name or several (vLLM's --served-model-name A B): requests may name any of them,
        # answers, metrics and /health carry the first
        names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"model_name must be a non-empty name or names, got {model_name!r}")
        self.model_names = names
        model_name = names[0]
        self.engine, self.model_name, self.limits = engine, model_name, limits
        self.api_key, self.trace_writer = api_key, trace_writer
        self.metrics = ServerMetrics(model_name)
        self.worker = EngineWorker(engine, max_queue=limits.max_queue, metrics=self.metrics,
                                   observe=self.observe)
        batcher = getattr(getattr(engine, "scheduler", None), "batcher", None)
        if batcher is not None:  # batch size and tokens per forward (continuous batching)
            batcher.observers.append(self.metrics.forward)
        if limits.max_model_len is not None:
            self.worker.max_context = min(self.worker.max_context or limits.max_model_len,
                                          limits.max_model_len)
        self.created = int(time.time())
        self.texts = TokenTexts(engine.tokenizer)
        self.stop_ids = tuple(getattr(engine, "eos_ids", ()) or ())

    # -- jobs ---------------------------------------------------------------------------------
    def new_job(self, task) -> GenerationJob:
        return GenerationJob(task, asyncio.get_running_loop(),
                             deadline=time.monotonic() + self.limits.request_timeout)

    def observe(self, job: GenerationJob, result) -> None:
        """Record a finished generation (worker thread): metrics, and the trace line if any."""
        self.metrics.observe(result.stats, e2e_s=job.finished - job.received,
                             ttft_s=(job.first_token - job.received) if job.first_token else None,
                             queue_s=job.started - job.received,
                             finish_reason=finish_reason_for(result))
        if self.trace_writer is not None:
            try:
                job.task.record(self.trace_writer, self.engine, result)
            except OSError as exc:  # a full disk costs the trace, never the response
                log.warning("trace not written: %s", exc)

    async def next_event(self, job: GenerationJob, request):
        """The job's next event; None once the client has gone (the job is then cancelled).

        The disconnect check runs at least every 0.25 s even while events keep arriving: a
        streaming client that left is otherwise only noticed when a write fails, which some
        ASGI servers never report."""
        grace = 30.0  # the worker checks the deadline after every round; a round is < 30 s
        while True:
            now = time.monotonic()
            if now - job.checked_at >= 0.25:
                job.checked_at = now
                if await request.is_disconnected():
                    job.cancel.set()
                    return None
            if now > job.deadline + grace:
                job.cancel.set()
                return Failed(504, "request timed out", "timeout_error", code="timeout")
            try:
                return await asyncio.wait_for(job.events.get(), timeout=0.25)
            except asyncio.TimeoutError:
                pass

    async def start(self, job: GenerationJob, request) -> Started | Failed:
        """Queue `job`; its Started event, or the error to answer with instead."""
        try:
            self.worker.submit(job)
        except QueueFull as exc:
            return Failed(429, str(exc), "rate_limit_error", code="queue_full",
                          headers={"Retry-After": str(self.worker.retry_after_s())})
        first = await self.next_event(job, request)
        if first is None:  # client gone before anything happened
            return gone()
        if isinstance(first, Failed):
            return first
        if not isinstance(first, Started):  # the worker always announces before anything else
            return Failed(500, f"internal error: unexpected event {first!r}", "server_error")
        return first

    async def finished(self, job: GenerationJob, request) -> Finished | Failed:
        """The job's Finished event (not timed out), or the error to answer with instead."""
        while True:
            ev = await self.next_event(job, request)
            if ev is None:
                return gone()
            if isinstance(ev, (Failed, Finished)):
                break
        if isinstance(ev, Finished) and ev.timed_out:
            return timed_out(self.limits.request_timeout)
        return ev

    # -- errors and checks --------------------------------------------------------------------
    def count_error(self, failed: Failed) -> None:
        """Count an error answer; a refusal (4xx) is also logged at INFO with its reason."""
        self.metrics.error(failed.status)
        if 400 <= failed.status < 500:
            refusals.info("%d %s%s: %s", failed.status, failed.code or failed.type,
                          f" ({failed.param})" if failed.param else "", failed.message)

    def refused_body(self, status: int) -> None:
        """A body the body limit refused before the app saw it (413)."""
        self.count_error(Failed(status, "request body over --max-body-bytes",
                                code="request_too_large"))

    def respond(self, failed: Failed):
        """The HTTP response for an error (a bare 499 when the client has gone)."""
        from fastapi.responses import JSONResponse, Response

        if failed.status == 499:
            return Response(status_code=499)
        self.count_error(failed)
        return JSONResponse(error_body(failed), status_code=failed.status,
                            headers=failed.headers)

    async def check_key(self, request: Request) -> None:
        """FastAPI dependency: with an API key set, `Authorization: Bearer KEY` or a 401."""
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(Failed(401, "Incorrect API key provided.", code="invalid_api_key"))

    def check_request(self, req) -> Failed | None:
        """404 for another model's name; 400 for text holding a lone UTF-16 surrogate."""
        if req.model not in self.model_names:
            return model_not_found(req.model)
        bad_text = lone_surrogate_at(req.model_dump(exclude_none=True))
        if bad_text is not None:
            return Failed(400, f"{bad_text}: the text holds a lone UTF-16 surrogate escape "
                               "(e.g. \\ud800), which is not valid Unicode", param=bad_text,
                          code="invalid_value")
        return None
