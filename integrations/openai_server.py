"""The OpenAI-compatible app of `asymagent serve` (FastAPI; the command is serve.py) over an Engine.

Endpoints: GET /health, GET /version, GET /v1/models, GET /v1/models/{id}, POST
/v1/chat/completions (tools, tool_choice none/auto/required/named, response_format, logprobs,
sampling fields (server_fields.py), stream with stream_options.include_usage, extension field
`mode`), POST /v1/completions (server_completions.py), GET /metrics (Prometheus, see
server_metrics.py); CORS for the origins given (opt-in). Errors are OpenAI error bodies
`{"error": {"message", "type", "param", "code"}}`: 400 for invalid input (request validation,
context over the limit naming both lengths), 401 for a wrong/missing key with --api-key, 404 for
an unknown model or path, 413 for a body over --max-body-bytes (server_body_limit.py), 429 with
Retry-After when the queue is full, 504 when a request times out; bad input is never a 500, and
no error message carries a dependency's file paths. One engine worker thread serves a bounded
queue (server_worker.py); a streaming client that disconnects cancels its generation at the
next round and its conversation's caches are dropped. Each conversation gets its own
engine cache session (`cache_key` = hash of the tools, the mode and the messages up to the first
user message), so an agent resending a growing conversation reuses its KV prefix.

Responses carry the engine's StepStats under the extension key `asymagent`; `usage` has
`prompt_tokens_details.cached_tokens` (the verifier's prefix reused from its KV cache), the
speculation counts as OpenAI's predicted-output fields, and extra fields (`drafted_tokens`,
`accepted_tokens`, `acceptance_rate`, `mean_accepted_len`, `compression_ratio`,
`verifier_context_tokens`).
"""


import hashlib
import json

from asymagent.integrations.serve_setup import check_args, load_engine  # noqa: F401  (old paths)

DEFAULT_MODEL_NAME = "asymagent"
DEFAULT_MAX_BODY_BYTES = 8 * 2**20


def cache_key_for(messages: list[dict], tools: list | None, mode: str) -> str:
    """Conversation identity: tools, mode and every message up to and including the first user
    message. Later turns of the same agent conversation keep that prefix, so they share a session."""
    head = []
    for message in messages:
        head.append(message)
        if message.get("role") == "user":
            break
    blob = json.dumps({"m": head, "t": tools, "mode": mode}, sort_keys=True, ensure_ascii=False)
    return "conv-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def create_app(engine, *, model_name: str = DEFAULT_MODEL_NAME, api_key: str | None = None,
               max_queue: int = 16, request_timeout: float = 600.0, default_mode: str = "asym",
               default_max_tokens: int = 256, default_temperature: float = 0.0,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               cors_origins: list[str] | None = None, max_model_len: int | None = None,
               trace_writer=None):
    """The FastAPI app serving `engine` (one worker thread, started with the app).

    `cors_origins`: browser origins allowed to call the API (CORS; None: no CORS headers, a
    preflight is refused). `max_model_len`: a context limit below the model's own. With a
    `trace_writer` (asymagent.trace_capture.TraceWriter) every completed request is captured."""
    import asyncio
    import contextlib
    import hmac
    import logging
    import time
    import uuid

    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from asymagent.decoding.logprobs import LogprobRecorder
    from asymagent.integrations import server_schemas as S
    from asymagent.integrations.server_completions import register_completions
    from asymagent.integrations.server_logprobs import TokenTexts, chat_content, visible
    from asymagent.integrations.server_body_limit import BodyLimit
    from asymagent.integrations.server_schemas import extension_for, finish_reason_for, usage_for
    from asymagent.integrations.server_metrics import CONTENT_TYPE_LATEST, ServerMetrics
    from asymagent.integrations.server_streaming import DeltaStreamer, sse_error
    from asymagent.integrations.server_worker import (
        EngineWorker, Failed, Finished, GenerationJob, QueueFull, Started, TextDelta)

    if default_mode not in S.MODES:
        raise ValueError(f"default_mode must be one of {S.MODES}, got {default_mode!r}")
    if request_timeout <= 0 or default_max_tokens < 1 or max_body_bytes < 1:
        raise ValueError("request_timeout must be > 0, default_max_tokens and max_body_bytes "
                         ">= 1")
    metrics = ServerMetrics(model_name)

    def observe(job: GenerationJob, result) -> None:
        metrics.observe(result.stats, e2e_s=job.finished - job.received,
                        ttft_s=(job.first_token - job.received) if job.first_token else None,
                        queue_s=job.started - job.received,
                        finish_reason=finish_reason_for(result))
        if trace_writer is not None and job.task is None:  # chat only: a task has no messages
            kw = job.chat_kwargs
            try:
                trace_writer.record(engine, kw["messages"], kw.get("tools"), result, source="serve",
                                    mode=kw["mode"], temperature=kw.get("temperature") or 0.0)
            except OSError as exc:  # a full disk costs the trace, never the response
                logging.getLogger("asymagent.serve").warning("trace not written: %s", exc)

    worker = EngineWorker(engine, max_queue=max_queue, metrics=metrics, observe=observe)
    if max_model_len is not None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        worker.max_context = min(worker.max_context or max_model_len, max_model_len)
    created = int(time.time())
    texts = TokenTexts(engine.tokenizer)
    stop_ids = tuple(getattr(engine, "eos_ids", ()) or ())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(title="asymagent OpenAI-compatible server", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes, on_refused=metrics.error)
    if cors_origins:  # added last: the outermost layer answers a preflight first
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"])
    app.state.worker, app.state.metrics, app.state.engine = worker, metrics, engine

    class ApiError(Exception):
        def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                     param: str | None = None, code: str | None = None,
                     headers: dict | None = None):
            super().__init__(message)
            self.status, self.headers = status, headers
            self.args_ = (message, type_, param, code)

    def error_response(status: int, message: str, type_: str = "invalid_request_error",
                       param: str | None = None, code: str | None = None,
                       headers: dict | None = None) -> JSONResponse:
        metrics.error(status)
        body = S.ErrorBody(error=S.ErrorDetail(message=message, type=type_, param=param,
                                               code=code))
        return JSONResponse(body.model_dump(), status_code=status, headers=headers)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return error_response(exc.status, *exc.args_, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":  # FastAPI's loc is ("body", character offset)
            pos = first.get("loc", ("body", "?"))[-1]
            reason = (first.get("ctx") or {}).get("error", "invalid JSON")
            return error_response(400, f"the request body is not valid JSON: {reason} at "
                                       f"character {pos}", code="invalid_json")
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]

        def say(e: dict) -> str:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            if e.get("type") == "extra_forbidden":  # OpenAI's words for an unknown field
                return f"Unrecognized request argument supplied: {where}"
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            return f"{where}: {msg}"

        messages = "; ".join(say(e) for e in errors[:5])
        return error_response(400, messages or "invalid request", param=".".join(loc) or None,
                              code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        if exc.status_code == 413:  # BodyTooLarge: a body without Content-Length ran over
            return error_response(413, str(exc.detail), code="request_too_large")
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not read JSON
            return error_response(400, S.body_parse_error(exc.__cause__), code="invalid_json")
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):  # a bug of ours: an error body, no internals
        logging.getLogger("asymagent.server").error("unhandled error", exc_info=exc)
        return error_response(500, f"internal error ({type(exc).__name__}); the server log "
                                   "has the details", "server_error")

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise ApiError(401, "Incorrect API key provided.", "invalid_request_error",
                           code="invalid_api_key")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "queue_depth": worker.depth}

    @app.get("/version")
    async def version():
        from asymagent import __version__

        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def list_models():
        return S.ModelList(data=[S.ModelCard(id=model_name, created=created)]).model_dump()

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(check_key)])
    async def get_model(model_id: str):
        if model_id != model_name:
            raise ApiError(404, f"The model `{model_id}` does not exist.", "not_found_error",
                           param="model", code="model_not_found")
        return S.ModelCard(id=model_name, created=created).model_dump()

    async def next_event(job: GenerationJob, request: Request):
        """The job's next event; watches for a client disconnect and the hard deadline.

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

    def failure(ev: Failed) -> JSONResponse:
        return error_response(ev.status, ev.message, ev.type, ev.param, ev.code)

    def check_request(req) -> None:
        """404 for another model's name; 400 for text holding a lone UTF-16 surrogate."""
        if req.model != model_name:
            raise ApiError(404, f"The model `{req.model}` does not exist.", "not_found_error",
                           param="model", code="model_not_found")
        bad_text = S.lone_surrogate_at(req.model_dump(exclude_none=True))
        if bad_text is not None:
            raise ApiError(400, f"{bad_text}: the text holds a lone UTF-16 surrogate escape "
                                "(e.g. \\ud800), which is not valid Unicode", param=bad_text,
                           code="invalid_value")

    async def start(job: GenerationJob, request: Request):
        """Queue `job`; its Started event, or the Response to answer with instead."""
        try:
            worker.submit(job)
        except QueueFull as exc:
            return error_response(429, str(exc), "rate_limit_error", code="queue_full",
                                  headers={"Retry-After": str(worker.retry_after_s())})
        first = await next_event(job, request)
        if first is None:  # client gone before anything happened
            return Response(status_code=499)
        if isinstance(first, Failed):
            return failure(first)
        if not isinstance(first, Started):  # the worker always announces before anything else
            return error_response(500, f"internal error: unexpected event {first!r}",
                                  "server_error")
        return first

    async def finished(job: GenerationJob, request: Request):
        """The job's Finished event (not timed out), or the Response to answer with instead."""
        while True:
            ev = await next_event(job, request)
            if ev is None:
                return Response(status_code=499)
            if isinstance(ev, Failed):
                return failure(ev)
            if isinstance(ev, Finished):
                break
        if ev.timed_out:
            return error_response(504, f"request timed out after {request_timeout:g} s",
                                  "timeout_error", code="timeout")
        return ev

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(req: S.ChatCompletionRequest, request: Request):
        check_request(req)
        mode = req.mode or default_mode
        messages = [m.to_engine() for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        tool_choice = req.engine_tool_choice()
        engine_tools = tools if tool_choice != "none" else None
        temperature = default_temperature if req.temperature is None else req.temperature
        kwargs = dict(messages=messages, tools=engine_tools, mode=mode,
                      max_new_tokens=req.max_new_tokens(default_max_tokens),
                      temperature=temperature, seed=req.seed, top_p=req.top_p, stop=req.stop,
                      tool_choice=tool_choice if engine_tools else "auto",
                      cache_key=cache_key_for(messages, engine_tools, mode),
                      response_format=req.response_format.to_engine() if req.response_format
                      else None, **req.sampling())
        top = req.top_logprobs_count()
        recorder = kwargs["logprobs"] = None if top is None else LogprobRecorder(top)
        max_calls = 1 if req.parallel_tool_calls is False else None
        job = GenerationJob(kwargs, asyncio.get_running_loop(),
                            deadline=time.monotonic() + request_timeout)
        first = await start(job, request)
        if not isinstance(first, Started):
            return first
        prompt_tokens = first.prompt_tokens
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                stream_chunks(job, request, cid, mode, prompt_tokens, include_usage,
                              tools_enabled=engine_tools is not None, stop=req.stop,
                              recorder=recorder, max_calls=max_calls),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        ev = await finished(job, request)
        if not isinstance(ev, Finished):
            return ev
        result = ev.result
        calls = [S.ToolCall.model_validate(c) for c in (result.tool_calls or [])[:max_calls]]
        message = S.ResponseMessage(content=(result.text or None) if calls else (result.text or ""),
                                    tool_calls=calls or None)
        logprobs = None if recorder is None else {
            "content": chat_content(texts, visible(result.logprobs, stop_ids)), "refusal": None}
        body = S.ChatCompletion(
            id=cid, model=model_name, system_fingerprint=f"asymagent-{mode}",
            choices=[S.Choice(message=message, finish_reason=finish_reason_for(result),
                              logprobs=logprobs)],
            usage=S.Usage(**usage_for(result, prompt_tokens)))
        out = body.model_dump(exclude_none=False)
        out["asymagent"] = extension_for(result, mode)
        return JSONResponse(out)

    async def stream_chunks(job, request, cid, mode, prompt_tokens, include_usage, *,
                            tools_enabled, stop, recorder=None, max_calls=None):
        created_at = int(time.time())
        streamer = DeltaStreamer(tools_enabled=tools_enabled, stop=stop, max_calls=max_calls)
        sent = [0]  # log-prob entries sent so far
        covered = [0]  # tokens the text sent so far covers

        def take_logprobs(entries: list | None = None) -> dict | None:
            """Entries not sent yet, up to the tokens covered (all of `entries` at the end)."""
            if recorder is None:
                return None
            pool = recorder.entries[: covered[0]] if entries is None else entries
            fresh, sent[0] = pool[sent[0]:], max(sent[0], len(pool))
            return {"content": chat_content(texts, fresh), "refusal": None}

        def sse(delta: dict | None, finish: str | None = None, **extra) -> str:
            lp = take_logprobs(extra.pop("final_logprobs", None)) if delta is not None else None
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created_at,
                     "model": model_name, "system_fingerprint": f"asymagent-{mode}",
                     "choices": [] if delta is None else [
                         {"index": 0, "delta": delta, "logprobs": lp,
                          "finish_reason": finish}]}
            if include_usage:
                chunk["usage"] = None
            chunk.update(extra)
            return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

        try:
            # OpenAI opens with content "" for text and null when the answer may be a tool call.
            yield sse({"role": "assistant", "content": None if tools_enabled else ""})
            while True:
                ev = await next_event(job, request)
                if ev is None:
                    return  # client left: finally cancels the generation
                if isinstance(ev, TextDelta):
                    covered[0] = ev.tokens
                    for delta in streamer.push(ev.text):
                        yield sse(delta)
                elif isinstance(ev, Failed):
                    metrics.error(ev.status)
                    yield sse_error(ev)
                    yield "data: [DONE]\n\n"
                    return
                elif isinstance(ev, Finished):
                    result = ev.result
                    final = visible(result.logprobs, stop_ids) if recorder is not None else None
                    for delta in streamer.finish(result):
                        yield sse(delta, final_logprobs=final)
                    if ev.timed_out:
                        metrics.error(504)
                        yield sse_error(Failed(504, f"request timed out after "
                                               f"{request_timeout:g} s", "timeout_error",
                                               code="timeout"))
                    else:
                        reason = finish_reason_for(result, streamer.sent_tool_calls)
                        yield sse({}, reason, asymagent=extension_for(result, mode),
                                  final_logprobs=final)
                        if include_usage:
                            yield sse(None, usage=usage_for(result, prompt_tokens))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            job.cancel.set()  # a no-op once finished; stops generation if the client left

    register_completions(app, engine=engine, model_name=model_name, check_key=check_key,
                         check_request=check_request, start=start,
                         finished=finished, next_event=next_event, error_response=error_response,
                         texts=texts, defaults=dict(mode=default_mode,
                                                    temperature=default_temperature),
                         request_timeout=request_timeout)
    return app
