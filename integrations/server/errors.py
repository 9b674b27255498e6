"""Errors of the server as values (`Failed`), their OpenAI error bodies, and the app's exception handlers.

A handler that cannot answer returns a `Failed` (status + OpenAI error fields); the serving
context turns it into the response (`ServingContext.respond`) or, once a stream has started,
into an SSE error event (`sse_error`). Only what FastAPI itself raises (request validation, an
unknown route, an unreadable body, the auth dependency's `ApiError`) goes through the
exception handlers installed here. Every error body is `{"error": {"message", "type", "param",
"code"}}`; messages pass through `ErrorDetail`, which strips a dependency's log stamps and
source paths.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

log = logging.getLogger("asymagent.server")
# Refusals (4xx) are logged at INFO with their reason under uvicorn's error logger, so
# `asymagent serve --log-level info` prints them beside uvicorn's own lines.
refusals = logging.getLogger("uvicorn.error").getChild("asymagent")


@dataclass
class Failed:
    """An error to answer with: HTTP status + OpenAI error fields (499: the client left)."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict | None = None


def gone() -> Failed:
    """The client went away before the answer (answered with a bare 499, never counted)."""
    return Failed(499, "client closed the request")


def timed_out(request_timeout: float) -> Failed:
    return Failed(504, f"request timed out after {request_timeout:g} s", "timeout_error",
                  code="timeout")


def model_not_found(model: str) -> Failed:
    return Failed(404, f"The model `{model}` does not exist.", "not_found_error", param="model",
                  code="model_not_found")


class ApiError(Exception):
    """A `Failed` raised where FastAPI needs an exception (the API-key dependency)."""

    def __init__(self, failed: Failed):
        super().__init__(failed.message)
        self.failed = failed


def error_body(failed: Failed) -> dict:
    from asymagent.integrations.server.schemas import ErrorBody, ErrorDetail

    return ErrorBody(error=ErrorDetail(message=failed.message, type=failed.type,
                                       param=failed.param, code=failed.code)).model_dump()


def sse_error(failed: Failed) -> str:
    """A server-sent event carrying an OpenAI error body (an error after a stream started)."""
    return f"data: {json.dumps(error_body(failed))}\n\n"


def validation_failure(errors: list[dict]) -> Failed:
    """The 400 for a body pydantic refused: the first five problems, `param` the first's field;
    an unknown field in OpenAI's words; a body that is not JSON says where."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":  # FastAPI's loc is ("body", character offset)
        pos = first.get("loc", ("body", "?"))[-1]
        reason = (first.get("ctx") or {}).get("error", "invalid JSON")
        return Failed(400, f"the request body is not valid JSON: {reason} at character {pos}",
                      code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]

    def say(e: dict) -> str:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        if e.get("type") == "extra_forbidden":  # OpenAI's words for an unknown field
            return f"Unrecognized request argument supplied: {where}"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        return f"{where}: {msg}"

    messages = "; ".join(say(e) for e in errors[:5])
    return Failed(400, messages or "invalid request", param=".".join(loc) or None,
                  code="invalid_value")


def endpoints(app) -> list[str]:
    """'METHOD /path' of every endpoint the app serves (its API routes)."""
    from fastapi.routing import APIRoute

    out = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            out += [f"{method} {route.path}" for method in sorted(route.methods)]
    return out


def unknown_route(request) -> Failed:
    """The 404 of a path nobody serves: it names the path and lists the endpoints."""
    listed = ", ".join(endpoints(request.app))
    return Failed(404, f"Unknown request URL: {request.method} {request.url.path}. This server "
                       f"serves: {listed}", "not_found_error", code="unknown_url")


def install_handlers(app, respond) -> None:
    """FastAPI's own exceptions as OpenAI error bodies; `respond(Failed) -> Response`."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from asymagent.integrations.server.schemas import body_parse_error

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return respond(exc.failed)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        return respond(validation_failure(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        if exc.status_code == 413:  # BodyTooLarge: a body without Content-Length ran over
            return respond(Failed(413, str(exc.detail), code="request_too_large"))
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not read JSON
            return respond(Failed(400, body_parse_error(exc.__cause__), code="invalid_json"))
        if exc.status_code == 404:
            return respond(unknown_route(request))
        if exc.status_code == 405:  # a known path with another method
            listed = ", ".join(endpoints(request.app))
            return respond(Failed(405, f"Method {request.method} is not allowed for "
                                       f"{request.url.path}. This server serves: {listed}"))
        return respond(Failed(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):  # a bug of ours: an error body, no internals
        log.error("unhandled error", exc_info=exc)
        return respond(Failed(500, f"internal error ({type(exc).__name__}); the server log has "
                                   "the details", "server_error"))
