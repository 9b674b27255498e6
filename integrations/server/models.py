"""GET /v1/models and GET /v1/models/{id}: the served model's card, once per served name."""

from __future__ import annotations

from asymagent.integrations.server import schemas as S
from asymagent.integrations.server.errors import model_not_found


class Models:
    """The handler of the model list and the model card (one per app)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def card(self, name: str) -> S.ModelCard:
        return S.ModelCard(id=name, created=self.ctx.created,
                           max_model_len=self.ctx.worker.max_context)

    async def list(self):
        return S.ModelList(data=[self.card(name) for name in self.ctx.model_names]).model_dump()

    async def get(self, model_id: str):
        if model_id not in self.ctx.model_names:
            return self.ctx.respond(model_not_found(model_id))
        return self.card(model_id).model_dump()
