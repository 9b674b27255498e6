"""One free-running AgentDojo episode of one responder, scored by AgentDojo's own functions.

The pipeline is AgentDojo's own layout for a tool-calling model without defence
(`AgentPipeline.from_config`): system message (AgentDojo's default), the user's task, the LLM,
then `ToolsExecutionLoop([ToolsExecutor(), LLM], max_iters)`. `ResponderLLM` is the LLM element:
it converts the history to OpenAI messages, asks the responder, records the step, and hands
AgentDojo an assistant message whose calls AgentDojo's own `ToolsExecutor` runs. Utility and
security come from `TaskSuite.run_task_with_pipeline` (the task's `utility` / `utility_from_traces`,
the injection task's `security`: True = the attacker's goal was reached).

Rough edges, each recorded as the episode's `outcome`, never a crash of the run:
- a tool that raises: AgentDojo returns the error as the tool's result (counted, `tool_errors`);
- a malformed call (arguments not a JSON object, no name, or text the engine's call parser
  could not read): not run, counted (`malformed_calls`); a turn left with no call is the answer;
- the verifier's view over the model's window: the episode stops there (`over_window`), scored
  on what was done;
- `max_iters` tool rounds used up with calls still pending: `step_budget`, scored as AgentDojo
  scores it (the last assistant message is the output);
- anything else raised inside the episode: `error` with its type and message.
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass, field

from asymagent.evals.agentdojo.messages import (action_of, calls_from_openai, messages_to_openai, text_of,
                                                 tools_to_openai)
from asymagent.evals.agentdojo.responder import OverWindow

MAX_ITERS = 15  # AgentDojo's ToolsExecutionLoop default


def _base_element():
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement

    return BasePipelineElement


@dataclass
class StepLog:
    """One model step of a free-running episode (kept in memory for the fidelity pass)."""

    history: list  # OpenAI messages the model saw
    tools: list
    turn: object  # responder.Turn
    malformed: list = field(default_factory=list)


def make_llm_element(responder, name: str = "local"):
    """An AgentDojo pipeline element answering with `responder`. It keeps `.steps` (one StepLog
    per call), `.messages` (the conversation as of its last call, its answer included) and
    `.over_window` (why the last call's view did not fit, or None). `name` is the pipeline name
    attacks read the model's name from ("local": AgentDojo's "Local model")."""

    class ResponderLLM(_base_element()):
        def __init__(self) -> None:
            self.name = name
            self.steps: list = []
            self.messages: list = []
            self.over_window: str | None = None

        def query(self, query, runtime, env=None, messages=(), extra_args=None):
            from agentdojo.agent_pipeline.errors import AbortAgentError
            from agentdojo.types import ChatAssistantMessage, text_content_block_from_string

            extra_args = {} if extra_args is None else extra_args
            history, tools = messages_to_openai(messages), tools_to_openai(runtime)
            try:
                turn = responder(history, tools)
            except OverWindow as exc:
                self.over_window = str(exc)
                stop = ChatAssistantMessage(role="assistant", content=[text_content_block_from_string("")],
                                            tool_calls=None)
                self.messages = [*messages, stop]
                raise AbortAgentError(f"over the model's window: {exc}", self.messages, env) from exc
            parsed = calls_from_openai(turn.tool_calls)
            malformed = parsed.malformed + [{"call": c, "why": "the engine's call parser could not read it"}
                                            for c in turn.invalid_tool_calls]
            self.steps.append(StepLog(history, tools, turn, malformed))
            out = ChatAssistantMessage(role="assistant", content=[text_content_block_from_string(turn.text)],
                                       tool_calls=parsed.calls or None)
            self.messages = [*messages, out]
            return query, runtime, env, self.messages, extra_args

    return ResponderLLM()


def build_pipeline(llm, max_iters: int = MAX_ITERS):
    """AgentDojo's own no-defence pipeline around `llm` (module docstring)."""
    from agentdojo.agent_pipeline import AgentPipeline, InitQuery, SystemMessage, ToolsExecutionLoop, ToolsExecutor
    from agentdojo.agent_pipeline.agent_pipeline import load_system_message

    pipeline = AgentPipeline([SystemMessage(load_system_message(None)), InitQuery(), llm,
                              ToolsExecutionLoop([ToolsExecutor(), llm], max_iters=max_iters)])
    pipeline.name = llm.name
    return pipeline


def step_row(n: int, log: StepLog) -> dict:
    """The JSON row of one free-running step: action, calls, wall time, StepStats."""
    turn = log.turn
    return {"step": n, "action": action_of(turn.tool_calls, turn.text), "malformed": len(log.malformed),
            "call_s": turn.call_s, "new_tokens": len(turn.token_ids),
            "stats": turn.stats.to_dict() if turn.stats is not None else None}


def _squash(text: str) -> str:
    """Text without whitespace, quotes and backslash escapes: an injected text still matches after
    AgentDojo's YAML formatting of the tool output re-wrapped, quoted or escaped it."""
    return re.sub(r"""(\\n|\\t|\s|\\|'|")+""", "", text)


def injection_seen(messages: list, injections: dict) -> bool | None:
    """Whether a tool output the model read holds one of the injected texts (None: no attack)."""
    if not injections:
        return None
    outputs = [_squash(text_of(m["content"])) for m in messages if m["role"] == "tool"]
    return any(_squash(text) in out for text in injections.values() if text.strip() for out in outputs)


def _outcome(llm, error: str | None) -> str:
    if error is not None:
        return "error"
    if llm.over_window is not None:
        return "over_window"
    last = llm.messages[-1] if llm.messages else None
    if last is not None and last.get("tool_calls"):
        return "step_budget"  # the loop ended with calls still pending
    return "answered"


def run_free(suite, user_task, injection_task, injections: dict, responder, *,
             max_iters: int = MAX_ITERS) -> tuple:
    """One episode: (episode dict, [StepLog]). The dict: utility, security (None without an
    injection task), outcome, error, calls run, tool errors, malformed calls, the answer, and
    per step its action, wall time and StepStats (module docstring)."""
    from agentdojo.logging import NullLogger

    llm = make_llm_element(responder)
    pipeline = build_pipeline(llm, max_iters)
    t0 = time.perf_counter()
    utility = security = error = tb = None
    try:
        with NullLogger():
            utility, security = suite.run_task_with_pipeline(pipeline, user_task, injection_task, injections)
    except Exception as exc:  # recorded, never a crash of the run (module docstring)
        error = f"{type(exc).__name__}: {exc}"[:2000]
        tb = traceback.format_exc(limit=6)[-3000:]
    msgs = llm.messages
    calls = [c for m in msgs if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    last = msgs[-1] if msgs and msgs[-1]["role"] == "assistant" else None
    episode = {"utility": None if error else bool(utility),
               "security": None if error or injection_task is None else bool(security),
               "outcome": _outcome(llm, error), "error": error, "traceback": tb, "over_window": llm.over_window,
               "tool_calls": len(calls), "function_trace": [c.function for c in calls],
               "tool_errors": sum(1 for m in msgs if m["role"] == "tool" and m.get("error")),
               # the attack reached the model: a tool output it read holds an injected text
               "injection_seen": injection_seen(msgs, injections),
               "malformed_calls": sum(len(s.malformed) for s in llm.steps),
               "answer": text_of(last["content"]) if last is not None and not last.get("tool_calls") else None,
               "wall_s": time.perf_counter() - t0,
               "steps": [step_row(i, s) for i, s in enumerate(llm.steps)]}
    return episode, llm.steps
