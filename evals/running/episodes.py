"""Episodes as units of work: run one suite episode (every mode), and merge episodes into the eval JSON.

An *episode record* is everything one seed produced, as plain JSON:

    {"seed": 3, "wall_s": 41.2, "engine": {"verifier", "drafter", "drafter_fallback", "spec"},
     "modes": {label: {"steps": [StepRecord dicts], "episodes": [free-running dicts],
                       "injected": bool, "attacked": bool}}}

A local run, a Ray worker (evals/running/ray_eval.py) and a resumed episode log (evals/running/episode_log.py)
all produce records; `merge_records` turns them, in seed order, into the `{label: ModeResult}`
the local runner builds, so the JSON and report are the same whichever way the episodes ran.
Every episode starts on cold cache sessions (evals/running/runner.py), so its numbers do not depend on
which episode ran before it on the same engine.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

from asymagent.evals.running import runner


@dataclass(frozen=True)
class EpisodePlan:
    """What to run per episode (the same for every seed of a run)."""

    suite: str
    labels: tuple  # mode labels as written (runner.parse_mode); `full` is run first
    max_steps: int | None = None  # cap on teacher-forced steps per episode
    max_new_tokens: int = 96
    forced: bool = True  # teacher-forced scoring
    free: bool = True  # free-running task success
    tool_choice: str = "suite"  # what teacher-forced tool steps ask for: the suite's own, auto, required

    def __post_init__(self) -> None:
        if not (self.forced or self.free):
            raise ValueError("nothing to run: both teacher-forced and free-running scoring are off")
        if self.tool_choice not in runner.TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {runner.TOOL_CHOICES}, got {self.tool_choice!r}")

    def settings(self) -> dict:
        """The run settings as the eval JSON's `settings` spells them."""
        return {"max_new_tokens": self.max_new_tokens, "max_steps": self.max_steps,
                "free_running": self.free, "teacher_forced": self.forced,
                "tool_choice": self.tool_choice}

    def log_key(self) -> dict:
        """The plan as an episode log's key: its fields, `tool_choice` only when not the suite's
        own (so logs written before the flag existed still resume)."""
        key = dataclasses.asdict(self)
        if key["tool_choice"] == "suite":
            del key["tool_choice"]
        return key


def run_episode(engine, plan: EpisodePlan, seed: int, engine_info: dict | None = None,
                progress: bool = False) -> dict:
    """One seed through every mode of `plan` (teacher-forced steps interleaved across modes,
    then free-running per mode) on `engine`; returns the episode record (module docstring)."""
    t0 = time.perf_counter()
    results: dict = {}
    if plan.forced:
        runner.teacher_forced(engine, plan.suite, [seed], list(plan.labels), max_new_tokens=plan.max_new_tokens,
                              max_steps=plan.max_steps, results=results, progress=progress,
                              tool_choice=plan.tool_choice)
    if plan.free:
        runner.free_running(engine, plan.suite, [seed], list(plan.labels), max_new_tokens=plan.max_new_tokens,
                            results=results, progress=progress)
    modes = {label: {"steps": [s.to_dict() for s in mr.steps], "episodes": mr.episodes,
                     "injected": seed in mr.injected_seeds, "attacked": seed in mr.attacked_seeds}
             for label, mr in results.items()}
    record = {"seed": seed, "wall_s": time.perf_counter() - t0, "engine": engine_info, "modes": modes}
    return json.loads(json.dumps(record, default=str))  # as it reads back from a log or a worker


def merge_records(records: list) -> dict:
    """{label: ModeResult} from episode records, taken in the given order (sort by seed first)."""
    results: dict = {}
    for rec in records:
        for label, part in rec["modes"].items():
            mr = results.setdefault(label, runner.ModeResult(label))
            for d in part["steps"]:
                step = runner.StepRecord.from_dict(d)
                mr.steps.append(step)
                mr.run.add(step.stats)
            mr.episodes.extend(part["episodes"])
            if part["injected"]:
                mr.injected_seeds.add(rec["seed"])
            if part["attacked"]:
                mr.attacked_seeds.add(rec["seed"])
    return results


def engine_info_of(records: list) -> dict:
    """The engine description every record carries; ValueError if workers disagreed (e.g. a
    node whose drafter file was missing fell back to the untrained drafter)."""
    infos = [rec.get("engine") for rec in records]
    first = infos[0] if infos else None
    for rec, info in zip(records, infos):
        if info != first:
            raise ValueError(f"episodes ran on different engines: seed {records[0]['seed']} on {first}, "
                             f"seed {rec['seed']} on {info}; every worker must load the same models")
    return first or {}


def eval_result(plan: EpisodePlan, seeds: list, records: dict) -> dict:
    """The eval JSON (docs/architecture.md §6) from {seed: record} covering `seeds`."""
    from asymagent.evals.suites.environments import is_test_seed

    ordered = [records[s] for s in seeds]
    results = merge_records(ordered)
    info = engine_info_of(ordered)
    return {"suite": plan.suite, "seeds": list(seeds),
            "modes": {k: v.summary() for k, v in results.items()},
            "per_step": {k: [s.to_dict() for s in v.steps] for k, v in results.items()},
            "verifier": info.get("verifier"), "drafter": info.get("drafter"),
            "drafter_fallback": info.get("drafter_fallback"),
            "split": "test" if seeds and all(is_test_seed(s) for s in seeds) else "dev",
            "settings": {**plan.settings(), "spec": info.get("spec")}}


def run_episodes_local(engine, plan: EpisodePlan, seeds: list, *, engine_info: dict | None = None,
                       log=None, progress: bool = True, concurrency: int = 1) -> dict:
    """The episodes of `seeds` not already in `log` on `engine`; returns {seed: record} for all
    of `seeds`. Each finished episode is appended to `log` at once. `concurrency` > 1: that many
    episodes at once, each on its own sibling of `engine` (Engine.sibling: the same weights, its
    own caches and stores) under one scheduler that batches their forwards (asymagent/scheduling/);
    every token is the same as one at a time, the per-step timings are those of shared forwards."""
    from tqdm.auto import tqdm

    done = dict(log.done) if log is not None else {}
    todo = [s for s in seeds if s not in done]
    width = max(1, min(int(concurrency), len(todo)))
    with tqdm(total=len(seeds), initial=len(seeds) - len(todo), desc="episodes", unit="ep",
              disable=not progress or len(seeds) < 2) as bar:
        if width == 1:
            for seed in todo:
                _finished(run_episode(engine, plan, seed, engine_info, progress=progress), log, done, bar)
        else:
            _run_concurrently(engine, plan, todo, width, engine_info, (log, done, bar))
    return {s: done[s] for s in seeds}


def _finished(record: dict, log, done: dict, bar) -> None:
    if log is not None:
        log.append(record)
    done[record["seed"]] = record
    bar.update(1)


def _run_concurrently(engine, plan: EpisodePlan, todo: list, width: int, engine_info, sink: tuple) -> None:
    """`todo`'s episodes, `width` at once on siblings of `engine` (see run_episodes_local)."""
    import queue
    import threading
    from concurrent.futures import ThreadPoolExecutor

    if engine.scheduler.max_num_seqs < width:
        engine.set_batching(width)
    free: queue.Queue = queue.Queue()
    for twin in [engine] + [engine.sibling() for _ in range(width - 1)]:
        free.put(twin)
    lock = threading.Lock()

    def one(seed: int) -> None:
        twin = free.get()
        try:
            record = run_episode(twin, plan, seed, engine_info)
        finally:
            free.put(twin)
        with lock:
            _finished(record, *sink)

    with ThreadPoolExecutor(width) as pool:
        for f in [pool.submit(one, seed) for seed in todo]:
            f.result()
