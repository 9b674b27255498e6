"""What a batched forward costs by sequences and rows, and costs in company on/off under agent load (interleaved A/B).

    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.batching_costs \\
        --n 8 --modes asym spec --repeats 2 --json docs/results/batching_costs.json

1. The grid: the embedded verifier's decode-sized forward (`forward_many`, or `run_one` for one
   sequence) over S sequences of R rows each, every sequence ~`--context` cached tokens,
   median of `--reps` (the caches cropped back after each), and the least-squares fit
   seconds = fixed + per_seq * S + per_row * S*R (asymagent/scheduling/forward_costs.py).
2. The A/B: batching_load's conversations (greedy) at N at once on the batching engine, with
   `ForwardBatcher.cost_sharing` on (adaptive K and the draft choice read each request's share of
   the forwards it joined, asymagent/scheduling/company_clock.py) and off (its wall time, the
   code before), alternated `--repeats` times per mode after one warm-up run: tokens/s, p50
   latency, forwards, rows per batched forward, drafts proposed and accepted, steps by draft
   source (plain: a verifier step without drafts), and whether every arm gave the same tokens.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from asymagent.evals.probes import harness
from asymagent.evals.probes.batching_load import conversation_script, cpu_name, run_load

GRID = [(1, 1), (1, 4), (1, 8), (1, 16), (1, 32), (2, 1), (4, 1), (8, 1), (2, 8), (2, 16), (4, 4),
        (4, 8), (8, 2), (8, 4)]


def forward_grid(engine, context: int, reps: int) -> dict:
    """Median seconds of the verifier's forward per (sequences, rows each) of GRID, and the fit."""
    import torch

    from asymagent.kv.growing_cache import for_model
    from asymagent.kv.lean_forward import lean_of
    from asymagent.scheduling.forward_costs import ForwardCosts

    lean = lean_of(engine.verifier)
    g = torch.Generator().manual_seed(0)
    caches = []
    with torch.inference_mode():
        for s in range(8):
            cache = for_model(engine.verifier)
            lean.logits(torch.randint(100, 40000, (1, context + 7 * s), generator=g), cache, 1)
            caches.append(cache)
    points, fit = [], ForwardCosts(forget=1.0)
    with torch.inference_mode():  # as the engine decodes (the aligned cache reads)
        _grid_points(lean, caches, reps, points, fit)
    fixed, per_seq, per_row = fit.coefficients()
    return {"context": context, "points": points,
            "fit_ms": {"fixed": 1000 * fixed, "per_sequence": 1000 * per_seq, "per_row": 1000 * per_row}}


def _grid_points(lean, caches: list, reps: int, points: list, fit) -> None:
    from asymagent.kv.batched_forward import SeqCall, forward_many, run_one

    base = [c.get_seq_length() for c in caches]
    for seqs, rows in GRID:
        times = []
        for _ in range(reps + 1):  # the first is a warm-up
            calls = [SeqCall(lean, caches[i], [1000 + j for j in range(rows)], rows) for i in range(seqs)]
            t0 = time.perf_counter()
            forward_many(calls) if seqs > 1 else run_one(calls[0])
            times.append(time.perf_counter() - t0)
            for c, b in zip(caches[:seqs], base):
                c.crop(b - c.get_seq_length())  # negative: the rows just fed
        seconds = statistics.median(times[1:])
        fit.observe(seqs, seqs * rows, seconds)
        points.append({"sequences": seqs, "rows_each": rows, "rows": seqs * rows, "ms": 1000 * seconds})
        print(f"  S={seqs} R={rows}: {1000 * seconds:6.1f} ms", flush=True)


def ab(engine, n: int, mode: str, repeats: int, scripts: list) -> dict:
    """cost_sharing on/off alternated `repeats` times (on, off, then off, on, ...) after a warm-up."""
    stats: list = []
    chat = engine.chat

    def recording(*args, **kwargs):
        r = chat(*args, **kwargs)
        stats.append(r.stats)
        return r

    engine.chat = recording
    batcher = engine.scheduler.batcher
    runs, ref = [], None
    try:
        batcher.cost_sharing = True
        run_load(engine, n, scripts, mode, 48)  # warm-up
        for rep in range(repeats):
            for arm in (("on", "off") if rep % 2 == 0 else ("off", "on")):
                batcher.cost_sharing = arm == "on"
                stats.clear()
                load = os.getloadavg()[0]
                r = run_load(engine, n, scripts, mode, 48)
                sources: dict = {}
                for s in stats:
                    for k, v in s.draft_source.items():
                        sources[k] = sources.get(k, 0) + v
                ref = r["outputs"] if ref is None else ref
                runs.append({"arm": arm, "repeat": rep, "load_average_1min": load,
                             "tokens_per_s": r["tokens_per_s"], "latency_p50_s": r["latency_p50_s"],
                             "wall_s": r["wall_s"], "forwards": r["forwards"],
                             "batched_forwards": r["batched_forwards"],
                             "mean_rows_per_batched_forward": r["mean_rows_per_batched_forward"],
                             "drafted": sum(s.drafted for s in stats),
                             "accepted": sum(s.accepted for s in stats), "steps_by_source": sources,
                             "same_tokens": r["outputs"] == ref})
                print(f"  {mode} N={n} costs {arm:3s}: {r['tokens_per_s']:5.1f} tok/s, p50 "
                      f"{r['latency_p50_s']:.2f} s, {r['forwards']} forwards, {sources}", flush=True)
    finally:
        engine.chat = chat
        batcher.cost_sharing = True
    on = [r for r in runs if r["arm"] == "on"]
    off = [r for r in runs if r["arm"] == "off"]
    return {"n": n, "mode": mode, "runs": runs,
            "tokens_per_s_on_over_off": statistics.mean(r["tokens_per_s"] for r in on)
            / statistics.mean(r["tokens_per_s"] for r in off),
            "p50_on_over_off": statistics.mean(r["latency_p50_s"] for r in on)
            / statistics.mean(r["latency_p50_s"] for r in off),
            "same_tokens": all(r["same_tokens"] for r in runs)}


def main(argv: list | None = None) -> int:
    p = harness.parser(__doc__, "batching_costs", repeats=2)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=["asym", "spec"])
    p.add_argument("--context", type=int, default=800, help="cached tokens per sequence (grid)")
    p.add_argument("--reps", type=int, default=6, help="timed forwards per grid point")
    args = p.parse_args(argv)
    import torch

    from asymagent.engine import Engine

    engine = Engine.from_default(max_num_seqs=8, max_sessions=9)
    scripts = [conversation_script(i, 3, engine.tokenizer, 365) for i in range(8)]
    engine.chat(scripts[0][0], mode="full", max_new_tokens=4, cache_key="warm-up")
    report = {"cpu": cpu_name(), "threads": torch.get_num_threads(),
              "command": harness.command("batching_costs", argv),
              "load_average_1min_start": os.getloadavg()[0]}
    print("forward grid:", flush=True)
    report["grid"] = forward_grid(engine, args.context, args.reps)
    report["ab"] = {mode: ab(engine, args.n, mode, args.repeats, scripts) for mode in args.modes}
    report["load_average_1min_end"] = os.getloadavg()[0]
    return harness.finish(report, args.json, indent=1,
                          status=0 if all(a["same_tokens"] for a in report["ab"].values()) else 1)


if __name__ == "__main__":
    sys.exit(main())
