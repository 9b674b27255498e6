"""GET /health, GET /version (vLLM's) and GET /metrics (Prometheus text): the probes' endpoints."""

from __future__ import annotations


class Health:
    """The handler of the probe endpoints (open without the API key; one per app)."""

    def __init__(self, ctx):
        self.ctx = ctx

    async def health(self):
        return {"status": "ok", "model": self.ctx.model_name, "queue_depth": self.ctx.worker.depth}

    async def version(self):
        from asymagent import __version__

        # the weights dtype and the CPU's bf16 unit, as `asymagent --version` prints them
        return {"version": __version__, **getattr(self.ctx.engine, "runtime", {})}

    async def metrics(self):
        from fastapi.responses import Response

        from asymagent.integrations.server.metrics import CONTENT_TYPE_LATEST

        return Response(self.ctx.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
