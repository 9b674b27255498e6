"""Capture: every served request written as one JSONL trace line (the format asymagent/traces.py reads).

One writer for all three faces: `asymagent serve --trace-dir DIR`, `ChatAsymSpec(trace_dir=DIR)`
and `Agent(engine, tools, trace_dir=DIR)`. Each finished `engine.chat` call becomes one line:

    {"id": "req-...", "created": 1767000000.0, "source": "serve" | "langchain" | "agent",
     "mode": "asym", "temperature": 0.0, "messages": [...], "tools": [...] | absent,
     "expected": {"role": "assistant", "content": "...", "tool_calls": [...]},   # the output
     "finish_reason": "stop", "stats": {StepStats fields},
     "fingerprint": {"tokenizer": sha256, "verifier": sha256 | null}}

`expected` holds what the engine answered, so `asymagent eval DIR` replays the traffic and scores
any other setting against what was served, and `train-drafter --traces DIR` learns from it.
Files: DIR/traces-<UTC start>-<pid>-<n>.jsonl, a new one whenever the next line would take the
current file past `max_bytes`; with `max_files` the oldest files of this writer are deleted.
Secrets: the record is built from a fixed list of fields (never request headers, so never an
Authorization header); keys named like credentials (api_key, authorization, password, secret,
token) holding a string are replaced by "[REDACTED]" anywhere in messages and tools, so are the strings given in
`secrets` (the server's API key) and, unless `redact=False`, bearer tokens and `sk-...` keys
inside message text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import uuid
from pathlib import Path

REDACTED = "[REDACTED]"
DEFAULT_MAX_BYTES = 64 * 2**20
_SECRET_KEYS = re.compile(r"(?i)^(api[_-]?key|authorization|password|passwd|secret|.*_token|token)$")
_SECRET_TEXT = (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"),
                re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"))


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id, sorted): equal tokenizers, equal ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def engine_fingerprint(engine) -> dict:
    """{"tokenizer": sha256 of the vocabulary, "verifier": sha256 of the weights file or None}."""
    tok = getattr(engine, "tokenizer", None)
    return {"tokenizer": tokenizer_fingerprint(tok) if tok is not None else None,
            "verifier": getattr(engine, "verifier_fingerprint", None)}


def output_message(result) -> dict:
    """A ChatResult as the assistant message it stands for (OpenAI shape)."""
    msg = {"role": "assistant", "content": result.text or ""}
    if result.tool_calls:
        msg["tool_calls"] = list(result.tool_calls)
    return msg


class TraceWriter:
    """Append one JSON line per request to size-rotated files in `directory` (thread-safe)."""

    def __init__(self, directory: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_files: int | None = None, secrets: tuple = (), redact: bool = True) -> None:
        if max_bytes < 1 or (max_files is not None and max_files < 1):
            raise ValueError("TraceWriter needs max_bytes >= 1 and max_files >= 1 (or None)")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.max_files = int(max_bytes), max_files
        self.secrets = tuple(s for s in secrets if s)
        self.redact = redact
        self._stem = f"traces-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        self._files: list = []  # this writer's files still on disk, oldest first
        self._opened = 0  # files started so far (numbers the next one)
        self._size = 0
        self._lock = threading.Lock()
        self._fingerprints: dict = {}  # id(engine) -> fingerprint (the vocabulary hash costs ~50 ms)

    @property
    def files(self) -> list:
        return list(self._files)

    def record(self, engine, messages: list, tools: list | None, result, *, source: str,
               mode: str, temperature: float = 0.0, request_id: str | None = None) -> dict:
        """Write one request (its messages, tools, output, StepStats, fingerprint); returns the line."""
        key = id(engine)
        if key not in self._fingerprints:
            self._fingerprints[key] = engine_fingerprint(engine)
        line = {"id": request_id or f"req-{uuid.uuid4().hex[:20]}", "created": round(time.time(), 3),
                "source": source, "mode": mode, "temperature": float(temperature),
                "messages": self._scrub(list(messages)), "tools": self._scrub(tools) if tools else None,
                "expected": self._scrub(output_message(result)), "finish_reason": result.finish_reason,
                "stats": result.stats.to_dict(), "fingerprint": self._fingerprints[key]}
        line = {k: v for k, v in line.items() if v is not None}
        self._append(json.dumps(line, ensure_ascii=False) + "\n")
        return line

    def _append(self, text: str) -> None:
        data = text.encode("utf-8")
        with self._lock:
            if not self._files or (self._size and self._size + len(data) > self.max_bytes):
                self._files.append(self.directory / f"{self._stem}-{self._opened:05d}.jsonl")
                self._opened += 1
                self._size = 0
                while self.max_files is not None and len(self._files) > self.max_files:
                    self._files.pop(0).unlink(missing_ok=True)
            with open(self._files[-1], "ab") as f:  # one write per line, flushed on close
                f.write(data)
            self._size += len(data)

    def _scrub(self, value):
        """A copy of `value` with credentials replaced (see the module docstring)."""
        if isinstance(value, dict):
            return {k: (REDACTED if isinstance(k, str) and isinstance(v, str) and v and _SECRET_KEYS.match(k)
                        else self._scrub(v))
                    for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        if isinstance(value, str):
            for secret in self.secrets:
                value = value.replace(secret, REDACTED)
            if self.redact:
                value = _SECRET_TEXT[0].sub(r"\1 " + REDACTED, value)
                value = _SECRET_TEXT[1].sub(REDACTED, value)
        return value


def trace_writer(value, **kw) -> TraceWriter | None:
    """None -> None, a TraceWriter as it is, a directory -> a TraceWriter there."""
    if value is None or isinstance(value, TraceWriter):
        return value
    return TraceWriter(value, **kw)
