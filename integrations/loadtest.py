"""Load tool for the OpenAI-compatible server: concurrent streamed chat requests, latency report.

    python -m asymagent.integrations.loadtest --url http://127.0.0.1:8000 --concurrency 4 --requests 32

Sends R streamed chat completions (stream_options.include_usage, so completion tokens come from
the server's own count) with at most C in flight, and reports p50/p95 end-to-end latency, p50/p95
time to first token (first content or tool-call delta), aggregate output tokens/s (all completion
tokens / wall time) and errors by kind. Loopback only: it refuses any host that is not
127.0.0.1 / ::1 / localhost, and R, C and the per-request timeout are bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

from asymagent.evals.suites.short_chat import PROMPTS  # the short-chat workload, measured side by side there

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 256


@dataclass
class RequestResult:
    ok: bool
    latency_s: float
    ttft_s: float | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class LoadReport:
    url: str
    requests: int
    concurrency: int
    max_tokens: int
    mode: str | None
    wall_s: float
    ok: int
    errors: dict = field(default_factory=dict)
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    ttft_p50_s: float = 0.0
    ttft_p95_s: float = 0.0
    completion_tokens: int = 0
    tokens_per_s: float = 0.0
    requests_per_s: float = 0.0

    def table(self) -> str:
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items())) or "none"
        rows = [
            ("requests (ok / total)", f"{self.ok} / {self.requests}"),
            ("concurrency", str(self.concurrency)),
            ("max_tokens", str(self.max_tokens)),
            ("mode", self.mode or "server default"),
            ("wall time", f"{self.wall_s:.2f} s"),
            ("latency p50 / p95", f"{self.latency_p50_s:.3f} / {self.latency_p95_s:.3f} s"),
            ("TTFT p50 / p95", f"{self.ttft_p50_s:.3f} / {self.ttft_p95_s:.3f} s"),
            ("completion tokens", str(self.completion_tokens)),
            ("output tokens/s (aggregate)", f"{self.tokens_per_s:.1f}"),
            ("requests/s", f"{self.requests_per_s:.2f}"),
            ("errors", errs),
        ]
        lines = ["| metric | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); 0.0 for an empty list."""
    if not values:
        return 0.0
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def check_loopback(url: str) -> str:
    """The URL without a trailing slash, if it points at this machine; ValueError otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"--url must be http(s)://HOST:PORT, got {url!r}")
    host = parsed.hostname
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise ValueError(f"refusing to load-test {host!r}: loopback hosts only "
                         "(127.0.0.1, ::1, localhost)")
    return url.rstrip("/")


async def one_request(client, url: str, index: int, args) -> RequestResult:
    body = {"model": args.model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": args.max_tokens, "temperature": args.temperature,
            "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}]}
    if args.mode:
        body["mode"] = args.mode
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers=headers, timeout=args.timeout) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return RequestResult(False, time.perf_counter() - t0, error=f"http_{resp.status_code}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return RequestResult(False, time.perf_counter() - t0,
                                         error=chunk["error"].get("type", "stream_error"))
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if ttft is None and (delta.get("content") or delta.get("tool_calls")):
                        ttft = time.perf_counter() - t0
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens", 0))
    except Exception as exc:  # network errors, timeouts: counted by kind, never fatal
        return RequestResult(False, time.perf_counter() - t0, error=type(exc).__name__)
    latency = time.perf_counter() - t0
    return RequestResult(True, latency, ttft if ttft is not None else latency, tokens)


async def run_load(args) -> LoadReport:
    import httpx

    url = check_loopback(args.url)
    sem = asyncio.Semaphore(args.concurrency)
    results: list[RequestResult] = []
    try:
        from tqdm import tqdm

        bar = tqdm(total=args.requests, desc="requests", disable=args.quiet)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        bar = None
    limits = httpx.Limits(max_connections=args.concurrency + 2)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
        async def worker(i: int) -> None:
            async with sem:
                results.append(await one_request(client, url, i, args))
                if bar is not None:
                    bar.update(1)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(args.requests)))
        wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    good = [r for r in results if r.ok]
    errors: dict = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    tokens = sum(r.completion_tokens for r in good)
    return LoadReport(
        url=url, requests=args.requests, concurrency=args.concurrency,
        max_tokens=args.max_tokens, mode=args.mode, wall_s=wall, ok=len(good), errors=errors,
        latency_p50_s=percentile([r.latency_s for r in good], 50),
        latency_p95_s=percentile([r.latency_s for r in good], 95),
        ttft_p50_s=percentile([r.ttft_s for r in good], 50),
        ttft_p95_s=percentile([r.ttft_s for r in good], 95),
        completion_tokens=tokens, tokens_per_s=tokens / wall if wall > 0 else 0.0,
        requests_per_s=len(good) / wall if wall > 0 else 0.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asymagent.integrations.loadtest",
                                description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="server base URL (loopback only)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--mode", default=None, choices=("full", "compressed", "spec", "asym"))
    p.add_argument("--model", default="asymagent")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def validate(args) -> None:
    if not 1 <= args.requests <= MAX_REQUESTS:
        raise ValueError(f"--requests must be in [1, {MAX_REQUESTS}]")
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"--concurrency must be in [1, {MAX_CONCURRENCY}]")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if not 0 < args.timeout <= 3600:
        raise ValueError("--timeout must be in (0, 3600] seconds")
    check_loopback(args.url)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        validate(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(run_load(args))
    print(report.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(report), f, indent=2)
    return 0 if report.ok == report.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
