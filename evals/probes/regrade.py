"""Re-grade stored eval JSONs with today's final-answer grader, without running a model.

    python -m asymagent.evals.probes.regrade docs/results/pair_frontier_test.json [more.json ...] [--json PATH]

Reads frontier runs (evals/running/frontier.py, records kept: each step's output text) and
teacher-forced eval runs (`asymagent eval --json`: `per_step` with each output), rebuilds each
stored step's judge from its workload, seed and step (the episodes are deterministic), and
re-grades the final-answer steps with evals/suites/answer_values.py. Tool-call steps keep their
stored verdict: their rule (same name, equal arguments) did not change. The rule before issue 52
(`_legacy_ok`: the suite's own key fact; for domain episodes, every word with digits as a
substring) is recomputed beside it, so a stored verdict it does not reproduce shows up as
`legacy_mismatch` rather than as a move.

Per file, workload and policy: step accuracy old -> new, "right where full right" old -> new
(the policy's accuracy on the steps full gets right, each under its own grader), and every step
whose verdict moved with the text it was given.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from asymagent.evals.probes.harness import command, finish, parser


def _legacy_ok(conv_workload: str, expected: str, env, text: str) -> bool:
    """The final-answer rule before issue 52 (frontier `_quotes_ok`, suites' `_answer_ok`)."""
    if conv_workload.startswith("domain:"):
        want = [w for w in re.findall(r"[\w.:/-]+", expected) if any(c.isdigit() for c in w)]
        return bool(want) and all(w.strip(".") in (text or "") for w in want)
    return bool(text) and env.key_fact_ok(text)


def _stored_output(text: str) -> tuple:
    """(tool_calls, text) of a frontier record's `text` (a call is stored as its function's JSON)."""
    try:
        d = json.loads(text)
    except (TypeError, ValueError):
        return None, text
    if isinstance(d, dict) and set(d) == {"name", "arguments"}:
        return [{"type": "function", "function": d}], ""
    return None, text


def _frontier_steps(doc: dict) -> dict:
    """{(workload, seed, step): (Step, expected final text or None, env or None)} of a frontier run."""
    from asymagent.evals.running.frontier import conversations
    from asymagent.evals.suites.environments import SUITES, make_env, oracle_episode

    s = doc.get("settings") or {}
    out = {}
    for w in dict.fromkeys(r["workload"] for r in doc["records"]):
        for conv in conversations(w, s.get("split", "test"), s.get("episodes", 1), s.get("max_steps"),
                                  s.get("bench_steps", 12), bool(s.get("exposed_only"))):
            env = None
            if w in SUITES:
                env = make_env(w)
                oracle_episode(env, conv.seed)
            for n, step in enumerate(conv.steps):
                out[(w, conv.seed, n)] = (step, env)
    return out


def _expected_text(w: str, seed: int, step) -> str:
    """The oracle's final answer after `step.history` (domain episodes: the next assistant turn)."""
    if not w.startswith("domain:"):
        return ""
    from asymagent.training.domains import domain_by_name
    from asymagent.training.long_episodes import long_episode

    messages, _ = long_episode(domain_by_name(w.split(":", 1)[1]), seed)
    return messages[len(step.history)]["content"] or ""


def regrade_frontier(doc: dict) -> tuple[list, list]:
    """(records with `correct` re-graded, moves) of a frontier run's JSON document."""
    steps = _frontier_steps(doc)
    records, moves = [], []
    for r in doc["records"]:
        step, env = steps[(r["workload"], r["seed"], r["step"])]
        new = dict(r)
        if step.final:
            calls, text = _stored_output(r["text"])
            new["correct"] = bool(step.judge(calls, text))
            legacy = not calls and _legacy_ok(r["workload"], _expected_text(r["workload"], r["seed"], step), env, text)
            if legacy != r["correct"] or new["correct"] != r["correct"]:
                moves.append({"workload": r["workload"], "seed": r["seed"], "step": r["step"], "policy": r["policy"],
                              "old": r["correct"], "new": new["correct"], "legacy_mismatch": legacy != r["correct"],
                              "text": r["text"]})
        records.append(new)
    return records, moves


def frontier_table(doc: dict, records: list) -> dict:
    """{workload (and 'suites pooled'): {policy: {steps, final_steps, accuracy old/new,
    right_where_full_right old/new}}}."""
    from asymagent.evals.running.frontier import Policy, Record, summarize

    fields = Record.__dataclass_fields__
    pols = [Policy(name, d.get("label", name)) for name, d in (doc["settings"]["policies"]).items()]
    old = [Record(**{k: v for k, v in r.items() if k in fields}) for r in doc["records"]]
    new = [Record(**{k: v for k, v in r.items() if k in fields}) for r in records]
    groups = {w: w for w in dict.fromkeys(r.workload for r in old)}
    steps = _frontier_steps(doc)
    final = {k for k, (step, _) in steps.items() if step.final}
    out = {}
    for name in list(groups) + ["suites pooled"]:
        keep = (lambda r: r.workload != "bench") if name == "suites pooled" else (lambda r, w=name: r.workload == w)
        a, b = summarize([r for r in old if keep(r)], pols), summarize([r for r in new if keep(r)], pols)
        out[name] = {p: {"steps": a[p]["steps"],
                         "accuracy": [a[p]["step_accuracy"], b[p]["step_accuracy"]],
                         "right_where_full_right": [a[p]["right_where_full_right"], b[p]["right_where_full_right"]],
                         "full_right_steps": [a[p]["full_right_steps"], b[p]["full_right_steps"]],
                         "final_steps": sum(1 for r in old if keep(r) and r.policy == p
                                            and (r.workload, r.seed, r.step) in final)}
                     for p in a}
    return out


def regrade_eval(doc: dict) -> tuple[dict, list]:
    """(table, moves) of an `asymagent eval --json` document: its per-step final answers re-graded."""
    from asymagent.evals.suites.environments import make_env

    moves, verdicts = [], {}
    for mode, rows in doc["per_step"].items():
        for row in rows:
            new_ok = row["correct"]
            if isinstance(row["oracle"], str):
                env = make_env(doc["suite"])
                env.reset(row["seed"])
                new_ok = isinstance(row["output"], str) and env.check_answer(row["output"])
                if new_ok != row["correct"]:
                    moves.append({"mode": mode, "seed": row["seed"], "step": row["step"], "old": row["correct"],
                                  "new": new_ok, "text": row["output"]})
            verdicts.setdefault(mode, {})[(row["seed"], row["step"])] = (bool(row["correct"]), bool(new_ok))
    table = {}
    full = verdicts.get("full", {})
    for mode, v in verdicts.items():
        acc = [sum(o for o, _ in v.values()) / len(v), sum(n for _, n in v.values()) / len(v)] if v else None
        rw = []
        for i in (0, 1):
            keys = [k for k in v if k in full and full[k][i]]
            rw.append(sum(v[k][i] for k in keys) / len(keys) if keys else None)
        table[mode] = {"steps": len(v), "final_steps": sum(isinstance(r["oracle"], str) for r in doc["per_step"][mode]),
                       "accuracy": acc, "right_where_full_right": rw}
    return {doc["suite"]: table}, moves


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list | None = None) -> int:
    p = parser(__doc__, "regrade")
    p.add_argument("paths", nargs="+", help="frontier or eval JSON documents")
    args = p.parse_args(argv)
    doc = {"command": command("regrade", argv), "files": {}}
    for path in args.paths:
        src = json.load(open(path))
        if "records" in src and src.get("records"):
            records, moves = regrade_frontier(src)
            table = frontier_table(src, records)
        elif "per_step" in src:
            table, moves = regrade_eval(src)
        else:
            doc["files"][Path(path).name] = {"note": "no per-step outputs stored: nothing to re-grade"}
            print(f"{path}: no per-step outputs stored")
            continue
        doc["files"][Path(path).name] = {"table": table, "moves": moves}
        print(f"\n{path}  ({len(moves)} verdicts moved or not reproduced)")
        print("| workload | policy | steps (final answers) | step acc old -> new | right where full right old -> new |")
        for w, pols in table.items():
            for name, d in pols.items():
                acc = d.get("accuracy") or [None, None]
                rw = d.get("right_where_full_right") or [None, None]
                print(f"| {w} | {name} | {d['steps']} ({d['final_steps']}) | {_fmt(acc[0])} -> {_fmt(acc[1])} | {_fmt(rw[0])} -> {_fmt(rw[1])} |")
        for m in moves:
            print("  moved:", json.dumps(m)[:300])
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
