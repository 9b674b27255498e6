"""The agent loop: an engine, tools, and a history that grows one step at a time.

    agent = Agent(engine, [add, search], system_prompt="...", mode="asym", max_steps=12)
    result = agent.run("What is 2 + 3?")       # RunResult(messages, answer, stats: RunStats)
    for event in agent.stream(task): ...        # StepEvent per model step / tool result / end

Each step calls `engine.chat(messages, tools=..., tool_choice=...)` on one cache session (the
history only grows, so the engine reuses its KV caches). Tool calls are validated and run;
a plain-text reply is the final answer. Nothing the model or a tool does crashes the loop:
unknown tool names, arguments that fail validation, a raising tool, a non-string return,
unparseable call JSON, running out of steps, an empty task: each becomes a clear message in
the run (a tool/user message for the model, and a note in `RunResult.notes`).

Thread-safe: runs of one Agent may overlap (threads, asyncio.to_thread); each run takes its own
cache session (`cache_key`, then `cache_key#1`, ... while earlier runs are still going), so
conversations never share views or caches, and the engine serialises the model calls.

`tool_choice` is "auto" (the model decides), "required" (every step is a constrained call),
a tool name, or a policy `f(step_index, messages) -> choice` (e.g. act until the last step).
`trace_dir=DIR` (or a TraceWriter) captures every model call as one trace line
(asymagent/trace_capture.py), the traffic `train-drafter --traces` and `asymagent tune` read.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from asymagent.request import GenerationRequest
from asymagent.stats import RunStats, StepStats
from asymagent.trace_capture import trace_writer
from asymagent.agents.tools import Tool, ToolOutcome, as_tool, tool  # noqa: F401  (tool re-exported)

__all__ = ["Agent", "RunResult", "StepEvent", "tool", "Tool"]

PARSE_ERROR_HINT = ('Reply with one JSON object {"name": <tool>, "arguments": {...}} to call a '
                    "tool, or with plain text for the final answer.")


@dataclass
class StepEvent:
    """One thing that happened in a run, for UIs and progress bars.

    kind: "model" (an engine call finished; `stats` set), "tool" (a tool ran; `message` is
    the tool message), "error" (something the model did wrong; `message` tells it what),
    "final" (the answer), "stopped" (run ended without an answer: max_steps, empty task),
    "done" (last event; `result` set).
    """

    kind: str
    step: int
    message: dict | None = None
    stats: StepStats | None = None
    text: str = ""
    result: "RunResult | None" = None


@dataclass
class RunResult:
    """A finished run: the whole conversation, the answer (None if none), and its costs."""

    messages: list
    answer: str | None
    stats: RunStats
    stopped_reason: str = "answer"  # answer | max_steps | empty_task
    notes: list = field(default_factory=list)  # readable notes: errors handled, coercions
    tool_calls: int = 0

    def to_dict(self) -> dict:
        return {"answer": self.answer, "stopped_reason": self.stopped_reason,
                "notes": list(self.notes), "tool_calls": self.tool_calls,
                "messages": self.messages, "stats": self.stats.to_dict()}


def _task_messages(task: Any) -> tuple[list, list | None]:
    """(initial messages, tool schemas carried by the task or None) from str/messages/Task."""
    if isinstance(task, str):
        return ([{"role": "user", "content": task}] if task.strip() else []), None
    if isinstance(task, list):
        for m in task:
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"task messages must be dicts with a role, got {m!r}"[:200])
        return [dict(m) for m in task], None
    if hasattr(task, "messages") and callable(task.messages):  # evals Task (duck-typed)
        return list(task.messages()), getattr(task, "tools", None)
    raise ValueError(f"task must be a string, a list of messages or a Task, got {type(task).__name__}")


class Agent:
    """Drives an engine through tool calls until a final answer (or max_steps)."""

    def __init__(self, engine, tools: list | None = None, system_prompt: str | None = None,
                 mode: str = "asym", max_steps: int = 16, *, max_new_tokens: int = 256,
                 temperature: float = 0.0, seed: int | None = None,
                 tool_choice: str | dict | Callable = "auto", cache_key: str = "agent",
                 trace_dir=None):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.engine = engine
        self.tools: dict[str, Tool] = {}
        for t in tools or []:
            t = as_tool(t)
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        self.system_prompt = system_prompt
        self.mode = mode
        self.max_steps = int(max_steps)
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.seed = seed
        # every step's request: this one with the step's seed, tools, tool_choice and cache key
        self.request = GenerationRequest.build(mode=mode, max_new_tokens=self.max_new_tokens,
                                               temperature=self.temperature, seed=seed)
        self.tool_choice = tool_choice
        self.cache_key = cache_key
        # capture: each model call as one JSONL trace line (a directory or a TraceWriter)
        self.trace_writer = trace_writer(trace_dir)
        self._keys_lock = threading.Lock()
        self._active_keys: set = set()  # cache sessions of the runs going on now

    @contextmanager
    def _session_key(self):
        """A cache_key no other running run of this agent uses (the plain one when free)."""
        with self._keys_lock:
            key, n = self.cache_key, 0
            while key in self._active_keys:
                n += 1
                key = f"{self.cache_key}#{n}"
            self._active_keys.add(key)
        try:
            yield key
        finally:
            with self._keys_lock:
                self._active_keys.discard(key)

    # ------------------------------------------------------------------------------------
    def run(self, task) -> RunResult:
        result = None
        for event in self.stream(task):
            result = event.result or result
        return result

    def stream(self, task) -> Iterator[StepEvent]:
        with self._session_key() as cache_key:
            yield from self._stream(task, cache_key)

    def _stream(self, task, cache_key: str) -> Iterator[StepEvent]:
        messages, task_tools = _task_messages(task)
        stats = RunStats()
        notes: list[str] = []
        if not any(m["role"] == "user" and str(m.get("content") or "").strip() for m in messages):
            note = "empty task: there is no user request, so the agent did nothing"
            result = RunResult(messages, None, stats, "empty_task", [note])
            yield StepEvent("stopped", 0, text=note)
            yield StepEvent("done", 0, result=result)
            return
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        schemas = [t.openai_schema() for t in self.tools.values()]
        if task_tools and not schemas:
            notes.append("the task lists tools but the agent has none to run them")
        calls = 0
        for step in range(self.max_steps):
            choice = self._choice(step, messages)
            seed = None if self.seed is None else self.seed + step
            request = self.request.replace(seed=seed, tools=schemas or None,
                                           tool_choice=choice if schemas else "auto",
                                           cache_key=cache_key)
            r = self.engine.chat(messages, request=request)
            stats.add(r.stats)
            if self.trace_writer is not None:
                self.trace_writer.record(self.engine, messages, schemas or None, r, source="agent",
                                         mode=self.mode, temperature=self.temperature)
            tool_calls = list(r.tool_calls or [])
            invalid = list(getattr(r, "invalid_tool_calls", None) or [])
            assistant = {"role": "assistant", "content": r.text or ""}
            if tool_calls:
                assistant["tool_calls"] = tool_calls
            messages.append(assistant)
            yield StepEvent("model", step, message=assistant, stats=r.stats, text=r.text or "")
            if not tool_calls and invalid:
                errs = "; ".join(f"{c.get('name') or '?'}: {c.get('error')}" for c in invalid)
                text = f"Error: your tool call could not be parsed ({errs}). {PARSE_ERROR_HINT}"
                notes.append(f"step {step}: unparseable tool call ({errs})")
                msg = {"role": "user", "content": text}
                messages.append(msg)
                yield StepEvent("error", step, message=msg, text=text)
                continue
            if not tool_calls:
                result = RunResult(messages, r.text or "", stats, "answer", notes, calls)
                yield StepEvent("final", step, message=assistant, text=r.text or "")
                yield StepEvent("done", step, result=result)
                return
            for call in tool_calls:
                calls += 1
                msg, outcome = self._run_call(call)
                messages.append(msg)
                if outcome.error is not None:
                    notes.append(f"step {step}: {outcome.content}")
                if outcome.note:
                    notes.append(f"step {step}: tool {msg.get('name')!r} {outcome.note}")
                kind = "error" if outcome.error is not None else "tool"
                yield StepEvent(kind, step, message=msg, text=outcome.content)
        note = (f"stopped after max_steps={self.max_steps} steps without a final answer "
                "(the model kept calling tools)")
        notes.append(note)
        result = RunResult(messages, None, stats, "max_steps", notes, calls)
        yield StepEvent("stopped", self.max_steps - 1, text=note)
        yield StepEvent("done", self.max_steps - 1, result=result)

    # ------------------------------------------------------------------------------------
    def _choice(self, step: int, messages: list):
        choice = self.tool_choice
        return choice(step, messages) if callable(choice) else choice

    def _run_call(self, call: dict) -> tuple[dict, ToolOutcome]:
        fn = call.get("function") or {}
        name = fn.get("name") or ""
        call_id = call.get("id") or ""
        tool_ = self.tools.get(name)
        if tool_ is None:
            known = ", ".join(self.tools) or "(none)"
            outcome = ToolOutcome(f"Error: unknown tool {name!r}; available tools: {known}",
                                  error=f"unknown tool {name!r}")
        else:
            outcome = tool_.invoke(fn.get("arguments"))
        msg = {"role": "tool", "tool_call_id": call_id, "name": name, "content": outcome.content}
        return msg, outcome


def call_arguments(call: dict) -> dict | str:
    """The arguments of an OpenAI-shape call as a dict (or the raw string if not JSON)."""
    args = (call.get("function") or {}).get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args or {}
