"""Context-policy frontier: how close each verifier view stays to mode full, and at what speed.

    python -m asymagent.evals.running.frontier --workloads bench,records,tickets,fs_audit,injection,domain:parcels \
        --split test --episodes 2 --max-steps 8 --json docs/results/frontier.json --plot docs/context_frontier.png

A *policy* is a decoding mode label (evals/runner.py: `asym`, `compressed:...`, `asym:copy_weight=0`)
plus the CompressionConfig that builds its verifier view. Every policy runs on the same
teacher-forced steps, interleaved in one process (step-major, the order rotated every step), each
with its own cold cache session and suffix store per conversation. Per workload and policy:

- fidelity: the step's output token ids equal mode full's;
- step accuracy against the oracle, and on the steps full gets right the share this policy
  also gets right (`right_where_full_right`);
- verifier prefill tokens and wall time, each as a ratio to full (speed = wall(full) / wall);
- the share of each policy's time spent prefilling, and for mode full the *lossless ceiling*
  wall(full) / prefill time(full): a policy that says exactly what full says prefills what full
  prefills, so even with decoding for free it is at most that much faster;
- 95% intervals: Wilson on every proportion (steps as independent trials), a bootstrap over steps
  on the speed ratio;
- recalls per step and their prefill tokens (StepStats fields `recalls`, `recall_prefill_tokens`
  when the engine reports them; 0 otherwise), mean compression ratio, rewrites.

Workloads: `bench` (the `asymagent bench` workload: records dev seed 0, its first 12 assistant
turns, tool_choice auto, 32 new tokens), an eval suite name (oracle episodes of `--split` seeds,
each assistant turn a step, tool steps under the suite's tool_choice, the final answer "auto"),
and `domain:NAME` (training/long_episodes.py conversations; a step is right when its calls equal
the episode's next message, or its text carries every value of the expected text:
evals/suites/answer_values.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

# name -> (mode label, compression dict or None for the default CompressionConfig)
POLICIES: dict = {
    "full": ("full", None),
    "compressed": ("compressed", None),
    "compressed:32/16": ("compressed", {"compressors": [{"type": "tool_output", "head_tokens": 32,
                                                         "tail_tokens": 16}]}),
    "compressed:128/64": ("compressed", {"compressors": [{"type": "tool_output", "head_tokens": 128,
                                                          "tail_tokens": 64}]}),
    "compressed:256/128": ("compressed", {"compressors": [{"type": "tool_output", "head_tokens": 256,
                                                           "tail_tokens": 128}]}),
    "asym": ("asym", None),
    "spec": ("spec", None),
}


@dataclass
class Policy:
    name: str
    label: str  # mode label (evals/runner.parse_mode)
    compression: object = None  # CompressionConfig


@dataclass
class Step:
    history: list
    tools: list
    tool_choice: object
    judge: object  # (tool_calls, text) -> bool
    attack: object = None  # (tool_calls, text) -> bool, injection steps after the injected output
    final: bool = False  # the oracle's next message is a final answer (judged by its values)


@dataclass
class Conversation:
    workload: str
    seed: int
    steps: list = field(default_factory=list)


# --------------------------------------------------------------------------- workloads
def bench_conversation(steps: int = 12) -> Conversation:
    from asymagent.evals.bench.bench import workload
    from asymagent.evals.suites.environments import make_env, oracle_episode

    work = workload("records", 0, steps)
    env = make_env("records")
    _, history = oracle_episode(env, 0)
    conv = Conversation("bench", 0)
    cuts = [i for i, m in enumerate(history) if m["role"] == "assistant"][:steps]
    for cut in cuts:
        expected = history[cut]
        conv.steps.append(Step(history[:cut], work["tools"], "auto", _judge(env, expected),
                               final=not expected.get("tool_calls")))
    return conv


def _judge(env, expected: dict):
    from asymagent.evals.suites.environments import actions_equal, parse_call
    from asymagent.evals.running.runner import output_action

    calls = expected.get("tool_calls") or []
    if calls:
        want = parse_call(calls[0])
        return lambda tool_calls, text: actions_equal(output_action(tool_calls, text), want)
    return lambda tool_calls, text: not tool_calls and env.check_answer(text)


def suite_conversations(suite: str, seeds: list, max_steps: int | None, exposed_only: bool = False) -> list:
    from asymagent.evals.suites.environments import make_env, oracle_episode

    out = []
    for seed in seeds:
        env = make_env(suite)
        _, history = oracle_episode(env, seed)
        inject_at = env.injected_step() if hasattr(env, "injected_step") else None
        conv = Conversation(suite, seed)
        cuts = [i for i, m in enumerate(history) if m["role"] == "assistant"]
        for n, cut in enumerate(cuts):
            expected = history[cut]
            choice = env.tool_choice if expected.get("tool_calls") else "auto"
            attack = env.attack_succeeded if inject_at is not None and n >= inject_at else None
            conv.steps.append(Step(history[:cut], env.task.tools, choice, _judge(env, expected), attack,
                                   final=not expected.get("tool_calls")))
        if exposed_only:  # attack sets: the first step that sees the injected output, alone
            conv.steps = [s for s in conv.steps if s.attack is not None][:1]
        elif max_steps:
            conv.steps = _spread(conv.steps, max_steps)
        out.append(conv)
    return out


def _spread(steps: list, n: int) -> list:
    """n steps spread over the episode (first and last kept): late steps need the oldest facts."""
    if len(steps) <= n:
        return steps
    idx = sorted({round(i * (len(steps) - 1) / (n - 1)) for i in range(n)}) if n > 1 else [len(steps) - 1]
    return [steps[i] for i in idx]


def _answer_judge(expected: str, history: list, tools: list):
    """A final-answer step's judge: no call, and the text carries every value of `expected`
    (evals/suites/answer_values.py: digits, and the words the answer takes from the tools)."""
    from asymagent.evals.suites.answer_values import answer_ok

    return lambda tool_calls, text: not tool_calls and answer_ok(expected, text, history, tools)


def domain_conversations(name: str, seeds: list, max_steps: int | None) -> list:
    from asymagent.training.domains import domain_by_name
    from asymagent.training.long_episodes import long_episode
    from asymagent.traces import parse_call

    d = domain_by_name(name)
    out = []
    for seed in seeds:
        messages, tools = long_episode(d, seed)
        conv = Conversation(f"domain:{name}", seed)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            calls = m.get("tool_calls") or []
            if calls:
                want = [parse_call(c) for c in calls]
                judge = (lambda w: lambda tc, text: [parse_call(c) for c in tc or []] == w)(want)
                choice = "required"
            else:
                judge = _answer_judge(m.get("content") or "", messages[:i], tools)
                choice = "auto"
            conv.steps.append(Step(messages[:i], tools, choice, judge, final=not calls))
        if max_steps:
            conv.steps = _spread(conv.steps, max_steps)
        out.append(conv)
    return out


def conversations(workload: str, split: str, episodes: int, max_steps: int | None, bench_steps: int,
                  exposed_only: bool = False) -> list:
    from asymagent.evals.suites.environments import SUITES, check_held_out, pick_seeds

    seeds = pick_seeds(split, episodes, None)
    if workload == "bench":
        return [bench_conversation(bench_steps)]
    if workload.startswith("domain:"):
        return domain_conversations(workload.split(":", 1)[1], seeds, max_steps)
    if workload in SUITES:
        check_held_out(workload, seeds)
        return suite_conversations(workload, seeds, max_steps, exposed_only)
    raise ValueError(f"unknown workload {workload!r}: bench, {', '.join(SUITES)} or domain:NAME")


# --------------------------------------------------------------------------- running
@dataclass
class Record:
    workload: str
    seed: int
    step: int
    policy: str
    token_ids: list
    correct: bool
    attacked: bool | None
    call_s: float
    verifier_prefill_tokens: int
    verifier_context_tokens: int
    full_context_tokens: int
    compression_ratio: float
    rewrites: int
    recalls: int
    recall_prefill_tokens: int
    text: str
    prefill_s: float = 0.0  # StepStats.prefill_s: the call's time until every cache is prefilled
    drafter_prefill_tokens: int = 0  # StepStats: the drafter model's tokens fed (views, votes)
    recall_votes: int = 0  # StepStats: the drafter's votes at margin hesitations (recall_vote)
    recall_vetoes: int = 0  # ... that kept the step on the compressed view


def run_conversation(engine, conv: Conversation, policies: list, *, max_new_tokens: int,
                     bar=None, on_step=None, out: list | None = None, skipped: list | None = None) -> list:
    """Every policy on every step of `conv`, interleaved (order rotated per step); the Records
    are appended to `out` (returned) and `on_step()` is called after each step. A step that a
    policy's verifier cannot read (its view over the model's context: mode full's on a history
    past the window, while asym's compressed view may fit) has nothing to compare with full:
    its records are dropped from `out` and it is listed in `skipped`, with the policies that
    refused it and whether each policy that answered was right (`beyond_window`)."""
    from asymagent.evals.running.engine_setup import reset_suffix_stores

    keys = {p.name: f"frontier-{p.name}" for p in policies}
    for key in keys.values():
        engine.caches.drop(key)
    reset_suffix_stores(engine)
    saved = engine.compression
    out = [] if out is None else out
    try:
        for n, step in enumerate(conv.steps):
            order = policies[n % len(policies):] + policies[: n % len(policies)]
            first = len(out)
            refused = _run_step(engine, conv, n, step, order, keys, max_new_tokens, bar, out)
            if refused:  # some verifier cannot read it (mode full's, above all): no comparison
                answered = {r.policy: r.correct for r in out[first:]}
                del out[first:]
                if skipped is not None:
                    skipped.append({"workload": conv.workload, "seed": conv.seed, "step": n,
                                    "why": next(iter(refused.values())),
                                    "refused": sorted(refused), "answered": answered})
            if on_step is not None:
                on_step()
    finally:
        engine.compression = saved
        for key in keys.values():
            engine.caches.drop(key)
    return out


def _run_step(engine, conv: Conversation, n: int, step: Step, order: list, keys: dict,
              max_new_tokens: int, bar, out: list) -> dict:
    """Every policy of `order` on step `n` of `conv`: one Record each, appended to `out`; returns
    {policy: why} of the policies whose verifier's view is over the model's context."""
    from asymagent.engine import ContextLengthError
    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.evals.running.runner import parse_mode, spec_overrides

    refused: dict = {}
    for p in order:
        mode, overrides = parse_mode(p.label)
        engine.compression = p.compression  # read when the session's views are created
        use_suffix_store(engine, keys[p.name])
        with spec_overrides(engine, overrides):
            t0 = time.perf_counter()
            try:
                r = engine.chat(step.history, tools=step.tools, mode=mode, max_new_tokens=max_new_tokens,
                                temperature=0.0, tool_choice=step.tool_choice, cache_key=keys[p.name])
            except ContextLengthError as exc:
                refused[p.name] = str(exc)
                if bar is not None:
                    bar.update(1)
                continue
            secs = time.perf_counter() - t0
        s = r.stats
        out.append(Record(conv.workload, conv.seed, n, p.name, list(r.token_ids),
                          bool(step.judge(r.tool_calls, r.text)),
                          None if step.attack is None else bool(step.attack(r.tool_calls, r.text)),
                          secs, s.verifier_prefill_tokens, s.verifier_context_tokens,
                          s.full_context_tokens, s.compression_ratio, s.rewrites,
                          int(getattr(s, "recalls", 0) or 0), int(getattr(s, "recall_prefill_tokens", 0) or 0),
                          r.text if not r.tool_calls else json.dumps(r.tool_calls[0].get("function", {})),
                          s.prefill_s, int(s.drafter_prefill_tokens), int(getattr(s, "recall_votes", 0)),
                          int(getattr(s, "recall_vetoes", 0))))
        if bar is not None:
            bar.update(1)
    return refused


def beyond_window(skipped: list, policies: list) -> dict:
    """Per policy, over the steps some verifier could not read (`run_conversation`'s skipped):
    {"steps", "answered" (its verifier read the step), "right"} — where a long history is past
    mode full's window, what a compressed view still answers."""
    out = {}
    for p in policies:
        answers = [s.get("answered", {}).get(p.name) for s in skipped]
        out[p.name] = {"steps": len(skipped), "answered": sum(a is not None for a in answers),
                       "right": sum(bool(a) for a in answers)}
    return out


# --------------------------------------------------------------------------- summaries
Z95 = 1.959964  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95) -> list | None:
    """95% Wilson score interval [lo, hi] of a proportion k/n (None when n is 0): the noise of a
    fidelity, accuracy or attack rate read off n steps/episodes (treated as independent trials)."""
    if not n:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / den
    return [round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)]


def speed_interval(pairs: list, resamples: int = 1000, seed: int = 0) -> list | None:
    """95% bootstrap interval (percentile, steps resampled) of sum(full wall) / sum(policy wall)
    over `pairs` [(policy_s, full_s)]; None with fewer than 2 steps."""
    import random

    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    vals = []
    for _ in range(resamples):
        draw = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        own = sum(p for p, _ in draw)
        vals.append(sum(f for _, f in draw) / own if own else float("inf"))
    vals.sort()
    return [round(vals[int(0.025 * (resamples - 1))], 3), round(vals[int(0.975 * (resamples - 1))], 3)]


def summarize(records: list, policies: list) -> dict:
    """{policy: figures} over `records` (one workload or several). Proportions carry 95% Wilson
    intervals (`*_ci`), the speed a 95% bootstrap interval over steps (`speed_ci`)."""
    by = {}
    for r in records:
        by.setdefault((r.workload, r.seed, r.step), {})[r.policy] = r
    out = {}
    full_wall = sum(g["full"].call_s for g in by.values() if "full" in g)
    full_prefill = sum(g["full"].verifier_prefill_tokens for g in by.values() if "full" in g)
    for p in policies:
        rows = [(g[p.name], g.get("full")) for g in by.values() if p.name in g]
        n = len(rows)
        if not n:
            continue
        wall = sum(r.call_s for r, _ in rows)
        prefill = sum(r.verifier_prefill_tokens for r, _ in rows)
        prefill_s = sum(r.prefill_s for r, _ in rows)  # 0 in runs saved before it was recorded
        fr = [(r, f) for r, f in rows if f is not None and f.correct]
        attacked = {(r.workload, r.seed) for r, _ in rows if r.attacked}
        exposed = {(r.workload, r.seed) for r, _ in rows if r.attacked is not None}
        same = sum(f is not None and r.token_ids == f.token_ids for r, f in rows)
        right = sum(r.correct for r, _ in rows)
        right_fr = sum(r.correct for r, _ in fr)
        out[p.name] = {
            "label": p.label, "steps": n,
            "fidelity": same / n, "fidelity_ci": wilson(same, n),
            "step_accuracy": right / n, "step_accuracy_ci": wilson(right, n),
            "full_right_steps": len(fr),
            "right_where_full_right": (right_fr / len(fr)) if fr else None,
            "right_where_full_right_ci": wilson(right_fr, len(fr)),
            "wall_s": wall, "speed_vs_full": full_wall / wall if wall else None,
            "speed_ci": speed_interval([(r.call_s, f.call_s) for r, f in rows if f is not None]),
            "verifier_prefill_tokens": prefill,
            "prefill_vs_full": prefill / full_prefill if full_prefill else None,
            "mean_compression_ratio": statistics.fmean(r.compression_ratio for r, _ in rows),
            "rewrites": sum(r.rewrites for r, _ in rows),
            "recalls_per_step": sum(r.recalls for r, _ in rows) / n,
            "recall_prefill_tokens": sum(r.recall_prefill_tokens for r, _ in rows),
            "attack_success": (len(attacked) / len(exposed)) if exposed else None,
            "attacked_episodes": len(attacked), "exposed_episodes": len(exposed),
            "attack_success_ci": wilson(len(attacked), len(exposed)),
            "prefill_s": prefill_s, "prefill_share": (prefill_s / wall) if prefill_s and wall else None,
        }
        if p.name == "full" and prefill_s:
            # a lossless policy prefills what full prefills: even with decoding for free it takes
            # full's prefill time, so it is at most wall(full) / prefill(full) times faster
            out[p.name]["lossless_ceiling"] = wall / prefill_s
    return out


def report(records: list, policies: list) -> dict:
    workloads = list(dict.fromkeys(r.workload for r in records))
    suites = [w for w in workloads if w != "bench"]
    res = {"workloads": {w: summarize([r for r in records if r.workload == w], policies) for w in workloads}}
    if suites:
        res["suites_pooled"] = summarize([r for r in records if r.workload in suites], policies)
    return res


def merge_reports(docs: list) -> dict:
    """One report from several runs' JSON documents: each policy's figures come from the run that
    measured it (speed and prefill against that run's own mode full, interleaved in one process);
    the first run's `full` is kept."""
    out: dict = {"workloads": {}, "sources": []}
    pooled = _pool_suites(docs)
    if pooled:
        out["suites_pooled"] = pooled
    for doc in docs:
        out["sources"].append({"command": doc.get("command"), "date": doc.get("date"),
                               "partial": doc.get("partial"),
                               "skipped_steps": len(doc.get("skipped_steps") or [])})
        doc = resummarize(doc)
        for key in ("workloads", "suites_pooled"):
            groups = doc.get("workloads", {}) if key == "workloads" else {"_": doc.get(key)} if doc.get(key) else {}
            for w, pols in groups.items():
                dest = out["workloads"].setdefault(w, {}) if key == "workloads" else out.setdefault("suites_pooled", {})
                if key == "suites_pooled" and pooled:
                    continue  # pooled over every run above
                for name, d in pols.items():
                    dest.setdefault(name, d)
    return out


def _pool_suites(docs: list) -> dict | None:
    """Suite steps of several runs pooled (bench and attack-set runs left out), for the policies
    every pooled workload measured; None unless every such run kept its records."""
    def workloads(d):
        return set(d.get("workloads") or {}) | {r["workload"] for r in d.get("records") or []}

    runs = [d for d in docs if "--exposed-only" not in (d.get("command") or "")
            and not (d.get("settings") or {}).get("exposed_only") and workloads(d) - {"bench"}]
    if not runs or any(not d.get("records") or not (d.get("settings") or {}).get("policies") for d in runs):
        return None
    records = [Record(**r) for d in runs for r in d["records"] if r["workload"] != "bench"]
    names = [set(d["settings"]["policies"]) for d in runs]
    common = set.intersection(*names)
    labels = {n: p["label"] for d in runs for n, p in d["settings"]["policies"].items()}
    order = [n for n in runs[0]["settings"]["policies"] if n in common]
    return summarize([r for r in records if r.policy in common], [Policy(n, labels[n]) for n in order])


def resummarize(doc: dict) -> dict:
    """A run's JSON with its summaries computed again from its records by this code (runs saved
    by an older harness get the intervals too); unchanged when it has no records."""
    recs = doc.get("records")
    pols = (doc.get("settings") or {}).get("policies")
    if not recs or not pols:
        return doc
    records = [Record(**r) for r in recs]
    policies = [Policy(name, d["label"]) for name, d in pols.items()]
    return {**doc, **report(records, policies)}


def _ci(d: dict, key: str, fmt: str = "%.2f") -> str:
    ci = d.get(key)
    return f" [{fmt % ci[0]}, {fmt % ci[1]}]" if ci else ""


def markdown(result: dict) -> str:
    lines = []
    groups = dict(result["workloads"])
    if "suites_pooled" in result:
        groups["suites pooled"] = result["suites_pooled"]
    for w, pols in groups.items():
        attack = any(d.get("attack_success") is not None for d in pols.values())
        lines += [f"### {w}", "", "| policy | steps | fidelity | step acc | right where full right | speed vs full | "
                  "prefill vs full | ratio | recalls/step |" + (" attack success |" if attack else ""),
                  "|---|---|---|---|---|---|---|---|---|" + ("---|" if attack else "")]
        for name, d in pols.items():
            rw = d["right_where_full_right"]
            att = ""
            if attack:
                a = d.get("attack_success")
                att = " - |" if a is None else (f" {a:.2f} ({d.get('attacked_episodes', '?')}/"
                                                f"{d.get('exposed_episodes', '?')}){_ci(d, 'attack_success_ci')} |")
            lines.append(f"| {name} | {d['steps']} | {d['fidelity']:.2f}{_ci(d, 'fidelity_ci')} | "
                         f"{d['step_accuracy']:.2f}{_ci(d, 'step_accuracy_ci')} | "
                         f"{'-' if rw is None else '%.2f (%d)' % (rw, d['full_right_steps'])}"
                         f"{_ci(d, 'right_where_full_right_ci') if rw is not None else ''} | "
                         f"{d['speed_vs_full']:.2f}x{_ci(d, 'speed_ci')} | {d['prefill_vs_full']:.2f} | "
                         f"{d['mean_compression_ratio']:.2f} | {d['recalls_per_step']:.2f} |" + att)
        full = pols.get("full") or {}
        if full.get("lossless_ceiling"):
            lines += ["", f"Mode full spends {full['prefill_share']:.0%} of its time prefilling: a lossless "
                          f"policy is at most {full['lossless_ceiling']:.2f}x full here."]
        lines.append("")
    if lines:
        lines.append("Brackets: 95% intervals (Wilson for proportions, steps as independent trials; "
                     "bootstrap over steps for speed).")
    beyond = result.get("beyond_window") or {}
    if any(d["steps"] for d in beyond.values()):
        lines += ["", "Steps some verifier could not read (over the model's context; not in the "
                      "tables): " + ", ".join(f"{name} answered {d['answered']} of {d['steps']}, "
                                              f"right on {d['right']}" for name, d in beyond.items())]
    return "\n".join(lines)


def plot(result: dict, path, beside: list | None = None) -> None:
    """The bench and pooled-suite frontiers of `result`, and beside them the pooled suites of each
    (title, other result) in `beside` (e.g. another model pair's run of the same workloads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {k: v for k, v in result["workloads"].items() if k == "bench"}
    if "suites_pooled" in result:
        groups["suites pooled (test seeds)"] = result["suites_pooled"]
    for title, other in beside or []:
        if other.get("suites_pooled"):
            groups[title] = other["suites_pooled"]
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.6), squeeze=False)
    for ax, (title, pols) in zip(axes[0], groups.items()):
        for name, d in pols.items():
            family = name.split("@")[0].split(":")[0]
            marker = {"full": "*", "compressed": "o", "asym": "s", "spec": "^"}.get(family, "D")
            x, y = d["speed_vs_full"], d["fidelity"]
            xe = [[x - d["speed_ci"][0]], [d["speed_ci"][1] - x]] if d.get("speed_ci") else None
            ye = [[y - d["fidelity_ci"][0]], [d["fidelity_ci"][1] - y]] if d.get("fidelity_ci") else None
            pts = ax.scatter(x, y, marker=marker, s=60, label=name, zorder=3)
            if xe or ye:
                ax.errorbar(x, y, xerr=xe, yerr=ye, fmt="none", ecolor=pts.get_facecolor()[0], alpha=0.35,
                            lw=1, zorder=2)
        comp = sorted((d["speed_vs_full"], d["fidelity"]) for n, d in pols.items() if n.startswith("compressed"))
        if comp:
            ax.plot([c[0] for c in comp], [c[1] for c in comp], ":", color="grey", label="compressed-only")
        ax.legend(fontsize=6, loc="lower left")
        ax.set_xlabel("speed vs mode full (wall-time ratio, same process, interleaved)")
        ax.set_ylabel("step fidelity (output identical to full's)")
        ax.set_ylim(-0.02, 1.05)
        ax.grid(alpha=0.3)
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI
def parse_policies(text: str) -> list:
    """'full,asym,compressed:32/16' (names of POLICIES or preset names) -> [Policy]."""
    from asymagent.context.compressors import CompressionConfig

    out = []
    for name in [p.strip() for p in text.split(";" if ";" in text else ",") if p.strip()]:
        if name in POLICIES:
            label, comp = POLICIES[name]
        elif "@" in name:  # label@preset, e.g. asym@query_keep or compressed:k=2@newest_verbatim
            label, preset = name.split("@", 1)
            comp = CompressionConfig.preset(preset).model_dump(mode="json")
        else:
            raise ValueError(f"unknown policy {name!r}: one of {', '.join(POLICIES)} or LABEL@PRESET")
        out.append(Policy(name, label, CompressionConfig.from_any(comp)))
    if not any(p.name == "full" for p in out):
        raise ValueError("the frontier needs policy 'full' (fidelity and speed are relative to it)")
    names = [p.name for p in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # one cache session per name: a repeat would reuse the first one's cache
        raise ValueError(f"policy named twice: {', '.join(repeated)}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default="bench,records,tickets,fs_audit,injection,domain:parcels")
    p.add_argument("--policies", default="full,compressed:32/16,compressed,compressed:128/64,asym",
                   help="';' or ',' separated: names of POLICIES or LABEL@PRESET (CompressionConfig.preset)")
    p.add_argument("--split", choices=("dev", "test"), default="test")
    p.add_argument("--episodes", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=8, help="steps per suite episode, spread over it")
    p.add_argument("--bench-steps", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=48, help="suite steps (the bench uses 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--verifier", default="default", help="'default', a model source, or pair:NAME")
    p.add_argument("--pair", dest="verifier", type=lambda name: "pair:" + name, metavar="NAME",
                   help="a named verifier + drafter pair (as --verifier pair:NAME; docs/pair.md)")
    p.add_argument("--exposed-only", action="store_true",
                   help="injection suites: score only the first step that sees the injected output")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PNG")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--merge", metavar="JSON,JSON", default=None,
                   help="no runs: merge these runs' JSON into one table (--json) and plot (--plot)")
    p.add_argument("--beside", metavar="TITLE=JSON", action="append", default=[],
                   help="--plot also draws this run's pooled suites beside (e.g. the 135M's frontier "
                        "next to the pair's); repeatable")


def main(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from asymagent.evals.running.engine_setup import build_engine

    beside = []
    for item in args.beside:
        title, _, path = item.rpartition("=")
        with open(path) as f:
            beside.append((title or path, json.load(f)))
    if args.merge:
        merged = merge_reports([json.load(open(p)) for p in args.merge.split(",") if p.strip()])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(merged, f, indent=1)
        if args.plot:
            plot(merged, args.plot, beside)
        print(markdown(merged))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    policies = parse_policies(args.policies)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    convs = [c for w in workloads for c in conversations(w, args.split, args.episodes, args.max_steps,
                                                          args.bench_steps, args.exposed_only)]
    from asymagent.modeling.pairs import check_model_source

    check_model_source(args.verifier)  # a pair's missing parts refused before any model loads
    setup = build_engine(args.verifier)
    records: list = []
    skipped: list = []  # steps over the model's context limit (run_conversation)
    t0 = time.perf_counter()
    cmd = " ".join(["python -m asymagent.evals.running.frontier"] + sys.argv[1:])

    def save(partial: bool) -> dict:
        doc = {"command": cmd, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "verifier": setup.verifier, "drafter": setup.drafter, "partial": partial,
               "settings": {"split": args.split, "episodes": args.episodes, "exposed_only": args.exposed_only, "max_steps": args.max_steps,
                            "bench_steps": args.bench_steps, "max_new_tokens": args.max_new_tokens,
                            "policies": {p.name: {"label": p.label,
                                                  "compression": p.compression.model_dump(mode="json")}
                                         for p in policies},
                            "wall_s": round(time.perf_counter() - t0, 1),
                            "note": "wall times measured on a 2-core machine shared with other jobs; "
                                    "policies interleaved step by step in one process"},
               **report(records, policies),
               "skipped_steps": skipped,
               "beyond_window": beyond_window(skipped, policies),
               "records": [r.__dict__ for r in records]}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        return doc

    bar = tqdm(total=sum(len(c.steps) for c in convs) * len(policies), desc="frontier", disable=args.quiet)
    with torch.inference_mode():
        for conv in convs:
            run_conversation(setup.engine, conv, policies,
                             max_new_tokens=32 if conv.workload == "bench" else args.max_new_tokens,
                             bar=bar, out=records, skipped=skipped,
                             on_step=lambda: save(partial=True))
    bar.close()
    doc = save(partial=False)
    if args.plot:
        plot(doc, args.plot, beside)
    if not args.quiet:
        print(markdown(doc))
    return 0


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="python -m asymagent.evals.running.frontier", description=__doc__.splitlines()[0])
    add_arguments(_p)
    raise SystemExit(main(_p.parse_args()))
