"""Where the wall time of continuous batching goes: the batching_load workload at one N, timed part by part.

    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.batching_parts --n 8 --mode asym

Runs batching_load's conversations (the same scripts, greedy) on the batching engine at each
`--n` and times, exclusive of the parts nested inside it: the verifier's and the drafter's
forwards (batched `forward_many` calls; calls run alone split into prefill chunks, more than the
32 rows one batched forward takes, and decode-sized ones), the drafter's heads (`DraftHead`
draft and full logits), the gate, the copy delta, the chat layer (`prepare_chat`,
`chat_result`). Requests run engine Python one at a time (the FairLock baton) and the round's
forwards run while every other request waits, so the parts add up to at most the wall; the rest
is per-request Python between forwards not in a timed part (drafting, sampling, stops, caches'
bookkeeping) and hand-offs between request threads.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from asymagent.evals.probes import harness
from asymagent.evals.probes.batching_load import conversation_script, run_load


class PartClock:
    """Exclusive seconds and calls per part name; a part nested in another is not counted twice."""

    def __init__(self) -> None:
        self.seconds: dict = {}
        self.calls: dict = {}
        self.rows: dict = {}
        self.local = threading.local()
        self.lock = threading.Lock()

    def wrap(self, fn, name_of):
        """`fn` timed under the part `name_of(*args)` (a name, or (name, rows))."""
        clock = self

        def timed(*args, **kwargs):
            key = name_of(*args)
            name, rows = key if isinstance(key, tuple) else (key, 0)
            stack = getattr(clock.local, "stack", None)
            if stack is None:
                stack = clock.local.stack = []
            stack.append(0.0)  # seconds of nested parts
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                nested = stack.pop()
                if stack:
                    stack[-1] += spent
                with clock.lock:
                    clock.seconds[name] = clock.seconds.get(name, 0.0) + spent - nested
                    clock.calls[name] = clock.calls.get(name, 0) + 1
                    clock.rows[name] = clock.rows.get(name, 0) + rows

        return timed


def install(clock: PartClock, engine) -> None:
    """Time the engine's parts (module doc): module-level names the callers look up at call time."""
    from asymagent.chat import session as chat_session
    from asymagent.decoding import round as round_module
    from asymagent.decoding.copy_delta import CopyDelta
    from asymagent.decoding.model_drafter import DraftHead
    from asymagent.scheduling import batcher as batcher_module
    from asymagent import engine as engine_module

    names = {id(engine.verifier): "verifier", id(engine.drafter): "drafter"}

    def model(call) -> str:
        return names.get(id(call.lean.model), "other")

    def many(calls):
        rows = sum(c.rows for c in calls)
        return f"{model(calls[0])} forward_many ({'batched' if len(calls) > 1 else 'one'})", rows

    def one(call):
        kind = "prefill chunk" if call.rows > 32 else "decode-sized"
        return f"{model(call)} forward alone, {kind}", call.rows

    batcher_module.forward_many = clock.wrap(batcher_module.forward_many, many)
    batcher_module.run_one = clock.wrap(batcher_module.run_one, one)
    DraftHead.draft_logits = clock.wrap(DraftHead.draft_logits, lambda *a: "drafter head (draft vocab)")
    DraftHead.full_logits = clock.wrap(DraftHead.full_logits,
                                       lambda s, h: ("drafter head (full vocab)", int(h.shape[0])))
    round_module.fused_gate = clock.wrap(round_module.fused_gate, lambda *a: "gate")
    CopyDelta.rows = clock.wrap(CopyDelta.rows, lambda *a: "copy delta")
    engine_module.prepare_chat = clock.wrap(chat_session.prepare_chat, lambda *a: "chat layer (views)")
    engine_module.chat_result = clock.wrap(chat_session.chat_result, lambda *a: "chat layer (result)")


def main(argv: list | None = None) -> int:
    p = harness.parser(__doc__, "batching_parts")
    p.add_argument("--n", type=int, nargs="+", default=[8])
    p.add_argument("--mode", default="asym")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--tool-tokens", type=int, default=365)
    args = p.parse_args(argv)
    from asymagent.engine import Engine

    engine = Engine.from_default(max_num_seqs=8, max_sessions=args.conversations + 1)
    scripts = [conversation_script(i, args.turns, engine.tokenizer, args.tool_tokens)
               for i in range(args.conversations)]
    engine.chat(scripts[0][0], mode="full", max_new_tokens=4, cache_key="warm-up")
    clock = PartClock()
    install(clock, engine)
    report = {"mode": args.mode, "runs": []}
    for n in args.n:
        clock.seconds.clear(), clock.calls.clear(), clock.rows.clear()
        load = os.getloadavg()[0]  # a shared machine: the load the run started under
        run = run_load(engine, n, scripts, args.mode, args.max_tokens)
        wall = run["wall_s"]
        timed = sum(clock.seconds.values())
        parts = {k: {"s": round(v, 3), "share": round(v / wall, 3), "calls": clock.calls[k],
                     "rows": clock.rows[k]} for k, v in sorted(clock.seconds.items(), key=lambda kv: -kv[1])}
        parts["rest (untimed Python, hand-offs)"] = {"s": round(wall - timed, 3),
                                                     "share": round((wall - timed) / wall, 3)}
        print(f"{args.mode} N={n}: wall {wall:.2f} s, {run['tokens_per_s']:.1f} tok/s, "
              f"p50 {run['latency_p50_s']:.2f} s")
        for k, v in parts.items():
            print(f"  {k:42s} {v['s']:7.2f} s  {100 * v['share']:5.1f}%  "
                  f"{v.get('calls', '')!s:>6} calls  {v.get('rows', '')!s:>6} rows")
        report["runs"].append({"n": n, "load_average_1min": load, "wall_s": wall,
                               "tokens_per_s": run["tokens_per_s"],
                               "latency_p50_s": run["latency_p50_s"], "parts": parts})
    return harness.finish(report, args.json, indent=1)


if __name__ == "__main__":
    sys.exit(main())
