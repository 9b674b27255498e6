"""create_agent (LangGraph) with ChatAsymSpec and AsymContextMiddleware: real tool, real models.

The fast tests use a recording chat model to check what the middleware lets a (remote) model
see; the slow test runs the embedded SmolLM2 through `langchain.agents.create_agent`.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from asymagent.integrations.middleware import AsymContextMiddleware
from asymagent.context.token_counting import TiktokenCounter

LONG = " ".join(f"line {i}: the quarterly ledger entry {i * 7} was reconciled." for i in range(200))


@tool
def read_ledger(page: int) -> str:
    """Read one page of the ledger (long text)."""
    return f"page {page}\n" + LONG


class RecordingModel(BaseChatModel):
    """A chat model that answers from a script and records every message list it is shown."""

    script: list
    seen: list = []

    @property
    def _llm_type(self) -> str:
        return "recording"

    def bind_tools(self, tools, **kw):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kw: Any) -> ChatResult:
        self.seen.append(list(messages))
        msg = self.script[min(len(self.seen) - 1, len(self.script) - 1)]
        return ChatResult(generations=[ChatGeneration(message=msg)])


def _call(page: int, i: int) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "read_ledger", "args": {"page": page}, "id": f"c{i}"}])


def test_middleware_compresses_what_a_remote_model_sees():
    script = [_call(p, p) for p in range(1, 6)] + [AIMessage("Five pages read.")]
    model = RecordingModel(script=script, seen=[])
    mw = AsymContextMiddleware()
    agent = create_agent(model, [read_ledger], middleware=[mw])
    out = agent.invoke({"messages": [{"role": "user", "content": "Read pages 1-5."}]})
    assert out["messages"][-1].content == "Five pages read."
    # The graph state keeps every tool output whole ...
    full = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(full) == 5 and all(LONG in m.content for m in full)
    # ... while the model's last view has the old ones cut (default tool_output: 64 head +
    # 32 tail tokens of a ~3k-token output), and the newest output may stay whole.
    last_view = [m for m in model.seen[-1] if isinstance(m, ToolMessage)]
    counter = TiktokenCounter()
    assert counter.count(last_view[0].content) < counter.count(full[0].content) // 4
    assert len(mw.stats) == 6 and mw.stats[-1].compressed_tokens < mw.stats[-1].full_tokens
    assert not any(r.passthrough for r in mw.stats)
    # Views are append-stable across steps: earlier compressed contents never change.
    first_view = [m.content for m in model.seen[2] if isinstance(m, ToolMessage)]
    later_view = [m.content for m in model.seen[-1] if isinstance(m, ToolMessage)]
    assert later_view[: len(first_view) - 1] == first_view[:-1]


@pytest.mark.slow
def test_create_agent_runs_a_python_tool_on_the_embedded_default():
    from asymagent.engine import Engine
    from asymagent.integrations.langchain import ChatAsymSpec
    from asymagent.modeling.loading import ModelNotFoundError, load_default_verifier

    try:
        engine = Engine.from_default()
    except ModelNotFoundError:  # no trained drafter shipped yet: a 2-layer cut of the verifier
        from asymagent.modeling.drafter import build_drafter

        ver = load_default_verifier()
        engine = Engine(verifier=ver.model, drafter=build_drafter(ver.model, num_layers=2),
                        tokenizer=ver.tokenizer)
    ran = []

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        ran.append((a, b))
        return a * b

    @wrap_model_call
    def act_then_answer(request, handler):
        # The agent's policy: the first step must act (a constrained call), then answer.
        acted = any(isinstance(m, ToolMessage) for m in request.messages)
        return handler(request.override(tool_choice="none" if acted else "any"))

    mw = AsymContextMiddleware()
    llm = ChatAsymSpec(engine=engine, mode="asym", max_tokens=24)
    agent = create_agent(llm, [multiply], system_prompt="You are a calculator.",
                         middleware=[act_then_answer, mw])
    out = agent.invoke({"messages": [{"role": "user", "content": "What is 12 times 7?"}]},
                       {"recursion_limit": 6})
    msgs = out["messages"]
    assert len(ran) == 1 and all(isinstance(x, int) for x in ran[0])  # validated ints
    tool_msg = next(m for m in msgs if isinstance(m, ToolMessage))
    assert tool_msg.content == str(ran[0][0] * ran[0][1])
    final = msgs[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and final.content
    stats = final.response_metadata["step_stats"]
    assert stats["mode"] == "asym" and stats["new_tokens"] >= 1
    assert all(r.passthrough for r in mw.stats)  # ChatAsymSpec builds its own views
