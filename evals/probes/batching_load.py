"""Continuous batching under agent load: N concurrent three-turn conversations, one engine, batched vs one at a time.

    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.batching_load \\
        --ns 1 2 4 8 --modes asym full --json runs/batching.json
    # the reference pair (Qwen2.5-Coder 1.5B + 0.5B; `make setup-pair`)
    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.batching_load --pair qwen2.5-coder \\
        --ns 1 8 --modes full asym --conversations 8 --turns 2 --json runs/batching_pair.json

The same `--conversations` agent conversations (default 8) at every N, at most N at once
(threads, as a server's worker threads or a LangGraph fan-out would call): each starts with a system prompt and a user task, then for `--turns` turns asks
the model (greedy, `--max-tokens` new tokens), appends its answer and a ~`--tool-tokens`-token
tool output with the next instruction (as an agent loop appends; the engine reuses the
conversation's cache). The same conversations run on two engines over the SAME weights, in the
same process, one after the other for every (mode, N): today's one-at-a-time engine
(`max_num_seqs=1`: the FairLock serialises the requests) and the batching engine
(`max_num_seqs=8`, asymagent/scheduling/). Per run: aggregate completion tokens/s, p50/p95
request latency (call -> result, queueing included) and time to first token, the batcher's
forwards (sequences and rows per forward), and whether every request's tokens equal those of the
batching engine at N=1 (the request alone) and of the one-at-a-time engine.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from asymagent.evals.probes import harness
from asymagent.evals.suites.synthetic_text import paragraph, person


def cpu_name() -> str:
    from asymagent.modeling.cpu_dtype import cpu_model

    return cpu_model() or platform.processor() or "unknown"


def percentile(values: list, q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def conversation_script(index: int, turns: int, tokenizer, tool_tokens: int) -> tuple:
    """(first messages, [tool output text per later turn]) of conversation `index` (seeded)."""
    rng = random.Random(1000 + index)
    first = [{"role": "system", "content": "You are an operations agent. Answer briefly."},
             {"role": "user", "content": f"Ticket {index}: {person(rng)} reports a billing problem. "
                                         f"{paragraph(rng, 2)} What do you check first?"}]
    outputs = []
    for turn in range(1, turns):
        text = ""
        while len(tokenizer(text)["input_ids"]) < tool_tokens:
            text += paragraph(rng, 2) + "\n"
        outputs.append(f"Tool output (lookup {turn}):\n{text}\nWhat is the next step?")
    return first, outputs


def run_conversation(engine, index: int, script: tuple, mode: str, max_tokens: int, out: dict) -> None:
    messages, outputs = list(script[0]), script[1]
    for turn in range(len(outputs) + 1):
        first: list = []
        t0 = time.perf_counter()
        r = engine.chat(messages, mode=mode, max_new_tokens=max_tokens, cache_key=f"conv-{index}",
                        callback=lambda new: first.append(time.perf_counter()) if not first else None)
        t1 = time.perf_counter()
        out[(index, turn)] = {"tokens": list(r.token_ids), "latency_s": t1 - t0,
                              "prefill_s": r.stats.prefill_s,
                              "ttft_s": (first[0] - t0) if first else t1 - t0}
        messages = messages + [{"role": "assistant", "content": r.text or "..."}]
        if turn < len(outputs):
            messages.append({"role": "user", "content": outputs[turn]})


def run_load(engine, n: int, scripts: list, mode: str, max_tokens: int) -> dict:
    """Every conversation of `scripts`, at most N at once, on `engine` (fresh caches and store
    of earlier responses)."""
    from asymagent.decoding.suffix_store import SuffixStore

    engine.caches.clear()
    engine.suffix_store = SuffixStore()
    forwards: list = []
    lock = threading.Lock()

    def observe(seqs: int, rows: int) -> None:
        with lock:
            forwards.append((seqs, rows))

    observers = engine.scheduler.batcher.observers
    observers.append(observe)
    out: dict = {}
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(n) as pool:
            for f in [pool.submit(run_conversation, engine, i, scripts[i], mode, max_tokens, out)
                      for i in range(len(scripts))]:
                f.result()
    finally:
        observers.remove(observe)
    wall = time.perf_counter() - t0
    tokens = sum(len(v["tokens"]) for v in out.values())
    lat = [v["latency_s"] for v in out.values()]
    ttft = [v["ttft_s"] for v in out.values()]
    batched = [f for f in forwards if f[0] > 1]
    return {"n": n, "mode": mode, "wall_s": wall, "completion_tokens": tokens,
            "tokens_per_s": tokens / wall, "requests": len(out),
            "latency_p50_s": statistics.median(lat), "latency_p95_s": percentile(lat, 0.95),
            "ttft_p50_s": statistics.median(ttft), "ttft_p95_s": percentile(ttft, 0.95),
            # call -> decoding starts, summed (alone: the prefill's time; in company it includes
            # waiting for the rounds the prefill's forwards join)
            "prefill_s_total": sum(v["prefill_s"] for v in out.values()),
            "forwards": len(forwards), "batched_forwards": len(batched),
            "mean_sequences_per_batched_forward": statistics.mean([f[0] for f in batched]) if batched else 0.0,
            "mean_rows_per_batched_forward": statistics.mean([f[1] for f in batched]) if batched else 0.0,
            "outputs": {f"{k[0]}:{k[1]}": v["tokens"] for k, v in out.items()}}


def main(argv: list | None = None) -> int:
    p = harness.parser(__doc__, "batching_load")
    p.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--modes", nargs="+", default=["asym", "full"])
    p.add_argument("--conversations", type=int, default=8, help="conversations per run (every N)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--tool-tokens", type=int, default=365)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--pair", default=None, metavar="NAME",
                   help="a named pair (asymagent/modeling/pairs.py, `make setup-pair`) instead of "
                        "the embedded default, e.g. qwen2.5-coder")
    p.add_argument("--serial-ns", type=int, nargs="+", default=[1, 8],
                   help="the Ns the one-at-a-time engine runs at (its requests queue whatever N)")
    args = p.parse_args(argv)
    from asymagent.engine import Engine

    sessions = args.conversations + 1
    if args.pair:
        batching = Engine.from_pair(args.pair, max_num_seqs=args.max_num_seqs, max_sessions=sessions)
    else:
        batching = Engine.from_default(max_num_seqs=args.max_num_seqs, max_sessions=sessions)
    serial = Engine(verifier=batching.verifier, drafter=batching.drafter, tokenizer=batching.tokenizer,
                    spec=batching.spec, compression=batching.compression,
                    max_sessions=sessions)  # the same weights, one request at a time
    scripts = [conversation_script(i, args.turns, batching.tokenizer, args.tool_tokens)
               for i in range(args.conversations)]
    for engine in (serial, batching):  # warm-up: kernels, row-floor probes, attention checks
        engine.chat(scripts[0][0], mode="full", max_new_tokens=4, cache_key="warm-up")
    runs, alone = [], {}
    for mode in args.modes:
        for n in args.ns:
            for name, engine in (("one_at_a_time", serial), ("batching", batching)):
                if name == "one_at_a_time" and n not in args.serial_ns:
                    continue
                run = run_load(engine, n, scripts, mode, args.max_tokens)
                run["engine"] = name
                if name == "batching" and n == min(args.ns):
                    alone[mode] = run["outputs"]
                runs.append(run)
                print(f"{mode:5s} N={n} {name:14s} {run['tokens_per_s']:6.1f} tok/s  p50 "
                      f"{run['latency_p50_s']:6.2f} s  p95 {run['latency_p95_s']:6.2f} s  ttft p50 "
                      f"{run['ttft_p50_s']:5.2f} s  seqs/batched fwd "
                      f"{run['mean_sequences_per_batched_forward']:.1f}", flush=True)
    for run in runs:  # the same tokens with and without company, and as the one-at-a-time engine
        ref = alone[run["mode"]]
        run["same_tokens_as_alone"] = ref == run["outputs"]
        one = next(r for r in runs if r["mode"] == run["mode"] and r["engine"] == "one_at_a_time")
        run["same_tokens_as_one_at_a_time"] = one["outputs"] == run["outputs"]
    summary = {}
    for mode in args.modes:
        b = {r["n"]: r for r in runs if r["mode"] == mode and r["engine"] == "batching"}
        s = {r["n"]: r for r in runs if r["mode"] == mode and r["engine"] == "one_at_a_time"}
        lo, hi = min(args.ns), max(args.ns)
        s_lo, s_hi = min(s), max(s)
        summary[mode] = {"throughput_ratio_batching": b[hi]["tokens_per_s"] / b[lo]["tokens_per_s"],
                         "throughput_ratio_one_at_a_time": s[s_hi]["tokens_per_s"] / s[s_lo]["tokens_per_s"],
                         "throughput_batching_over_one_at_a_time_at_max_n":
                             b[hi]["tokens_per_s"] / s[s_hi]["tokens_per_s"],
                         "p50_ratio_batching": b[hi]["latency_p50_s"] / b[lo]["latency_p50_s"],
                         "p50_ratio_one_at_a_time": s[s_hi]["latency_p50_s"] / s[s_lo]["latency_p50_s"],
                         "single_request_p50_batching_over_one_at_a_time":
                             b[lo]["latency_p50_s"] / s[s_lo]["latency_p50_s"],
                         "all_same_tokens": all(r["same_tokens_as_alone"] and r["same_tokens_as_one_at_a_time"]
                                                for r in runs if r["mode"] == mode)}
        print(mode, json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                for k, v in summary[mode].items()}))
    import torch

    report = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "runtime": batching.runtime,
              "settings": vars(args),
              "summary": summary, "runs": [{k: v for k, v in r.items() if k != "outputs"} for r in runs]}
    report = json.loads(json.dumps(report, default=str))  # settings and runtime: plain JSON
    return harness.finish(report, args.json, indent=1,
                          status=0 if all(s["all_same_tokens"] for s in summary.values()) else 1)


if __name__ == "__main__":
    sys.exit(main())
