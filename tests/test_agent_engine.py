"""Agent on a real Engine (tiny random models, real tokenizer): constrained acting step, stats."""

from __future__ import annotations

from typing import Literal

import pytest
from conftest import make_tiny_llama

from asymagent.agents.agent import Agent
from asymagent.integrations.run_table import render_text
from asymagent.agents.tools import tool

V = 49152  # real SmolLM2 tokenizer ids

ran: list = []


@tool
def set_mode(mode: Literal["fast", "slow"], verbose: bool) -> str:
    """Switch the machine's mode."""
    ran.append((mode, verbose))
    return f"mode={mode} verbose={verbose}"


@pytest.fixture(scope="module")
def engine(smollm_tokenizer):
    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig

    return Engine(verifier=make_tiny_llama(vocab_size=V, seed=1),
                  drafter=make_tiny_llama(vocab_size=V, layers=1, seed=2),
                  tokenizer=smollm_tokenizer, spec=SpecConfig(k=2))


@pytest.mark.parametrize("mode", ["asym", "spec"])
def test_acting_step_is_a_valid_call_that_runs(engine, mode):
    ran.clear()
    # Enum and boolean parameters: the grammar is finite, so even a random model completes
    # the call (~20 tokens, more if it spells "true" in pieces) within 48 tokens.
    agent = Agent(engine, [set_mode], system_prompt="You control a machine.", mode=mode,
                  max_steps=2, max_new_tokens=48,
                  tool_choice=lambda step, messages: "required" if step == 0 else "auto")
    events = list(agent.stream("Switch to fast mode, quietly."))
    result = events[-1].result
    assert events[-1].kind == "done" and result is not None
    assert len(ran) >= 1 and ran[0][0] in ("fast", "slow") and isinstance(ran[0][1], bool)
    tool_msg = next(m for m in result.messages if m["role"] == "tool")
    assert tool_msg["content"] == f"mode={ran[0][0]} verbose={ran[0][1]}"
    first = result.stats.steps[0]
    assert first.mode == mode and first.forced_tokens >= 3  # '{"' 'name' '":' at least
    assert first.drafted > 0  # the acting step speculated under the constraint
    assert result.stopped_reason in ("answer", "max_steps")  # a random model may do either
    assert "run totals" in render_text(result.stats)
