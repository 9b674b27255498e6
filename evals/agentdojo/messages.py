"""AgentDojo's chat messages and tools <-> the OpenAI shapes `Engine.chat` reads and writes.

The conversion follows AgentDojo's own OpenAI client (`agent_pipeline/llms/openai_llm.py`): a
tool message carries its error when the tool failed, else its text; an assistant message keeps
its text and its calls (arguments as JSON). Calls without an id (AgentDojo's ground-truth
pipeline writes none) get `call_<n>`, n counting the conversation's calls, so the same history
always renders the same prompt. Tools are `Function.parameters.model_json_schema()`, as the
OpenAI client sends them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


def text_of(content) -> str:
    """AgentDojo content blocks (or None) -> one string (its `get_text_content_as_str`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(block["content"] for block in content if block.get("content") is not None)


def tools_to_openai(runtime) -> list:
    """The runtime's functions as OpenAI tool schemas, in the runtime's order."""
    return [{"type": "function", "function": {"name": f.name, "description": f.description,
                                              "parameters": f.parameters.model_json_schema()}}
            for f in runtime.functions.values()]


def messages_to_openai(messages) -> list:
    """AgentDojo ChatMessages -> OpenAI chat messages (list of dicts)."""
    out: list = []
    ids: list = []  # the id given to each assistant call, in order (tool results follow them)
    for m in messages:
        role = m["role"]
        if role in ("system", "user"):
            out.append({"role": role, "content": text_of(m["content"])})
        elif role == "assistant":
            msg = {"role": "assistant", "content": text_of(m["content"])}
            calls = []
            for call in m.get("tool_calls") or []:
                call_id = call.id or f"call_{len(ids)}"
                ids.append(call_id)
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": call.function, "arguments": json.dumps(dict(call.args))}})
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            call = m.get("tool_call")
            call_id = m.get("tool_call_id") or (call.id if call is not None and call.id else None)
            if call_id is None:  # the n-th result answers the n-th call
                done = sum(1 for o in out if o["role"] == "tool")
                call_id = ids[done] if done < len(ids) else f"call_{done}"
            out.append({"role": "tool", "tool_call_id": call_id, "name": call.function if call else "",
                        "content": m.get("error") or text_of(m["content"])})
        else:
            raise ValueError(f"unknown AgentDojo message role {role!r}")
    return out


@dataclass
class ParsedCalls:
    """The model's OpenAI tool calls as AgentDojo FunctionCalls, and the ones that could not be."""

    calls: list  # list[agentdojo FunctionCall]
    malformed: list  # [{"call": the raw OpenAI call, "why": str}]


def calls_from_openai(tool_calls: list) -> ParsedCalls:
    """OpenAI tool calls (arguments a JSON string or a dict) -> FunctionCalls; a call whose
    arguments are not a JSON object, or that has no name, is listed as malformed (not run)."""
    from agentdojo.functions_runtime import FunctionCall

    calls, malformed = [], []
    for n, call in enumerate(tool_calls or []):
        fn = call.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else (raw if raw is not None else {})
        except json.JSONDecodeError as exc:
            malformed.append({"call": call, "why": f"arguments are not JSON: {exc}"})
            continue
        if not name or not isinstance(args, dict):
            malformed.append({"call": call, "why": "no function name" if not name else "arguments are not an object"})
            continue
        calls.append(FunctionCall(function=name, args=args, id=call.get("id") or f"call_{n}"))
    return ParsedCalls(calls, malformed)


def action_of(tool_calls: list, text: str) -> dict | str:
    """What a step did, comparable across modes: its calls [{"name", "arguments"}] (arguments
    parsed; unparseable ones kept as their string), or the text when it made no call."""
    if not tool_calls:
        return " ".join((text or "").split())  # whitespace-normalised
    out = []
    for call in tool_calls:
        fn = call.get("function") or {}
        raw = fn.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            args = raw
        out.append({"name": fn.get("name"), "arguments": args})
    return {"calls": out}
