"""Agent traces as JSONL: the one file format that evals score, drafter training reads and capture writes.

One JSON object per line (blank lines and lines starting with `#` are skipped); a directory
means every `*.jsonl` file in it, in name order (what capture writes, asymagent/trace_capture.py):

    {"id": "optional-name",
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "", "tool_calls": [...]},
                  {"role": "tool", "tool_call_id": "...", "content": "..."}, ...],
     "tools": [{"type": "function", "function": {"name": ..., "parameters": {...}}}],   # optional
     "expected": {"role": "assistant", "content": "...", "tool_calls": [...]},
     # optional, written by capture: "created", "source", "mode", "temperature", "finish_reason",
     # "stats" (StepStats), "fingerprint": {"tokenizer": sha256, "verifier": sha256 | null}}

`expected` is the next assistant message: with `tool_calls` the step is a tool step, otherwise a
text step. `split_heldout` keeps a deterministic slice of conversations out of training (the
slice `asymagent tune` measures on); `check_fingerprint` refuses traces of another model. Each line is one step; `conversations` joins the steps of one conversation back into
the whole message list (what drafter training reads). Validation uses pydantic (a boundary); an
invalid line raises ValueError naming the file and line.
"""

from __future__ import annotations

import hashlib
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
    created: float | None = None
    source: str | None = None
    mode: str | None = None
    temperature: float | None = None
    finish_reason: str | None = None
    stats: dict | None = None
    fingerprint: dict[str, str | None] | None = None

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
    fingerprint: dict | None = None  # {"tokenizer", "verifier"} of the model that answered (capture)
    stats: dict | None = None  # StepStats of the captured request

    @property
    def is_tool_step(self) -> bool:
        return bool(self.expected.get("tool_calls"))

    def expected_calls(self) -> list:
        """[{"name", "arguments"}] parsed from the expected tool calls."""
        return [parse_call(c) for c in self.expected.get("tool_calls") or []]


def trace_files(path: str | Path) -> list:
    """[path] for a file, the `*.jsonl` files of a directory in name order; ValueError if none."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise ValueError(f"{path}: no *.jsonl trace files in this directory")
        return files
    if not path.is_file():
        raise ValueError(f"trace file not found: {path}")
    return [path]


def load_traces(path: str | Path) -> list:
    """Read a traces JSONL file, or every one in a directory, into TraceExamples (ValueError on
    the first bad line)."""
    files = trace_files(path)
    if len(files) > 1 or Path(path).is_dir():
        return [ex for f in files for ex in load_traces(f)]
    path = files[0]
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
                fingerprint=item.fingerprint, stats=item.stats,
            ))
    if not out:
        raise ValueError(f"{path}: no traces in file")
    return out


def write_traces(path: str | Path, examples: list) -> None:
    """Write TraceExamples (or dicts of the same shape) as JSONL, the format load_traces reads."""
    with Path(path).open("w", encoding="utf-8") as f:
        for ex in examples:
            d = ex if isinstance(ex, dict) else {"id": ex.id, "messages": ex.messages,
                                                 "tools": ex.tools, "expected": ex.expected,
                                                 "fingerprint": ex.fingerprint, "stats": ex.stats}
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


def conversation_key(example) -> str:
    """Which conversation a step belongs to: a hash of its tools and of its messages up to and
    including the first user message (the later steps of an agent run keep that prefix)."""
    head = []
    for m in example.messages:
        head.append(m)
        if m.get("role") == "user":
            break
    blob = json.dumps({"m": head, "t": example.tools}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def split_heldout(examples: list, fraction: float = 0.2) -> tuple:
    """(train, heldout): whole conversations go to the held-out slice when their key's hash falls
    under `fraction`, so the split depends only on each conversation, never on file order or on
    the other traces. With >= 2 conversations and fraction > 0 at least one is held out (the one
    of lowest hash) and at least one is kept for training (the one of highest hash)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction!r}")
    keys = [conversation_key(ex) for ex in examples]
    unit = {k: int(k[:15], 16) / 16**15 for k in set(keys)}  # [0, 1), uniform over conversations
    held = {k for k, u in unit.items() if u < fraction}
    if fraction > 0 and len(unit) >= 2:
        held.add(min(unit, key=unit.get))
        held.discard(max(unit, key=unit.get))
    return ([ex for ex, k in zip(examples, keys) if k not in held],
            [ex for ex, k in zip(examples, keys) if k in held])


class TraceMismatchError(ValueError):
    """Traces captured with another tokenizer or verifier than the one in use."""


def check_fingerprint(examples: list, expected: dict) -> None:
    """Refuse (TraceMismatchError, one line) traces whose recorded fingerprint differs from
    `expected` ({"tokenizer": sha, "verifier": sha}); traces without one (hand-written, made from
    eval episodes) and fields either side leaves None are not compared."""
    for ex in examples:
        got = ex.fingerprint or {}
        for part in ("verifier", "tokenizer"):
            mine, theirs = expected.get(part), got.get(part)
            if mine and theirs and mine != theirs:
                raise TraceMismatchError(
                    f"trace {ex.id} was captured with {part} sha256 {theirs[:16]}..., but this "
                    f"{part} is {mine[:16]}...; capture traces with this model, or train with the "
                    f"{part} that answered them")
