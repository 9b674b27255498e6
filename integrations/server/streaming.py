"""The one streaming loop: a job's worker events -> server-sent events, for every streaming endpoint.

`relay(ctx, job, request, encoder)` reads the job's events (watching for a client disconnect and
the deadline through the serving context) and asks the endpoint's `encoder` for the SSE lines:
`encoder.text(event)` for each TextDelta, `encoder.finish(result, timed_out)` once at the end.
An error (a Failed event, the deadline) becomes an SSE error event and `[DONE]`, counted in the
metrics; the encoder's `closed` is then set, and so is it when the client left, so the endpoint
stops sending. What a chunk looks like is the encoder's business (chat.py, completions.py,
responses.py).
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from asymagent.integrations.server.errors import Failed, sse_error, timed_out
from asymagent.integrations.server.worker import Finished, TextDelta

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Encoder(Protocol):
    closed: bool  # set by relay: the stream ended early (error sent, or the client left)

    def text(self, event: TextDelta) -> list[str]:
        """SSE lines for newly decoded text."""

    def finish(self, result, timed_out: bool) -> list[str]:
        """SSE lines for the end of the job (before the error event when it timed out)."""

    def error(self, failed: Failed) -> list[str]:
        """SSE lines for an error after the stream started (then nothing more is sent)."""


def error_lines(failed: Failed) -> list[str]:
    """Chat Completions' way: the error body as an event, then [DONE]."""
    return [sse_error(failed), DONE]


async def relay(ctx, job, request, encoder: Encoder) -> AsyncIterator[str]:
    """SSE lines for one job, from its first event to its end (see the module docstring)."""
    while True:
        ev = await ctx.next_event(job, request)
        if ev is None:  # client gone: the endpoint's finally cancels the generation
            encoder.closed = True
            return
        if isinstance(ev, TextDelta):
            for line in encoder.text(ev):
                yield line
        elif isinstance(ev, Failed):
            ctx.count_error(ev)
            encoder.closed = True
            for line in encoder.error(ev):
                yield line
            return
        elif isinstance(ev, Finished):
            for line in encoder.finish(ev.result, ev.timed_out):
                yield line
            if ev.timed_out:
                failed = timed_out(ctx.limits.request_timeout)
                ctx.count_error(failed)
                encoder.closed = True
                for line in encoder.error(failed):
                    yield line
            return
