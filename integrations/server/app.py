"""The OpenAI-compatible app of `asymagent serve` (FastAPI; the command is serve.py): `create_app` wires.

It builds the serving context (context.py: engine worker, metrics, limits, tracing, auth), the
middleware (the body cap, body_limit.py; CORS for the origins given, opt-in), the error handlers
(errors.py) and one handler object per endpoint: GET /health, /version, /metrics (health.py),
GET /v1/models[/{id}] (models.py), POST /v1/chat/completions (chat.py), POST /v1/completions
(completions.py), POST /v1/responses and GET /v1/responses/{id} (responses.py). docs/serving.md is the reference of the HTTP API.
"""

from __future__ import annotations

import contextlib

from asymagent.integrations.server.context import Limits, ServingContext

DEFAULT_MODEL_NAME = "asymagent"
DEFAULT_MAX_BODY_BYTES = 8 * 2**20


def create_app(engine, *, model_name: str | list[str] = DEFAULT_MODEL_NAME, api_key: str | None = None,
               max_queue: int = 16, request_timeout: float = 600.0, default_mode: str = "asym",
               default_max_tokens: int | None = None, default_temperature: float = 0.0,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               cors_origins: list[str] | None = None, max_model_len: int | None = None,
               trace_writer=None):
    """The FastAPI app serving `engine` (one worker thread, started with the app).

    `cors_origins`: browser origins allowed to call the API (CORS; None: no CORS headers, a
    preflight is refused). `max_model_len`: a context limit below the model's own. With a
    `trace_writer` (asymagent.trace_capture.TraceWriter) every completed chat request is captured."""
    if max_body_bytes < 1:
        raise ValueError("max_body_bytes must be >= 1")
    limits = Limits(request_timeout=request_timeout, default_mode=default_mode,
                    default_max_tokens=default_max_tokens,
                    default_temperature=default_temperature, max_queue=max_queue,
                    max_model_len=max_model_len)
    ctx = ServingContext(engine, model_name=model_name, limits=limits, api_key=api_key,
                         trace_writer=trace_writer)
    app = _app(ctx, max_body_bytes, cors_origins)
    _routes(app, ctx)
    return app


def _app(ctx: ServingContext, max_body_bytes: int, cors_origins: list[str] | None):
    from fastapi import FastAPI

    from asymagent.integrations.server.body_limit import BodyLimit
    from asymagent.integrations.server.errors import install_handlers

    @contextlib.asynccontextmanager
    async def lifespan(app):
        ctx.worker.start()
        try:
            yield
        finally:
            ctx.worker.stop()

    app = FastAPI(title="asymagent OpenAI-compatible server", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes, on_refused=ctx.refused_body)
    if cors_origins:  # added last: the outermost layer answers a preflight first
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"])
    app.state.ctx = ctx
    app.state.worker, app.state.metrics, app.state.engine = ctx.worker, ctx.metrics, ctx.engine
    install_handlers(app, ctx.respond)
    return app


def _routes(app, ctx: ServingContext) -> None:
    from fastapi import Depends

    from asymagent.integrations.server.chat import ChatCompletions
    from asymagent.integrations.server.completions import Completions
    from asymagent.integrations.server.health import Health
    from asymagent.integrations.server.models import Models
    from asymagent.integrations.server.responses import Responses

    keyed = [Depends(ctx.check_key)]
    health, models = Health(ctx), Models(ctx)
    app.get("/health")(health.health)
    app.get("/version")(health.version)
    app.get("/metrics")(health.metrics)
    app.get("/v1/models", dependencies=keyed)(models.list)
    app.get("/v1/models/{model_id:path}", dependencies=keyed)(models.get)
    app.post("/v1/chat/completions", dependencies=keyed)(ChatCompletions(ctx).create)
    app.post("/v1/completions", dependencies=keyed)(Completions(ctx).create)
    responses = Responses(ctx)
    app.post("/v1/responses", dependencies=keyed)(responses.create)
    app.get("/v1/responses/{response_id}", dependencies=keyed)(responses.retrieve)
