"""One HTTP request run through an in-process ASGI app, its response as an async stream of parts.

An engine replica serves the single server's own app (`create_app`) this way: the ingress hands
over the request as a plain dict (`HttpRequest.to_dict`), the replica yields the response start
(`{"status", "headers"}`) and then body chunks as the app sends them, so streaming (SSE) passes
through chunk by chunk. When the caller stops reading (its client went away, Ray cancelled the
call) the app's `receive()` reports `http.disconnect`, which is how the single server already
notices a departed client: its generation is cancelled at the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator

FINISH_GRACE_S = 30.0  # after the response (or a disconnect), the app task gets this long to end


@dataclass
class HttpRequest:
    """What an engine replica needs of a request (plain data: it crosses processes)."""

    method: str
    path: str
    query: bytes = b""
    headers: list = field(default_factory=list)  # [(name, value)] as str, names lower-case
    body: bytes = b""

    def to_dict(self) -> dict:
        return asdict(self)


def scope_for(req: HttpRequest) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": req.method, "scheme": "http", "path": req.path,
            "raw_path": req.path.encode(), "query_string": req.query, "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in req.headers],
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}


async def call_asgi(app, req: HttpRequest) -> AsyncIterator:
    """Yield `{"status": int, "headers": [(name, value)]}` once, then `bytes` chunks."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await sent.put(message)

    task = asyncio.ensure_future(app(scope_for(req), receive, send))
    try:
        while True:
            getter = asyncio.ensure_future(sent.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():  # the app returned or raised without sending more
                getter.cancel()
                if sent.empty():
                    task.result()  # re-raises the app's exception, if any
                    return
                message = sent.get_nowait()
            else:
                message = getter.result()
            if message["type"] == "http.response.start":
                yield {"status": int(message["status"]),
                       "headers": [(k.decode("latin-1"), v.decode("latin-1"))
                                   for k, v in message.get("headers", [])]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    return
    finally:
        gone.set()  # a departed caller reads as a client disconnect
        if not task.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), FINISH_GRACE_S)
