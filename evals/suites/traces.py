"""User traces for evals: scoring a model output against a trace step, and cutting oracle episodes into traces.

The file format (JSONL, one step per line) and its loader live in asymagent/traces.py (the core:
drafter training and capture use it too); they are re-exported here for the eval runner.
"""

from __future__ import annotations

from asymagent.traces import TraceExample, conversations, load_traces, parse_call, write_traces  # noqa: F401

def _norm_text(text: str | list | None) -> str:
    if isinstance(text, list):  # content parts
        text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
    return " ".join((text or "").split())


def score_output(example: TraceExample, tool_calls: list | None, text: str | None) -> bool:
    """Did a model output match the trace's expected message (calls in order, or the text)?"""
    if example.is_tool_step:
        got = [parse_call(c) for c in tool_calls or []]
        return got == example.expected_calls()
    return not tool_calls and _norm_text(text) == _norm_text(example.expected.get("content"))


def traces_from_episode(task, history: list) -> list:
    """Cut an oracle episode into one TraceExample per assistant turn (handy for making trace files)."""
    out = []
    for i, msg in enumerate(history):
        if msg.get("role") == "assistant":
            out.append(TraceExample(f"{task.suite}:{task.seed}:{len(out)}", history[:i], task.tools, msg))
    return out
