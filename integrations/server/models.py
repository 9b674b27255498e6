"""GET /v1/models and GET /v1/models/{id}: the one served model (its card)."""

from __future__ import annotations

from asymagent.integrations.server import schemas as S
from asymagent.integrations.server.errors import model_not_found


class Models:
    """The handler of the model list and the model card (one per app)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def card(self) -> S.ModelCard:
        return S.ModelCard(id=self.ctx.model_name, created=self.ctx.created,
                           max_model_len=self.ctx.worker.max_context)

    async def list(self):
        return S.ModelList(data=[self.card()]).model_dump()

    async def get(self, model_id: str):
        if model_id != self.ctx.model_name:
            return self.ctx.respond(model_not_found(model_id))
        return self.card().model_dump()
