"""AsymContextMiddleware: context compression for `langchain.agents.create_agent`, any chat model.

    from langchain.agents import create_agent
    agent = create_agent(model, tools, middleware=[AsymContextMiddleware(CompressionConfig())])

- Any chat model (remote ones too): each model call sees the compressed view of the history
  (old tool outputs cut to head/tail, old turns demoted to stubs, an optional token budget),
  counted with tiktoken's offline cl100k encoding, or the model's tokenizer when given. The
  view is append-stable across the run (asymagent.context.views.ContextViews), so provider-side prompt
  caches keep hitting; the agent's state keeps the full history.
- ChatAsymSpec: the request goes through untouched. The engine builds both views itself: the
  drafter reads the full history, the verifier the compressed one (that is the algorithm), with
  the engine's own CompressionConfig (`Engine.from_default(compression=...)`).
`stats` records, per model call, the full and compressed token counts and rewrites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse

from asymagent.integrations.langchain import ChatAsymSpec, to_openai_messages
from asymagent.context.views import CompressionConfig, ContextViews


@dataclass
class CallRecord:
    """One model call seen by the middleware."""

    model: str
    full_tokens: int
    compressed_tokens: int
    rewrites: int
    passthrough: bool  # ChatAsymSpec: the engine compressed for itself


def _unwrap(model: Any) -> Any:
    """The chat model under a RunnableBinding (bind_tools) if any."""
    return getattr(model, "bound", model)


class AsymContextMiddleware(AgentMiddleware):
    """Applies a CompressionConfig to what the agent's chat model reads at every step."""

    def __init__(self, compression: CompressionConfig | dict | str | None = None, *,
                 tokenizer=None, counter=None) -> None:
        super().__init__()
        self.compression = CompressionConfig.from_any(compression)
        self.tokenizer = tokenizer
        self._counter = counter
        self._views: ContextViews | None = None
        self.stats: list[CallRecord] = []

    # --- the two cases ------------------------------------------------------------------
    def _views_for(self) -> ContextViews:
        if self._views is None:
            from asymagent.context.token_counting import make_counter

            counter = self._counter or make_counter(self.tokenizer)
            self._views = ContextViews(compression=self.compression, counter=counter)
        return self._views

    def compress_request(self, request: ModelRequest) -> ModelRequest:
        """The request with message contents replaced by their compressed forms."""
        model = _unwrap(request.model)
        if isinstance(model, ChatAsymSpec):
            self.stats.append(CallRecord(model.model_name, 0, 0, 0, True))
            return request
        messages = list(request.messages)
        oa = to_openai_messages(messages)
        system = request.system_message
        prefix = to_openai_messages([system]) if system is not None else []
        view = self._views_for().compress_messages(prefix + oa)
        compressed = view.messages[len(prefix):]
        if len(compressed) != len(messages):  # defensive: the view keeps one entry per message
            raise RuntimeError("compressed view changed the number of messages")
        out = []
        for original, comp, src in zip(messages, compressed, oa):
            if comp.get("content") != src.get("content") and original.type in ("tool", "human"):
                original = original.model_copy(update={"content": comp["content"]})
            out.append(original)
        name = getattr(model, "model_name", None) or getattr(model, "model", None) or \
            type(model).__name__
        self.stats.append(CallRecord(str(name), view.full_tokens, view.compressed_tokens,
                                     view.rewrites, False))
        return request.override(messages=out)

    # --- AgentMiddleware hooks ----------------------------------------------------------
    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        return handler(self.compress_request(request))

    async def awrap_model_call(self, request: ModelRequest, handler) -> ModelResponse:
        return await handler(self.compress_request(request))
