"""`asymagent eval SUITE`: run a long-horizon suite (or a traces JSONL) per mode; JSON + report.

    asymagent eval records --modes full,compressed,spec,asym --episodes 2 --json out.json --report runs/rep
    asymagent eval injection --episodes 4          # adds asym:acceptance=cda and asym:acceptance=cda,strict_prefix=16
    asymagent eval my_traces.jsonl --modes full,asym
    asymagent eval fusion --split test --episodes 3 --json f.json --report runs/fusion   # evals/fusion.py

Seeds: `--split dev` (default) takes the first N dev seeds, `--split test` the first N held-out
test seeds (report numbers only; never tune on them), `--seeds 3,5` exact seeds.
"""

from __future__ import annotations

import argparse
import json
import time

from asymagent.evals.environments import pick_seeds  # noqa: F401  (seed choice shared with eval fusion)

DEFAULT_MODES = "full,compressed,spec,asym"
# the relaxed (paper) gate, with and without strict acceptance for the first 16 tokens: the
# default gate (greedy) cannot accept a token the fused target would not emit
INJECTION_EXTRA = "asym:acceptance=cda,asym:acceptance=cda,strict_prefix=16"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="records | fs_audit | tickets | injection | PATH.jsonl (user traces) | "
                                 "fusion (delta-fusion token by token, evals/fusion.py)")
    p.add_argument("--modes", default=None,
                   help=f"comma list (default {DEFAULT_MODES}; injection adds {INJECTION_EXTRA}); "
                        "labels may carry SpecConfig overrides, e.g. asym:k=4,beta=0.5")
    p.add_argument("--episodes", type=int, default=1, help="episodes (seeds) per suite")
    p.add_argument("--split", choices=("dev", "test"), default="dev")
    p.add_argument("--seeds", default=None, help="comma list of exact seeds (overrides --split/--episodes)")
    p.add_argument("--max-steps", type=int, default=None, help="cap teacher-forced steps per episode")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--no-free-running", action="store_true", help="teacher-forced scoring only")
    p.add_argument("--no-teacher-forced", action="store_true", help="free-running only (task success)")
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--report", metavar="DIR", help="write report.md + PNG plots here")
    p.add_argument("--verifier", default="default")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: the shipped one)")
    p.add_argument("--compression", metavar="FILE", default=None,
                   help="CompressionConfig YAML/JSON for the verifier's view (default: tool_output 64/32)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--suites", default=None, help="eval fusion only: suites to measure (default all + domain:parcels)")
    p.add_argument("--variants", default="beta=1", help="eval fusion only: ';'-separated fusion variants")


def run_eval(engine, suite: str, labels: list, seeds: list, *, max_steps=None, max_new_tokens: int = 96,
             free: bool = True, forced: bool = True, progress: bool = True) -> dict:
    """{"suite", "seeds", "modes": {label: summary}} for a suite name or a traces path."""
    from asymagent.evals import runner
    from asymagent.evals.environments import SUITES

    if suite.endswith(".jsonl"):
        from asymagent.evals.traces import load_traces

        results = runner.run_traces(engine, load_traces(suite), labels, max_new_tokens=max_new_tokens,
                                    progress=progress)
        seeds = []
    elif suite in SUITES:
        if not (free or forced):
            raise ValueError("nothing to run: both teacher-forced and free-running scoring are off")
        results = {}
        if forced:
            runner.teacher_forced(engine, suite, seeds, labels, max_new_tokens=max_new_tokens,
                                  max_steps=max_steps, results=results, progress=progress)
        if free:
            runner.free_running(engine, suite, seeds, labels, max_new_tokens=max_new_tokens,
                                results=results, progress=progress)
    else:
        raise ValueError(f"unknown suite {suite!r}; use one of {', '.join(SUITES)} or a .jsonl trace file")
    return {"suite": suite, "seeds": seeds, "modes": {k: v.summary() for k, v in results.items()},
            "per_step": {k: [s.to_dict() for s in v.steps] for k, v in results.items()}}


def main(args) -> int:
    if args.suite == "fusion":
        from asymagent.evals import fusion

        args.suites = args.suites or fusion.DEFAULT_SUITES
        return fusion.main(args)
    from asymagent.evals.engine_setup import build_engine
    from asymagent.evals.environments import is_test_seed

    modes = args.modes or (DEFAULT_MODES + ("," + INJECTION_EXTRA if args.suite == "injection" else ""))
    from asymagent.evals.runner import parse_mode, split_mode_labels

    labels = split_mode_labels(modes)
    seeds = pick_seeds(args.split, args.episodes, args.seeds)

    for label in labels:
        parse_mode(label)  # fail on a bad label before loading models
    t0 = time.perf_counter()
    compression = None
    if args.compression:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig.from_file(args.compression)
    setup = build_engine(args.verifier, args.drafter, compression=compression)
    result = run_eval(setup.engine, args.suite, labels, seeds, max_steps=args.max_steps,
                      max_new_tokens=args.max_new_tokens, free=not args.no_free_running,
                      forced=not args.no_teacher_forced, progress=not args.quiet)
    result.update(verifier=setup.verifier, drafter=setup.drafter, drafter_fallback=setup.fallback,
                  split="test" if seeds and all(is_test_seed(s) for s in seeds) else "dev",
                  settings={"max_new_tokens": args.max_new_tokens, "max_steps": args.max_steps,
                            "free_running": not args.no_free_running,
                            "teacher_forced": not args.no_teacher_forced, "spec": setup.engine.spec.to_dict(),
                            "total_wall_s": time.perf_counter() - t0})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    if args.report:
        from asymagent.evals.report import write_eval_report

        print(write_eval_report(result, args.report))
    if not args.quiet:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"asymagent eval {args.suite} ({result['split']} seeds {seeds})")
        for col in ("mode", "task success", "step acc", "fidelity", "s", "accept", "attack"):
            table.add_column(col)
        for label, d in result["modes"].items():
            table.add_row(label, _f(d["task_success"]), _f(d["step_accuracy"]), _f(d["fidelity_vs_full"]),
                          _f(d["wall_s"]), _f(d["acceptance_rate"]) if d["drafted"] else "-",
                          _f(d.get("attack_success_rate")))
        Console().print(table)
        print(f"drafter: {setup.drafter}")
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"
