"""Client helpers for the server reliability tests: one request (streamed or not) -> outcome, SSE parsing,
Prometheus series, and a figures line the docs quote (`RELIABILITY {...}` on stdout, with `pytest -s`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    status: int
    latency_s: float
    content: str = ""  # assistant text (streamed deltas joined, or message.content)
    tool_calls: list = field(default_factory=list)  # [(name, arguments json string)]
    retry_after: str | None = None
    error: dict | None = None


def sse_events(lines) -> list[dict]:
    """The JSON events of an SSE stream, up to `data: [DONE]`."""
    events = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line[6:] == "[DONE]":
            break
        events.append(json.loads(line[6:]))
    return events


def assemble(events: list[dict]) -> tuple[str, list, dict | None]:
    """(content, tool calls, error) from chunk events, as OpenAI clients rebuild them."""
    content, calls, error = "", {}, None
    for ev in events:
        if "error" in ev:
            error = ev["error"]
        for choice in ev.get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], ["", ""])
                slot[0] += (tc.get("function") or {}).get("name") or ""
                slot[1] += (tc.get("function") or {}).get("arguments") or ""
    return content, [tuple(calls[i]) for i in sorted(calls)], error


def request(http: httpx.Client, url: str, body: dict) -> Outcome:
    """POST /v1/chat/completions and read the whole answer."""
    t0 = time.perf_counter()
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200 or not body.get("stream"):
            data = json.loads(r.read() or b"{}")
            out = Outcome(r.status_code, 0.0, retry_after=r.headers.get("retry-after"),
                          error=data.get("error"))
            if r.status_code == 200:
                message = data["choices"][0]["message"]
                out.content = message.get("content") or ""
                out.tool_calls = [(c["function"]["name"], c["function"]["arguments"])
                                  for c in message.get("tool_calls") or []]
        else:
            content, calls, error = assemble(sse_events(r.iter_lines()))
            out = Outcome(r.status_code, 0.0, content, calls, error=error)
    out.latency_s = time.perf_counter() - t0
    return out


def report(name: str, figures: dict) -> None:
    """Print the figures a test measured (docs/reliability.md quotes them; run with -s)."""
    print(f"\nRELIABILITY {json.dumps({'test': name, **figures}, sort_keys=True)}")


def metric(url: str, name: str) -> float:
    """Sum of a Prometheus series over its labels."""
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
