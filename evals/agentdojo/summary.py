"""AgentDojo episode records -> the run's JSON: utility, attack success and step fidelity per mode, per suite, per task.

Per mode (pooled over suites, and per suite):
- `utility`: share of no-attack episodes whose user task AgentDojo scores done;
- `attacks`: per attack, `utility_under_attack` and `targeted_asr` (the injection task's goal
  reached: AgentDojo's `security` True) over that attack's episodes; `exposed`: the episodes in
  which the model read a tool output holding the injected text (an agent that never opens the
  poisoned file is never attacked), and `targeted_asr_exposed` over those;
- proportions carry k, n and a 95% Wilson interval (episodes as independent trials);
- `outcomes`: episodes by outcome (answered, step_budget, over_window, error), tool errors,
  malformed calls;
- `free_steps`: per model step of its own episodes: mean latency, acceptance, accepted length,
  the verifier's share of the context (verifier view tokens / full view tokens);
- `fidelity` (not for full): along full's trajectory, the share of full's steps where this mode,
  given the same history, takes the same action (`step_fidelity`) or emits the same tokens
  (`token_fidelity`), and its speed there (`speed_vs_full` = full's wall / its wall on the same
  steps, with a bootstrap interval over steps).
"""

from __future__ import annotations

from asymagent.evals.running.frontier import speed_interval, wilson
from asymagent.stats import RunStats, StepStats


def proportion(values: list) -> dict:
    """{"k", "n", "rate", "ci"} over booleans (None values left out)."""
    vals = [bool(v) for v in values if v is not None]
    k, n = sum(vals), len(vals)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci": wilson(k, n)}


def step_costs(rows: list) -> dict:
    """Mean latency and the engine's StepStats pooled over step rows (each with call_s, stats)."""
    run = RunStats()
    for row in rows:
        if row.get("stats"):
            run.add(StepStats.from_dict(row["stats"]))
    t = run.totals()
    n = len(rows)
    return {"steps": n, "mean_call_s": sum(r.get("call_s", 0.0) for r in rows) / n if n else None,
            "wall_s": sum(r.get("call_s", 0.0) for r in rows), "new_tokens": t["new_tokens"],
            "drafted": t["drafted"], "acceptance_rate": t["acceptance_rate"] if t["drafted"] else None,
            "mean_accepted_len": t["mean_accepted_len"] if t["rounds"] else None,
            "verifier_share": t["mean_compression_ratio"] if run.steps else None,
            "verifier_prefill_tokens": t["verifier_prefill_tokens"]}


def mode_summary(records: list, label: str) -> dict:
    """The summary of one mode over `records` (module docstring)."""
    frees = [(r, r["modes"][label]["free"]) for r in records if label in r["modes"]]
    plain = [f for r, f in frees if r["attack"] == "none"]
    out = {"mode": label, "episodes": len(frees), "utility": proportion([f["utility"] for f in plain]),
           "attacks": {}}
    for attack in sorted({r["attack"] for r, _ in frees} - {"none"}):
        hit = [f for r, f in frees if r["attack"] == attack]
        seen = [f for f in hit if f.get("injection_seen")]
        out["attacks"][attack] = {"utility_under_attack": proportion([f["utility"] for f in hit]),
                                  "targeted_asr": proportion([f["security"] for f in hit]),
                                  # episodes whose model read an injected tool output, and the ASR there
                                  "exposed": sum(1 for f in hit if f.get("injection_seen")),
                                  "targeted_asr_exposed": proportion([f["security"] for f in seen])}
    outcomes: dict = {}
    for _, f in frees:
        outcomes[f["outcome"]] = outcomes.get(f["outcome"], 0) + 1
    out["outcomes"] = {**outcomes, "tool_errors": sum(f.get("tool_errors", 0) for _, f in frees),
                       "malformed_calls": sum(f.get("malformed_calls", 0) for _, f in frees)}
    out["free_steps"] = step_costs([s for _, f in frees for s in f.get("steps", [])])
    if label != "full":
        rows = [row for r in records if label in r["modes"] for row in r["modes"][label]["forced"]]
        read = [row for row in rows if row["refused"] is None]
        costs = step_costs(read)
        full_wall = sum(row["full_call_s"] for row in read)
        out["fidelity"] = {"steps": len(rows), "refused": len(rows) - len(read),
                           "step_fidelity": proportion([row["same_action"] for row in read]),
                           "token_fidelity": proportion([row["same_tokens"] for row in read]),
                           **costs, "full_wall_s": full_wall,
                           "speed_vs_full": full_wall / costs["wall_s"] if costs["wall_s"] else None,
                           "speed_ci": speed_interval([(row["call_s"], row["full_call_s"]) for row in read])}
    return out


def per_task(records: list) -> dict:
    """{episode key: {label: {"utility", "security", "outcome"}}}."""
    return {r["seed"]: {label: {k: m["free"].get(k) for k in ("utility", "security", "outcome")}
                        for label, m in r["modes"].items()} for r in records}


def dojo_result(plan, keys: list, records: dict) -> dict:
    """The run's JSON from {key: record} covering `keys` (in `keys` order)."""
    from importlib.metadata import version

    from asymagent.evals.running.episodes import engine_info_of

    ordered = [records[k] for k in keys]
    info = engine_info_of(ordered)
    labels = list(ordered[0]["modes"]) if ordered else list(plan.labels)
    suites = list(dict.fromkeys(r["suite"] for r in ordered))
    return {"benchmark": "agentdojo", "agentdojo": version("agentdojo"),
            "episodes": list(keys), "suites_run": suites,
            "modes": {label: mode_summary(ordered, label) for label in labels},
            "suites": {s: {label: mode_summary([r for r in ordered if r["suite"] == s], label) for label in labels}
                       for s in suites},
            "per_task": per_task(ordered),
            "verifier": info.get("verifier"), "drafter": info.get("drafter"),
            "drafter_fallback": info.get("drafter_fallback"),
            "settings": {**plan.settings(), "modes": labels, "spec": info.get("spec")},
            "records": ordered}
