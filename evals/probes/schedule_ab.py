"""A/B of the decode schedule on the bench workload: the plain probe, copied drafts' length, drafter rows, the drafter's deferred prefill, the lean forward's direct road.

    python -m asymagent.evals.probes.schedule_ab [--change probe|lookup_k=N|drafter_rows|defer_drafter|direct] [--modes spec,asym]
        [--steps 12] [--passes 2] [--threads 2] [--workloads bench] [--episodes 2]
        [--max-steps 6] [--json PATH]

One engine on the embedded default, the bench workload's teacher-forced steps (records dev seed
0, as `asymagent bench`; or `--workloads` of the frontier, evals/running/frontier.py: suites and
domains on their test seeds, `--episodes` each, `--max-steps` spread steps an episode), each mode
run on both paths per step, interleaved and in alternating
order; each (mode, path) has its own cache session and its own store of earlier responses (the
suffix drafter's), and the workload is run `--passes` times so that the later passes read a
store that holds the earlier ones, as an agent's later episodes do (the first pass is reported
apart). "new" is the engine as shipped, "old" the change undone:

- `probe`: the plain probe step that measures t_plain for adaptive K / the draft choice
  (asymagent/decoding/adaptive_k.py `DraftChoice.want_probe`) runs after the first speculative
  round of every request (old) vs only once a source is one round from being judged (new).
- `lookup_k=N`: copied drafts of at most N tokens a round (new) vs the shipped `lookup_k` (old).
- `drafter_rows`: asym's rounds compute the drafter's full-view rows at the verify positions only
  when something reads them (new; `RequestPlan.drafter_rows`) vs always (old).
- `defer_drafter`: the drafter's full-view prefill runs at the first round that asks the drafter
  model for drafts (new; `RequestPlan.defer_drafter`) vs with the verifier's, before decoding
  (old).
- `direct`: decode and verify forwards of the CPU lean forward take the direct road (new;
  asymagent/kv/lean_forward.py) vs the general loop (old: `lean_forward.general_loop()`).

Reports per mode and pass group the wall seconds of each path, the ratio of the sums, the median
per-step ratio, decode seconds, plain steps and rounds, and whether the output token ids are
identical on every step (they must be: no change can change a token in these modes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time


@dataclasses.dataclass
class _Path:
    wall: list = dataclasses.field(default_factory=list)  # seconds per step
    decode_s: float = 0.0
    rounds: int = 0
    plain: int = 0  # plain verifier steps (probes, a last token; StepStats.draft_source)


def _old_rule(choice) -> bool:
    """`DraftChoice.want_probe` before the probe was deferred: after the first round."""
    if not choice.enabled or choice.spec_rounds == 0:
        return False
    return choice.model.t_plain is None or choice.since_probe >= choice.model.probe_every


def measure(change: str, modes: list, steps: int, passes: int, max_new_tokens: int,
            workloads: tuple = ("bench",), episodes: int = 2, max_steps: int = 6) -> dict:
    import torch
    from tqdm.auto import tqdm

    import asymagent.engine as engine_mod
    from asymagent.decoding.adaptive_k import DraftChoice
    from asymagent.evals.running.engine_setup import build_engine, reset_suffix_stores, use_suffix_store
    from asymagent.engine import ContextLengthError
    from asymagent.evals.running.frontier import conversations
    from asymagent.kv.lean_forward import general_loop

    convs = [c for w in workloads for c in conversations(w, "test", episodes, max_steps, steps)]
    all_steps = [step for c in convs for step in c.steps]
    engine = build_engine("default").engine
    # one unmeasured request per mode on a cache and store of its own first: the process's
    # one-time costs (first kernel calls, the draft head's first pass: ~60 ms in a first model
    # round) would otherwise land in whichever path runs the first step, and skew its choices
    use_suffix_store(engine, "schedule-ab-warmup")
    with torch.inference_mode():
        for mode in modes:
            engine.chat(all_steps[0].history, tools=all_steps[0].tools, mode=mode,
                        max_new_tokens=max_new_tokens, temperature=0.0,
                        tool_choice=all_steps[0].tool_choice, cache_key="schedule-ab-warmup")
    engine.caches.drop("schedule-ab-warmup")
    reset_suffix_stores(engine)
    shipped_rule, shipped_spec, shipped_plan = DraftChoice.want_probe, engine.spec, engine_mod.plan_request

    def rows_always(*args, **kwargs):  # the plan before drafter rows were skipped
        plan = shipped_plan(*args, **kwargs)
        return dataclasses.replace(plan, drafter_rows=plan.mode.fused)

    def prefill_now(*args, **kwargs):  # the plan before the drafter's prefill was deferred
        return dataclasses.replace(shipped_plan(*args, **kwargs), defer_drafter=False)

    old_plan = {"drafter_rows": rows_always, "defer_drafter": prefill_now}
    if change in ("probe", "drafter_rows", "defer_drafter", "direct"):
        specs = {"new": shipped_spec, "old": shipped_spec}
    elif change.startswith("lookup_k="):
        specs = {"new": dataclasses.replace(shipped_spec, lookup_k=int(change.split("=", 1)[1])),
                 "old": shipped_spec}
    else:
        raise SystemExit(f"unknown --change {change!r} (probe, lookup_k=N, drafter_rows, defer_drafter, direct)")
    paths = {(m, p, g): _Path() for m in modes for p in ("new", "old") for g in ("first", "later")}
    identical = {m: True for m in modes}
    skipped = 0  # (step, mode) pairs over the context limit
    bar = tqdm(total=passes * len(all_steps) * len(modes) * 2, desc=f"schedule A/B {change}")
    n = 0
    try:
        with torch.inference_mode():
            for run in range(passes):
                group = "first" if run == 0 else "later"
                for step in all_steps:
                    for mode in modes:
                        tokens = {}
                        for path in (("new", "old") if n % 2 == 0 else ("old", "new")):
                            DraftChoice.want_probe = shipped_rule if (path == "new" or change != "probe") \
                                else _old_rule
                            engine.spec = specs[path]
                            engine_mod.plan_request = old_plan[change] if (
                                path == "old" and change in old_plan) else shipped_plan
                            key = f"schedule-ab-{mode}-{path}"
                            use_suffix_store(engine, key)
                            road = general_loop() if (change == "direct" and path == "old") \
                                else contextlib.nullcontext()
                            t0 = time.perf_counter()
                            try:
                                with road:
                                    r = engine.chat(step.history, tools=step.tools, mode=mode,
                                                    max_new_tokens=max_new_tokens, temperature=0.0,
                                                    tool_choice=step.tool_choice, cache_key=key)
                            except ContextLengthError:  # over the model's limit: as the frontier,
                                skipped += 1  # the step is left out (both paths: same prompt)
                                bar.update(2)
                                break
                            rec = paths[(mode, path, group)]
                            rec.wall.append(time.perf_counter() - t0)
                            rec.decode_s += r.stats.decode_s
                            rec.rounds += r.stats.rounds
                            rec.plain += (r.stats.draft_source or {}).get("plain", 0)
                            tokens[path] = list(r.token_ids)
                            bar.update(1)
                        if len(tokens) == 2:
                            identical[mode] &= tokens["new"] == tokens["old"]
                        n += 1
    finally:
        bar.close()
        DraftChoice.want_probe, engine.spec = shipped_rule, shipped_spec
        engine_mod.plan_request = shipped_plan
        for mode in modes:
            for path in ("new", "old"):
                engine.caches.drop(f"schedule-ab-{mode}-{path}")
    results = {}
    for mode in modes:
        for group in ("first", "later"):
            new, old = paths[(mode, "new", group)], paths[(mode, "old", group)]
            if not new.wall:
                continue
            results[f"{mode}/{group}"] = {
                "new_wall_s": sum(new.wall), "old_wall_s": sum(old.wall),
                "speedup": sum(old.wall) / sum(new.wall),
                "median_step_speedup": statistics.median(o / w for o, w in zip(old.wall, new.wall)),
                "new_decode_s": new.decode_s, "old_decode_s": old.decode_s,
                "new_rounds": new.rounds, "old_rounds": old.rounds,
                "new_plain_steps": new.plain, "old_plain_steps": old.plain,
                "identical_tokens": identical[mode], "new_step_s": new.wall, "old_step_s": old.wall}
    return {"change": change, "workloads": list(workloads), "steps": len(all_steps),
            "skipped_over_limit": skipped, "passes": passes,
            "modes": modes,
            "threads": torch.get_num_threads(), "max_new_tokens": max_new_tokens,
            "shipped_lookup_k": shipped_spec.lookup_k, "runtime": engine.runtime, "results": results,
            "load_average": os.getloadavg()[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asymagent.evals.probes.schedule_ab",
                                description=__doc__.splitlines()[0])
    p.add_argument("--change", default="probe", help="probe | lookup_k=N | drafter_rows | defer_drafter | direct")
    p.add_argument("--modes", default="spec,asym")
    p.add_argument("--steps", type=int, default=12, help="bench steps")
    p.add_argument("--workloads", default="bench", help="bench, suites or domain:NAME, comma separated")
    p.add_argument("--episodes", type=int, default=2, help="test-seed episodes a suite")
    p.add_argument("--max-steps", type=int, default=6, help="steps an episode, spread over it")
    p.add_argument("--passes", type=int, default=2, help="runs of the workload (later ones read the store)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from asymagent.evals.bench.bench import write_json

    doc = measure(args.change, [m.strip() for m in args.modes.split(",") if m.strip()], args.steps,
                  args.passes, args.max_new_tokens,
                  tuple(w.strip() for w in args.workloads.split(",") if w.strip()), args.episodes,
                  args.max_steps)
    doc["command"] = "python -m asymagent.evals.probes.schedule_ab " + " ".join(
        argv if argv is not None else sys.argv[1:])
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for key, r in doc["results"].items():
        print(f"{key:14s} new {r['new_wall_s']:6.2f} s  old {r['old_wall_s']:6.2f} s  {r['speedup']:.2f}x "
              f"(median step {r['median_step_speedup']:.2f}x)  decode {r['old_decode_s']:.2f} -> "
              f"{r['new_decode_s']:.2f} s  plain {r['old_plain_steps']} -> {r['new_plain_steps']}  "
              f"identical tokens: {r['identical_tokens']}")
    write_json(args.json, doc)
    return 0 if all(r["identical_tokens"] for r in doc["results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
