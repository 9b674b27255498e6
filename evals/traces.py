"""User traces: load JSONL of OpenAI-format conversations with the expected next assistant message.

One JSON object per line (blank lines and lines starting with `#` are skipped):

    {"id": "optional-name",
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "", "tool_calls": [...]},
                  {"role": "tool", "tool_call_id": "...", "content": "..."}, ...],
     "tools": [{"type": "function", "function": {"name": ..., "parameters": {...}}}],   # optional
     "expected": {"role": "assistant", "content": "...", "tool_calls": [...]}}

`expected` is the next assistant message: with `tool_calls` the step is a tool step (scored on
name + parsed arguments of every call, in order), otherwise a text step (scored on the text,
whitespace-normalised). Each line is one teacher-forced step for the runner. Validation uses
pydantic (this is a boundary); an invalid line raises ValueError naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from asymagent.evals.environments import parse_call

ROLES = ("system", "user", "assistant", "tool", "developer")


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list | None = None
    tool_calls: list | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {v!r}")
        return v


class _TraceLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    messages: list[_Message]
    tools: list[dict] | None = None
    expected: _Message

    @field_validator("messages")
    @classmethod
    def _nonempty(cls, v: list) -> list:
        if not v:
            raise ValueError("messages must not be empty")
        return v

    @field_validator("expected")
    @classmethod
    def _assistant(cls, v: _Message) -> _Message:
        if v.role != "assistant":
            raise ValueError("expected must be an assistant message")
        if not v.tool_calls and v.content is None:
            raise ValueError("expected needs content or tool_calls")
        return v


@dataclass
class TraceExample:
    """One teacher-forced step from a user trace."""

    id: str
    messages: list  # OpenAI-format history (dicts)
    tools: list | None
    expected: dict  # the expected assistant message

    @property
    def is_tool_step(self) -> bool:
        return bool(self.expected.get("tool_calls"))

    def expected_calls(self) -> list:
        """[{"name", "arguments"}] parsed from the expected tool calls."""
        return [parse_call(c) for c in self.expected.get("tool_calls") or []]


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


def load_traces(path: str | Path) -> list:
    """Read a traces JSONL file into TraceExamples (ValueError on the first bad line)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file not found: {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                raw = json.loads(line)
                item = _TraceLine.model_validate(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            except ValidationError as exc:
                raise ValueError(f"{path}:{lineno}: invalid trace: {exc.errors()[0]['msg']} "
                                 f"at {'.'.join(map(str, exc.errors()[0]['loc']))}") from exc
            out.append(TraceExample(
                id=item.id or f"{path.stem}:{lineno}",
                messages=[m.model_dump(exclude_none=True) for m in item.messages],
                tools=item.tools,
                expected=item.expected.model_dump(exclude_none=True),
            ))
    if not out:
        raise ValueError(f"{path}: no traces in file")
    return out


def write_traces(path: str | Path, examples: list) -> None:
    """Write TraceExamples (or dicts of the same shape) as JSONL, the format load_traces reads."""
    with Path(path).open("w", encoding="utf-8") as f:
        for ex in examples:
            d = ex if isinstance(ex, dict) else {"id": ex.id, "messages": ex.messages,
                                                 "tools": ex.tools, "expected": ex.expected}
            f.write(json.dumps({k: v for k, v in d.items() if v is not None}) + "\n")


def traces_from_episode(task, history: list) -> list:
    """Cut an oracle episode into one TraceExample per assistant turn (handy for making trace files)."""
    out = []
    for i, msg in enumerate(history):
        if msg.get("role") == "assistant":
            out.append(TraceExample(f"{task.suite}:{task.seed}:{len(out)}", history[:i], task.tools, msg))
    return out
