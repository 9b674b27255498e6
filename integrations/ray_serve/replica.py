"""An engine replica of `asymagent serve --ray`: one Engine behind the single server's own app.

Each replica builds its engine once (`engine_factory()`, run in the replica's process: weights
are read from that node's disk, never shipped) and wraps it in `create_app(engine, **app_kwargs)`,
the app `asymagent serve` runs, so every endpoint, field, error, stream and the 429 of a full
queue behave exactly as on one server. `handle_request` runs one HTTP request through that app
(asgi_call.py) and streams the response back; `metrics` returns this replica's Prometheus text
and identity for the ingress's /metrics (called on every replica by `DeploymentHandle.broadcast`).

With `trace_dir`, each replica writes its traces into its own sub-directory
`TRACE_DIR/replica-<replica id>` (a replaced replica gets a new one; `asymagent eval TRACE_DIR`
reads them all, docs/evals.md "Captured traces").
"""

from __future__ import annotations

import os
import socket
from typing import Any, AsyncIterator, Callable

from asymagent.integrations.ray_serve.asgi_call import HttpRequest, call_asgi


def replica_name() -> str:
    """This replica's Ray Serve id (its unique part), or the pid outside Ray Serve."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a Serve replica (unit use)
        return f"pid{os.getpid()}"


def build_trace_writer(trace: dict | None, name: str):
    """The replica's TraceWriter in `trace["dir"]/replica-<name>`, or None without --trace-dir."""
    if not trace:
        return None
    from asymagent.trace_capture import TraceWriter

    return TraceWriter(os.path.join(trace["dir"], f"replica-{name}"),
                       max_bytes=trace["max_bytes"], max_files=trace.get("max_files"),
                       secrets=tuple(trace.get("secrets") or ()))


class EngineReplica:
    """Ray Serve deployment body (launch.py wraps it with `serve.deployment`)."""

    def __init__(self, engine_factory: Callable[[], Any], app_kwargs: dict,
                 trace: dict | None = None, threads: int = 1) -> None:
        import torch

        from asymagent.integrations.server import create_app

        torch.set_num_threads(max(1, int(threads)))  # the CPUs Ray gave this replica, no more
        self.name = replica_name()
        self.engine = engine_factory()
        self.app = create_app(self.engine, trace_writer=build_trace_writer(trace, self.name),
                              **app_kwargs)
        self.app.state.worker.start()

    async def handle_request(self, request: dict, conversation: str | None = None
                             ) -> AsyncIterator:
        """Stream the response to `request` (an HttpRequest dict): the start, then chunks.
        `conversation` is read by the router (router.py), not here."""
        async for part in call_asgi(self.app, HttpRequest(**request)):
            yield part

    async def metrics(self) -> dict:
        """This replica's identity and Prometheus exposition (text)."""
        return {"replica": self.name, "pid": os.getpid(), "host": socket.gethostname(),
                "queue_depth": self.app.state.worker.depth,
                "exposition": self.app.state.metrics.exposition().decode()}

    def __del__(self) -> None:
        app = getattr(self, "app", None)
        if app is not None:
            app.state.worker.stop(timeout=5.0)
