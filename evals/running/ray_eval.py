"""`asymagent eval ... --ray [ADDRESS]`: episodes fanned out over Ray actors, one engine per actor.

Work unit: one episode (a seed) with every mode, interleaved on one worker exactly as a local run
does it (evals/running/episodes.py), so per-episode timing ratios between modes stay valid. Each actor
(`EpisodeWorker`) builds its engine once from an `EngineSpec` -- model names/paths and settings,
never weights -- and then serves episodes one at a time; the driver keeps every actor busy,
writes each finished episode to the episode log (evals/running/episode_log.py) and shows a progress bar
(episodes done / total, rate, ETA).

Failures: an actor that dies mid-episode (process killed, node lost) is restarted by Ray and the
episode retried (`max_restarts` / `max_task_retries`); an actor that stays dead is dropped and
its episode goes back into the queue for another actor (up to `max_attempts` per episode). An
exception raised by the episode itself (a bug, a bad model path) is not retried: it stops the
run, and the episodes already logged are kept for `--resume`.

Ray is optional (`pip install 'asymagent[ray]'`); nothing outside this module imports it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque

from asymagent.evals.running.engine_setup import EngineSpec
from asymagent.evals.running.episodes import EpisodePlan, run_episode

INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'asymagent[ray]'"


class RayMissing(ImportError):
    """Ray is not installed (the message says how to install it)."""


def import_ray():
    """The `ray` module, or RayMissing with the one-line install hint."""
    try:
        import ray
    except ImportError as exc:
        raise RayMissing(INSTALL_HINT) from exc
    return ray


class EpisodeWorker:
    """A Ray actor body: one engine, built once from `spec`, running episodes of `plan`."""

    episode = staticmethod(run_episode)  # (engine, plan, key, engine_info) -> record; a subclass's own

    def __init__(self, spec: EngineSpec, plan: EpisodePlan, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(max(1, int(threads)))  # the CPUs Ray gave this actor, no more
        self.setup = spec.build()
        self.plan = plan
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def run(self, seed) -> dict:
        record = self.episode(self.setup.engine, self.plan, seed, self.setup.describe())
        record["worker"] = self.name
        return record


def run_logged(spec: EngineSpec, plan, keys: list, *, log_key: dict, run_local, label: str,
               jsonl: str | None = None, resume: bool = False, ray: bool = False,
               address: str | None = None, workers: int | None = None, worker_cpus: float = 1,
               progress: bool = True, worker_cls=EpisodeWorker) -> tuple[dict, int, dict | None]:
    """The episodes of `keys` with the episode log (`jsonl`, `resume`; its key `log_key`), locally
    or on Ray: ({key: record}, episodes the log already held, the run's Ray settings or None).
    `run_local(engine, engine_info, log)` runs them in this process (no engine is built when the
    log holds them all); `label` names the run in the start banner."""
    from asymagent.evals.running.episode_log import EpisodeLog

    if resume and not jsonl:
        raise ValueError("--resume needs the episode log: give --jsonl PATH (or --json with --ray)")
    log = EpisodeLog(jsonl, log_key, resume=resume) if jsonl else None
    resumed = len(set(log.done) & set(keys)) if log is not None else 0
    if ray:
        records = run_episodes_ray(spec, plan, keys, address=address, workers=workers,
                                   worker_cpus=worker_cpus, log=log, progress=progress,
                                   worker_cls=worker_cls)
    else:
        todo = [k for k in keys if log is None or k not in log.done]
        setup = spec.build() if todo else None
        if setup is not None:
            setup.announce(label)
        records = run_local(setup.engine if setup else None, setup.describe() if setup else None, log)
    ran_on = sorted({r["worker"] for r in records.values() if "worker" in r})
    settings = None if not ray else {"address": address or "local", "workers": len(ran_on),
                                     "worker_cpus": worker_cpus}
    return records, resumed, settings


def run_episodes_ray(spec: EngineSpec, plan: EpisodePlan, seeds: list, *, address: str | None = None,
                     workers: int | None = None, worker_cpus: float = 1, log=None, progress: bool = True,
                     max_restarts: int = 1, max_attempts: int = 3, worker_cls=EpisodeWorker) -> dict:
    """Run the episodes of `seeds` not already in `log` on Ray; returns {seed: record} for all
    of `seeds` (logged ones included). Uses the Ray instance already initialised in this process
    if there is one, else `ray.init(address)` (None: start a new local one; "auto", HOST:PORT,
    ray://HOST:10001: join that cluster) and shuts it down after.

    `workers`: actors to start (default: the cluster's CPUs / `worker_cpus`, at most one per
    episode); each gets `worker_cpus` CPUs and as many torch threads.
    """
    ray = import_ray()
    done = dict(log.done) if log is not None else {}
    todo = deque(s for s in seeds if s not in done)
    if not todo:
        return {s: done[s] for s in seeds}
    started = not ray.is_initialized()
    if started:
        if address is None:  # a new Ray on this machine (not one `ray start` left running: `auto`)
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    try:
        if workers is None:
            workers = int(ray.cluster_resources().get("CPU", 1) // worker_cpus)
        workers = max(1, min(int(workers), len(todo)))
        from asymagent.modeling.cpu_threads import omp_env

        # each actor's process starts with the engine's OpenMP wait policy (cpu_threads.py)
        actor_cls = ray.remote(worker_cls).options(
            num_cpus=worker_cpus, max_restarts=max_restarts, max_task_retries=max_restarts,
            runtime_env={"env_vars": omp_env(threads=max(1, int(worker_cpus)))})
        idle = [actor_cls.remote(spec, plan, max(1, int(worker_cpus))) for _ in range(workers)]
        _dispatch(ray, idle, todo, done, log, len(seeds), progress, max_attempts)
    finally:
        if started:
            ray.shutdown()
    return {s: done[s] for s in seeds}


def _dispatch(ray, idle: list, todo: deque, done: dict, log, total: int, progress: bool,
              max_attempts: int) -> None:
    """Keep every live actor on one episode until `todo` is empty; record results as they land."""
    from tqdm.auto import tqdm

    attempts: dict = {}
    inflight: dict = {}  # ObjectRef -> (actor, seed)
    bar = tqdm(total=total, initial=total - len(todo), desc="episodes", unit="ep", disable=not progress)
    try:
        while todo or inflight:
            while idle and todo:
                actor, seed = idle.pop(), todo.popleft()
                inflight[actor.run.remote(seed)] = (actor, seed)
            if not inflight:
                raise RuntimeError(f"every Ray worker died; {len(todo)} episodes left (rerun with --resume)")
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            actor, seed = inflight.pop(ref)
            try:
                record = ray.get(ref)
            except ray.exceptions.RayActorError as exc:  # the actor is gone even after Ray's restarts
                attempts[seed] = attempts.get(seed, 0) + 1
                if attempts[seed] >= max_attempts:
                    raise RuntimeError(f"episode {seed} lost its worker {attempts[seed]} times; last: {exc}") from exc
                todo.appendleft(seed)  # another actor takes it; this one is not reused
                bar.write(f"episode {seed}: worker died ({type(exc).__name__}); retrying on another worker")
                continue
            if log is not None:
                log.append(record)
            done[seed] = record
            idle.append(actor)
            bar.update(1)
    finally:
        bar.close()
