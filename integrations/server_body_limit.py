"""ASGI middleware that caps request bodies (`asymagent serve --max-body-bytes`): 413 with an OpenAI error body.

A body whose `Content-Length` is over the limit is refused before a byte of it is read; a body
without one (chunked) is counted as it arrives, and the read that crosses the limit raises
`BodyTooLarge`, an HTTPException(413) the app's handler turns into the OpenAI error body.
(FastAPI's own `max_body_size` answers a declared oversize body with a plain-text 413 whatever
the app's handlers say, which OpenAI clients cannot parse; hence this one.)
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(status_code=413, detail=too_large_message(limit))


def too_large_message(limit: int) -> str:
    return (f"the request body is larger than this server's limit of {limit} bytes "
            "(asymagent serve --max-body-bytes)")


class BodyLimit:
    """Wraps an ASGI app; `on_refused(status)` is told of every request refused up front."""

    def __init__(self, app, max_body_bytes: int, on_refused=None):
        self.app, self.limit, self.on_refused = app, int(max_body_bytes), on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.limit:
            if self.on_refused is not None:
                self.on_refused(413)
            body = json.dumps({"error": {"message": too_large_message(self.limit),
                                         "type": "invalid_request_error", "param": None,
                                         "code": "request_too_large"}}).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)
