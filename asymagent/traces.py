"""Agent traces as JSONL: the one file format that evals score, drafter training reads and capture writes.

One JSON object per line (blank lines and lines starting with `#` are skipped):

    {"id": "optional-name",
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "", "tool_calls": [...]},
                  {"role": "tool", "tool_call_id": "...", "content": "..."}, ...],
     "tools": [{"type": "function", "function": {"name": ..., "parameters": {...}}}],   # optional
     "expected": {"role": "assistant", "content": "...", "tool_calls": [...]}}

`expected` is the next assistant message: with `tool_calls` the step is a tool step, otherwise a
text step. Each line is one step; `conversations` joins the steps of one conversation back into
the whole message list (what drafter training reads). Validation uses pydantic (a boundary); an
invalid line raises ValueError naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator


def parse_call(call: dict) -> dict:
    """OpenAI tool call (or {"name","arguments"}) -> {"name", "arguments": dict} (unparsable -> raw str)."""
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass
    return {"name": fn.get("name"), "arguments": args}


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


def conversations(examples: list) -> list:
    """[(messages, tools)]: each trace line's history + expected message, without the lines whose
    conversation is a prefix of a longer one in the same list (the earlier steps of it)."""
    convs = [(list(ex.messages) + [ex.expected], ex.tools) for ex in examples]
    keys = [[json.dumps(m, sort_keys=True) for m in msgs] for msgs, _ in convs]
    out = []
    for i, (msgs, tools) in enumerate(convs):
        longer = any(j != i and len(keys[j]) > len(keys[i]) and keys[j][: len(keys[i])] == keys[i]
                     and convs[j][1] == tools for j in range(len(convs)))
        if not longer:
            out.append((msgs, tools))
    return out
