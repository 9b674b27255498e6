"""Load for `serve --ray`: multi-turn conversations against 1 vs N engine replicas, side by side.

    python -m asymagent.integrations.ray_serve.loadtest --replicas 1 2 --rounds 2 \\
        --conversations 8 --turns 3 --concurrency 4 --max-tokens 32 [--json out.json]

For every round and every replica count (interleaved: 1 2 1 2 ...) it starts a local Ray on
127.0.0.1 serving the embedded default engine (or --verifier/--drafter) with that many replicas
of `--replica-cpus` CPUs, then runs C conversations at a time, each T turns long (a turn appends
the answer and a new user message, as an agent does), non-streaming. Reported per run and as
medians over rounds: throughput (completion tokens/s, requests/s), p50/p95 request latency,
the share of turns 2+ that reused cached tokens, the cached share of their prompts, and the
router's affinity hit rate (requests sent to the replica holding their conversation / routed
requests with a known conversation), read from /metrics. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from asymagent.evals.suites.short_chat import PROMPTS
from asymagent.integrations.loadtest import percentile


@dataclass
class RunReport:
    replicas: int
    round: int
    requests: int
    ok: int
    wall_s: float
    completion_tokens: int
    tokens_per_s: float
    requests_per_s: float
    latency_p50_s: float
    latency_p95_s: float
    later_turns_cached: float  # share of turns 2+ with cached_tokens > 0
    cached_share: float  # cached / prompt tokens over turns 2+
    affinity_hit_rate: float  # affine / (affine + moved) from the router's counters
    errors: dict
    per_replica: dict  # finished requests per replica (its share of the load)


async def conversation(client, url: str, index: int, args, out: list) -> None:
    messages = [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}]
    for turn in range(args.turns):
        body = {"model": "asymagent", "messages": messages, "max_tokens": args.max_tokens,
                "temperature": 0.0}
        t0 = time.perf_counter()
        try:
            r = await client.post(url + "/v1/chat/completions", json=body, timeout=args.timeout)
        except Exception as exc:  # counted by kind, never fatal
            out.append({"ok": False, "error": type(exc).__name__, "turn": turn})
            return
        latency = time.perf_counter() - t0
        if r.status_code != 200:
            out.append({"ok": False, "error": f"http_{r.status_code}", "turn": turn})
            return
        data = r.json()
        usage = data["usage"]
        out.append({"ok": True, "turn": turn, "latency": latency,
                    "completion": usage["completion_tokens"], "prompt": usage["prompt_tokens"],
                    "cached": usage["prompt_tokens_details"]["cached_tokens"]})
        messages = messages + [{"role": "assistant",
                                "content": data["choices"][0]["message"]["content"] or ""},
                               {"role": "user", "content": f"Thanks. Now step {turn + 2}: go on."}]


def routed(text: str) -> dict:
    """Router outcomes, and finished requests per replica, from a /metrics text."""
    out: dict = {"per_replica": {}}
    for line in text.splitlines():
        if line.startswith("asymagent:ray_routed_total{"):
            out[line.split('outcome="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("asymagent:request_success_total{") and 'replica="all"' not in line:
            replica = line.split('replica="')[1].split('"')[0]
            out["per_replica"][replica] = out["per_replica"].get(replica, 0) + \
                int(float(line.rsplit(" ", 1)[1]))
    return out


async def drive(url: str, args) -> tuple[list, float, dict]:
    import httpx

    sem = asyncio.Semaphore(args.concurrency)
    results: list = []
    async with httpx.AsyncClient(trust_env=False) as client:
        async def one(i: int) -> None:
            async with sem:
                await conversation(client, url, i, args, results)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.conversations)))
        wall = time.perf_counter() - t0
        metrics = (await client.get(url + "/metrics", timeout=60)).text
    return results, wall, routed(metrics)


def run_once(replicas: int, round_: int, args) -> RunReport:
    """One server with `replicas` replicas (the `asymagent serve` flags' own defaults), one load."""
    import functools

    from asymagent.integrations.cli import build_parser
    from asymagent.integrations.ray_serve.launch import app_kwargs_from, start
    from asymagent.integrations.serve_setup import load_engine

    argv = ["serve", "--verifier", args.verifier, "--max-queue", "64",
            "--max-sessions", str(max(8, args.conversations)), "--max-tokens", str(args.max_tokens),
            "--request-timeout", str(args.timeout)] + (["--drafter", args.drafter] if args.drafter else [])
    serve_args = build_parser()[0].parse_args(argv)
    server = start(functools.partial(load_engine, serve_args), app_kwargs_from(serve_args),
                   port=0, replicas=replicas, replica_cpus=args.replica_cpus)
    try:
        results, wall, routes = asyncio.run(drive(server.url, args))
    finally:
        server.stop()
    good = [r for r in results if r["ok"]]
    later = [r for r in good if r["turn"] > 0]
    errors: dict = {}
    for r in results:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    tokens = sum(r["completion"] for r in good)
    known = routes.get("affine", 0) + routes.get("moved", 0)
    return RunReport(
        replicas=replicas, round=round_, requests=len(results), ok=len(good), wall_s=wall,
        completion_tokens=tokens, tokens_per_s=tokens / wall, requests_per_s=len(good) / wall,
        latency_p50_s=percentile([r["latency"] for r in good], 50),
        latency_p95_s=percentile([r["latency"] for r in good], 95),
        later_turns_cached=sum(r["cached"] > 0 for r in later) / max(1, len(later)),
        cached_share=sum(r["cached"] for r in later) / max(1, sum(r["prompt"] for r in later)),
        affinity_hit_rate=routes.get("affine", 0) / known if known else 0.0, errors=errors,
        per_replica=routes["per_replica"])


def table(reports: list[RunReport]) -> str:
    rows = ["| replicas | runs | requests ok | tokens/s | requests/s | latency p50 / p95 | "
            "turns 2+ cached | cached share | affinity hits |", "|---|---|---|---|---|---|---|---|---|"]
    for n in sorted({r.replicas for r in reports}):
        runs = [r for r in reports if r.replicas == n]
        med = lambda f: statistics.median(getattr(r, f) for r in runs)  # noqa: E731
        rows.append(f"| {n} | {len(runs)} | {sum(r.ok for r in runs)} / {sum(r.requests for r in runs)} "
                    f"| {med('tokens_per_s'):.1f} | {med('requests_per_s'):.2f} | "
                    f"{med('latency_p50_s'):.2f} / {med('latency_p95_s'):.2f} s | "
                    f"{med('later_turns_cached'):.0%} | {med('cached_share'):.0%} | "
                    f"{med('affinity_hit_rate'):.0%} |")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asymagent.integrations.ray_serve.loadtest",
                                description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=2, help="interleaved repetitions (medians)")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--replica-cpus", type=float, default=1.0)
    p.add_argument("--verifier", default="default")
    p.add_argument("--drafter", default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument("--json", default=None, help="also write every run as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.replicas) < 1 or args.rounds < 1 or args.conversations < 1 or args.turns < 1 \
            or not 1 <= args.concurrency <= 256 or args.max_tokens < 1:
        print("error: --replicas, --rounds, --conversations, --turns, --max-tokens must be >= 1 "
              "and --concurrency in 1..256", file=sys.stderr)
        return 2
    reports = []
    for round_ in range(args.rounds):
        for n in args.replicas:
            report = run_once(n, round_, args)
            print(json.dumps(asdict(report)), flush=True)
            reports.append(report)
    print(table(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in reports], f, indent=2)
    return 0 if all(r.ok == r.requests for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
