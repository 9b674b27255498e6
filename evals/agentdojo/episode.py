"""One AgentDojo episode through every mode: free-running scores, then step fidelity along full's trajectory.

The episode record (JSON, as the episode log and Ray workers carry it):

    {"seed": "banking/user_task_3/none", "suite", "user_task", "attack", "injection_task",
     "wall_s", "engine": {...},
     "modes": {label: {"free": {utility, security, outcome, ..., "steps": [...]},   (pipeline.run_free)
                       "forced": [{"step", "same_action", "same_tokens", "action", "full_action",
                                   "call_s", "full_call_s", "stats", "refused"}]}}}

Free-running: each mode runs the task on its own, its calls executed by AgentDojo's tools, scored
by AgentDojo (pipeline.py). Step fidelity: at every step of mode full's own episode, every other
mode is given full's history at that step (teacher-forced, on its own cache session, steps in
order) and its turn is compared with full's: `same_action` (the same calls with equal parsed
arguments, or the same whitespace-normalised text) and `same_tokens` (identical token ids). So a
task full fails still yields comparable steps. Every mode starts each episode on cold cache
sessions, so an episode's numbers do not depend on the one before it (local = Ray).
"""

from __future__ import annotations

import json
import time

from asymagent.evals.agentdojo.messages import action_of
from asymagent.evals.agentdojo.pipeline import run_free
from asymagent.evals.agentdojo.responder import EngineResponder, OverWindow
from asymagent.evals.agentdojo.tasks import DojoPlan, EpisodeKey, is_dos, load_episode


def ordered(labels) -> list:
    """Mode labels, `full` first (fidelity is measured against it), otherwise as given."""
    labels = list(labels)
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate modes in {labels}")
    return sorted(labels, key=lambda label: label != "full")


def forced_rows(responder, full_steps: list) -> list:
    """`responder` on full's history at each of full's steps (teacher-forced), compared with full."""
    rows = []
    for n, log in enumerate(full_steps):
        want = log.turn
        row = {"step": n, "full_action": action_of(want.tool_calls, want.text), "full_call_s": want.call_s,
               "refused": None}
        try:
            turn = responder(log.history, log.tools)
        except OverWindow as exc:
            rows.append({**row, "refused": f"over_window: {exc}"[:500], "same_action": None, "same_tokens": None})
            continue
        except Exception as exc:  # recorded, the episode goes on
            rows.append({**row, "refused": f"error: {type(exc).__name__}: {exc}"[:500], "same_action": None,
                         "same_tokens": None})
            continue
        action = action_of(turn.tool_calls, turn.text)
        rows.append({**row, "action": action, "same_action": action == row["full_action"],
                     "same_tokens": list(turn.token_ids) == list(want.token_ids), "call_s": turn.call_s,
                     "new_tokens": len(turn.token_ids),
                     "stats": turn.stats.to_dict() if turn.stats is not None else None})
    return rows


def run_episode_with(make_responder, plan: DojoPlan, key: str, engine_info: dict | None = None) -> dict:
    """The episode record of `key` (module docstring); `make_responder(label, cache_key)` gives
    an object with `__call__(messages, tools) -> Turn` and `reset()`."""
    t0 = time.perf_counter()
    k = EpisodeKey.parse(key)
    record = {"seed": key, "suite": k.suite, "user_task": k.user_task, "attack": k.attack,
              "injection_task": k.injection_task, "engine": engine_info, "modes": {}}
    try:
        suite, user_task, injection_task, injections = load_episode(key, plan.benchmark_version)
    except Exception as exc:  # e.g. an attack that finds no place to inject: recorded per mode
        why = f"{type(exc).__name__}: {exc}"[:2000]
        record["modes"] = {label: {"free": {"utility": None, "security": None, "outcome": "error", "error": why,
                                            "steps": []}, "forced": []} for label in ordered(plan.labels)}
        record["wall_s"] = time.perf_counter() - t0
        return json.loads(json.dumps(record, default=str))
    full_steps = None
    responders = []
    for label in ordered(plan.labels):
        responder = make_responder(label, f"dojo-free-{label}")
        responders.append(responder)
        responder.reset()
        episode, steps = run_free(suite, user_task, injection_task, injections, responder, max_iters=plan.max_iters)
        if is_dos(k.attack) and episode["utility"] is not None:
            episode["security"] = not episode["utility"]  # as AgentDojo scores a DoS attack
        record["modes"][label] = {"free": episode, "forced": []}
        if label == "full":
            full_steps = steps
    if plan.fidelity and full_steps:
        for label in ordered(plan.labels)[1:]:
            responder = make_responder(label, f"dojo-forced-{label}")
            responders.append(responder)
            responder.reset()
            record["modes"][label]["forced"] = forced_rows(responder, full_steps)
    for responder in responders:
        responder.reset()  # frees the episode's caches
    record["wall_s"] = time.perf_counter() - t0
    return json.loads(json.dumps(record, default=str))  # as it reads back from a log or a worker


def run_dojo_episode(engine, plan: DojoPlan, key: str, engine_info: dict | None = None) -> dict:
    """`run_episode_with` on `engine`, each label an EngineResponder."""
    return run_episode_with(lambda label, cache_key: EngineResponder(engine, label, cache_key, plan.max_new_tokens),
                            plan, key, engine_info)
