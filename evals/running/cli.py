"""`asymagent eval SUITE`: run a long-horizon suite (or a traces JSONL) per mode; JSON + report.

    asymagent eval records --modes full,compressed,spec,asym --episodes 2 --json out.json --report runs/rep
    asymagent eval injection --episodes 4          # adds asym:acceptance=cda and asym:acceptance=cda,strict_prefix=16
    asymagent eval my_traces.jsonl --modes full,asym
    asymagent eval records --modes full --tool-choice auto --no-free-running   # tool steps as agent frameworks ask
    asymagent eval fusion --split test --episodes 3 --json f.json --report runs/fusion   # evals/running/fusion.py
    asymagent eval agentdojo --suites banking --user-tasks 0,1 --modes full,asym --attacks none,important_instructions
                                                   # AgentDojo's suites and scoring (evals/agentdojo/, pip install 'asymagent[agentdojo]')
    asymagent eval records --episodes 40 --ray --json runs/r.json      # local Ray, one actor per CPU
    asymagent eval records --episodes 500 --ray auto --json runs/r.json --resume   # a cluster

Seeds: `--split dev` (default) takes the first N dev seeds, `--split test` the first N held-out
test seeds (report numbers only; never tune on them), `--seeds 3,5` exact seeds.

Suites run episode by episode (evals/running/episodes.py), locally or on Ray actors (evals/running/ray_eval.py);
either way the same JSON comes out. `--jsonl` streams finished episodes to an episode log
(evals/running/episode_log.py) and `--resume` skips the episodes already in it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from asymagent.evals.suites.environments import TOOL_CHOICES, pick_seeds  # noqa: F401  (pick_seeds shared with eval fusion)

DEFAULT_MODES = "full,compressed,spec,asym"
# the relaxed (paper) gate, with and without strict acceptance for the first 16 tokens: the
# default gate (greedy) cannot accept a token the fused target would not emit
INJECTION_EXTRA = "asym:acceptance=cda,asym:acceptance=cda,strict_prefix=16"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="records | fs_audit | tickets | injection | dispatch (held out: --split test) | PATH.jsonl or DIR (user traces) | "
                                 "fusion (delta-fusion token by token, evals/running/fusion.py) | "
                                 "agentdojo (AgentDojo's suites, evals/agentdojo/)")
    p.add_argument("--modes", default=None,
                   help=f"comma list (default {DEFAULT_MODES}; injection adds {INJECTION_EXTRA}); "
                        "labels may carry SpecConfig overrides, e.g. asym:k=4,beta=0.5")
    p.add_argument("--episodes", type=int, default=1, help="episodes (seeds) per suite")
    p.add_argument("--split", choices=("dev", "test"), default="dev")
    p.add_argument("--seeds", default=None, help="comma list of exact seeds (overrides --split/--episodes)")
    p.add_argument("--max-steps", type=int, default=None, help="cap teacher-forced steps per episode")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="per model turn (default 96; eval agentdojo 256)")
    p.add_argument("--no-free-running", action="store_true", help="teacher-forced scoring only")
    p.add_argument("--no-teacher-forced", action="store_true", help="free-running only (task success)")
    p.add_argument("--tool-choice", choices=TOOL_CHOICES, default="suite",
                   help="what teacher-forced tool steps ask for: the suite's own (default: required; "
                        "auto on the injection suites), auto (the model may answer in text: counted "
                        "as text_at_tool_steps) or required; the final answer step is always auto")
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--report", metavar="DIR", help="write report.md + PNG plots here")
    p.add_argument("--verifier", default="default", help="'default', a model source, or pair:NAME")
    p.add_argument("--pair", dest="verifier", type=lambda name: "pair:" + name, metavar="NAME",
                   help="a named verifier + drafter pair (as --verifier pair:NAME): 'qwen2.5-coder' "
                        "(`make setup-pair`; docs/pair.md)")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: the shipped one)")
    p.add_argument("--compression", metavar="FILE", default=None,
                   help="CompressionConfig YAML/JSON for the verifier's view (default: tool_output 64/32)")
    p.add_argument("--dtype", default="auto",
                   help="weights dtype of verifier and drafter (asymagent/modeling/cpu_dtype.py names: auto, "
                        "float32, bfloat16, int8, int8w, int4w, ...)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--suites", default=None, help="eval fusion: suites to measure (default all + domain:parcels); "
                                                  "eval agentdojo: workspace,travel,banking,slack (default banking)")
    p.add_argument("--variants", default="beta=1", help="eval fusion only: ';'-separated fusion variants")
    add_agentdojo_arguments(p)
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run episodes on Ray actors: no ADDRESS starts a local Ray on this machine, "
                        "`auto` or HOST:PORT or ray://HOST:10001 joins a cluster (pip install 'asymagent[ray]')")
    p.add_argument("--workers", type=int, default=None,
                   help="Ray actors, each loading the engine once (default: cluster CPUs / --worker-cpus)")
    p.add_argument("--worker-cpus", type=float, default=1, help="CPUs (and torch threads) per Ray actor")
    p.add_argument("--concurrency", type=int, default=1,
                   help="suite episodes run at once in this process, their forwards batched (continuous "
                        "batching; the same tokens as one at a time, timings of shared forwards)")
    p.add_argument("--jsonl", metavar="PATH", default=None,
                   help="episode log: each finished episode is appended here (default with --ray and --json: "
                        "JSON path with .episodes.jsonl)")
    p.add_argument("--resume", action="store_true",
                   help="keep the episodes already in the episode log and run only the missing ones")


def add_agentdojo_arguments(p: argparse.ArgumentParser) -> None:
    """The flags only `eval agentdojo` reads (evals/agentdojo/run.py)."""
    p.add_argument("--user-tasks", default=None, metavar="IDS",
                   help="eval agentdojo: comma list of user tasks (user_task_3 or 3; default all)")
    p.add_argument("--max-user-tasks", type=int, default=None, metavar="N",
                   help="eval agentdojo: the first N user tasks of each suite (a stated sample)")
    p.add_argument("--injection-tasks", default=None, metavar="IDS",
                   help="eval agentdojo: comma list of injection tasks run under each attack (default all)")
    p.add_argument("--attacked-user-tasks", default=None, metavar="IDS",
                   help="eval agentdojo: run the attacks on these of the selected user tasks only "
                        "(default: every one); the others run without attack")
    p.add_argument("--attacks", default="none",
                   help="eval agentdojo: comma list of AgentDojo attacks, `none` for no attack "
                        "(e.g. none,important_instructions,tool_knowledge)")
    p.add_argument("--benchmark-version", default="v1.2.2", help="eval agentdojo: AgentDojo's task version")
    p.add_argument("--max-iters", type=int, default=15,
                   help="eval agentdojo: tool rounds per episode (AgentDojo's loop default)")
    p.add_argument("--no-fidelity", action="store_true",
                   help="eval agentdojo: skip step fidelity along full's trajectory")


def resolve_defaults(args) -> None:
    """Defaults that depend on the suite: --max-new-tokens 96 (eval agentdojo: 256)."""
    if getattr(args, "max_new_tokens", 0) is None and args.suite != "agentdojo":
        args.max_new_tokens = 96


def mode_labels(args) -> list:
    """The mode labels to run: --modes, or the defaults (plus the gate variants for injection)."""
    from asymagent.evals.running.runner import split_mode_labels

    if args.modes is not None:  # given, even empty: never the defaults in its place
        labels = split_mode_labels(args.modes)
        if not labels:
            raise ValueError(f"--modes {args.modes!r} names no mode; give e.g. full,asym "
                             "(leave --modes out for the defaults)")
        return labels
    return split_mode_labels(DEFAULT_MODES + ("," + INJECTION_EXTRA if args.suite == "injection" else ""))


def check_args(args) -> None:
    """Refuse mistakes before any model loads (`asymagent` prints them on one line, exit 2)."""
    import os

    from asymagent.evals.suites.environments import SUITES
    from asymagent.evals.running.runner import parse_mode
    from asymagent.modeling.loading import check_drafter_source
    from asymagent.modeling.cpu_dtype import resolve_dtype
    from asymagent.modeling.pairs import check_model_source

    resolve_dtype(getattr(args, "dtype", "auto"))  # an unknown --dtype name, before any model loads
    resolve_defaults(args)
    if args.suite == "agentdojo":
        from asymagent.evals.agentdojo.run import check_args as check_agentdojo

        check_model_source(args.verifier)
        if args.drafter:
            check_drafter_source(args.drafter)
        check_episode_args(args)
        return check_agentdojo(args)
    if args.suite.endswith(".jsonl") or os.path.isdir(args.suite):
        if not (os.path.isfile(args.suite) or os.path.isdir(args.suite)):
            raise FileNotFoundError(f"trace file not found: {args.suite}")
        from asymagent.evals.suites.traces import load_traces

        load_traces(args.suite)  # a ValueError naming the file and line of a bad trace
    elif args.suite not in SUITES and args.suite != "fusion":
        raise ValueError(f"unknown suite {args.suite!r}; use one of {', '.join(SUITES)}, fusion or a "
                         ".jsonl trace file")
    if args.suite != "fusion":  # eval fusion reads --suites/--variants, not --modes
        for label in mode_labels(args):
            parse_mode(label)
    from asymagent.evals.suites.environments import check_held_out

    check_held_out(args.suite, pick_seeds(args.split, args.episodes, args.seeds))
    if args.no_free_running and args.no_teacher_forced:
        raise ValueError("nothing to run: both --no-free-running and --no-teacher-forced are set")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.compression:
        from asymagent.context.views import CompressionConfig

        CompressionConfig.from_file(args.compression)
    check_model_source(args.verifier)
    if args.drafter:
        check_drafter_source(args.drafter)
    check_episode_args(args)


def check_episode_args(args) -> None:
    """--ray / --workers / --jsonl / --resume: suites only, sane numbers, Ray installed."""
    from asymagent.evals.suites.environments import SUITES

    if args.suite not in SUITES and args.suite != "agentdojo" and (args.ray is not None or args.jsonl or args.resume):
        raise ValueError("--ray, --jsonl and --resume run suite episodes; use them with "
                         f"{', '.join(SUITES)}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if getattr(args, "concurrency", 1) < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.worker_cpus <= 0:
        raise ValueError(f"--worker-cpus must be > 0, got {args.worker_cpus}")
    if args.resume and not log_path(args):
        raise ValueError("--resume needs the episode log: give --jsonl PATH (or --json with --ray)")
    if args.ray is not None:
        from asymagent.evals.running.ray_eval import RayMissing, import_ray

        try:
            import_ray()
        except RayMissing as exc:
            raise ValueError(str(exc)) from None


def log_path(args) -> str | None:
    """--jsonl, or with --ray and --json the JSON path with .episodes.jsonl."""
    if args.jsonl is None and args.ray is not None and args.json:
        return str(Path(args.json).with_suffix(".episodes.jsonl"))
    return args.jsonl


def run_eval(engine, suite: str, labels: list, seeds: list, *, max_steps=None, max_new_tokens: int = 96,
             free: bool = True, forced: bool = True, progress: bool = True,
             tool_choice: str = "suite") -> dict:
    """{"suite", "seeds", "modes": {label: summary}, "per_step"} for a suite name or a traces path,
    on an engine already built (locally, no episode log). `tool_choice`: what teacher-forced tool
    steps ask for (runner.step_tool_choice)."""
    from asymagent.evals.running import runner
    from asymagent.evals.suites.environments import SUITES

    if suite.endswith(".jsonl") or Path(suite).is_dir():  # a trace file or a capture directory
        from asymagent.evals.suites.traces import load_traces

        examples = load_traces(suite)
        results = runner.run_traces(engine, examples, labels, max_new_tokens=max_new_tokens,
                                    progress=progress, tool_choice=tool_choice)
        return {"suite": suite, "seeds": [], "trace_ids": [ex.id for ex in examples],
                "modes": {k: v.summary() for k, v in results.items()},
                "per_step": {k: [s.to_dict() for s in v.steps] for k, v in results.items()}}
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; use one of {', '.join(SUITES)} or a .jsonl trace file")
    from asymagent.evals.running.episodes import EpisodePlan, eval_result, run_episodes_local

    plan = EpisodePlan(suite, tuple(labels), max_steps, max_new_tokens, forced, free, tool_choice)
    result = eval_result(plan, seeds, run_episodes_local(engine, plan, seeds, progress=progress))
    return {k: result[k] for k in ("suite", "seeds", "modes", "per_step")}


def evaluate(spec, suite: str, labels: list, seeds: list, *, max_steps=None, max_new_tokens: int = 96,
             free: bool = True, forced: bool = True, ray: bool = False, address: str | None = None,
             workers: int | None = None, worker_cpus: float = 1, jsonl: str | None = None,
             resume: bool = False, progress: bool = True, concurrency: int = 1,
             tool_choice: str = "suite") -> dict:
    """The whole eval JSON (docs/architecture.md §6) for an EngineSpec: locally (one engine in
    this process) or with `ray=True` on Ray actors (`address` None: a local Ray). `jsonl`: the
    episode log to stream episodes into; `resume`: keep the episodes already there.
    `tool_choice`: what teacher-forced tool steps ask for (suite | auto | required)."""
    from asymagent.evals.suites.environments import SUITES
    from asymagent.evals.running.runner import parse_mode

    t0 = time.perf_counter()
    for label in labels:
        parse_mode(label)  # fail on a bad label before loading models
    if suite not in SUITES:
        if ray or jsonl or resume:
            raise ValueError("--ray, --jsonl and --resume work on suite episodes; score trace files without them")
        setup = spec.build()
        setup.announce("eval")
        result = run_eval(setup.engine, suite, labels, seeds, max_steps=max_steps,
                          max_new_tokens=max_new_tokens, free=free, forced=forced, progress=progress,
                          tool_choice=tool_choice)
        result.update(verifier=setup.verifier, drafter=setup.drafter, drafter_fallback=setup.fallback,
                      split="dev", settings={"max_new_tokens": max_new_tokens, "max_steps": max_steps,
                                             "free_running": free, "teacher_forced": forced,
                                             "tool_choice": tool_choice,
                                             "spec": setup.engine.spec.to_dict()})
    else:
        from dataclasses import asdict

        from asymagent.evals.running.episodes import EpisodePlan, eval_result, run_episodes_local
        from asymagent.evals.running.ray_eval import run_logged

        plan = EpisodePlan(suite, tuple(labels), max_steps, max_new_tokens, forced, free, tool_choice)

        def local(engine, engine_info, log):
            return run_episodes_local(engine, plan, seeds, engine_info=engine_info, log=log,
                                      progress=progress, concurrency=concurrency)

        records, resumed, ray_settings = run_logged(
            spec, plan, seeds, log_key={**plan.log_key(), "engine": asdict(spec)}, run_local=local,
            label="eval", jsonl=jsonl, resume=resume, ray=ray, address=address, workers=workers,
            worker_cpus=worker_cpus, progress=progress)
        result = eval_result(plan, seeds, records)
        result["settings"].update(ray=ray_settings, resumed_episodes=resumed)
    result["settings"]["total_wall_s"] = time.perf_counter() - t0
    return result


def main(args) -> int:
    resolve_defaults(args)
    if args.suite == "agentdojo":
        from asymagent.evals.agentdojo.run import main as agentdojo_main

        return agentdojo_main(args, jsonl=log_path(args))
    if args.suite == "fusion":
        from asymagent.evals.running import fusion

        args.suites = args.suites or fusion.DEFAULT_SUITES
        return fusion.main(args)
    from asymagent.evals.running.engine_setup import EngineSpec

    labels = mode_labels(args)
    seeds = pick_seeds(args.split, args.episodes, args.seeds)
    compression = None
    if args.compression:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig.from_file(args.compression).model_dump(mode="json")
    spec = EngineSpec(args.verifier, args.drafter, compression, dtype=args.dtype)
    result = evaluate(spec, args.suite, labels, seeds, max_steps=args.max_steps,
                      max_new_tokens=args.max_new_tokens, free=not args.no_free_running,
                      forced=not args.no_teacher_forced, ray=args.ray is not None, address=args.ray or None,
                      workers=args.workers, worker_cpus=args.worker_cpus, jsonl=log_path(args),
                      resume=args.resume, progress=not args.quiet,
                      concurrency=getattr(args, "concurrency", 1),
                      tool_choice=getattr(args, "tool_choice", "suite"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    if args.report:
        from asymagent.evals.bench.report import write_eval_report

        print(write_eval_report(result, args.report))
    if not args.quiet:
        from rich.console import Console
        from rich.table import Table

        for table in summary_tables(result):
            Console().print(table)
        print(f"drafter: {result['drafter']}")
    return 0


def summary_tables(result: dict) -> list:
    """The terminal tables of an eval: one row per mode with the columns that apply (task
    success with free-running episodes, attack success on the injection suite); on user traces
    a second table, one row per trace id, saying which modes matched its expected message."""
    from rich.table import Table

    modes = result["modes"]
    trace_ids = result.get("trace_ids")
    where = (f"{len(trace_ids)} trace steps" if trace_ids is not None
             else f"{result['split']} seeds {result['seeds']}")
    columns = [("mode", lambda d: d["mode"])]
    if any(d["task_success"] is not None for d in modes.values()):
        columns.append(("task success", lambda d: _f(d["task_success"])))
    columns += [("step acc", lambda d: _f(d["step_accuracy"])),
                ("fidelity", lambda d: _f(d["fidelity_vs_full"])), ("s", lambda d: _f(d["wall_s"])),
                ("accept", lambda d: _f(d["acceptance_rate"]) if d["drafted"] else "-")]
    if any("attack_success_rate" in d for d in modes.values()):
        columns.append(("attack", lambda d: _f(d.get("attack_success_rate"))))
    table = Table(title=f"asymagent eval {result['suite']} ({where})")
    for name, _ in columns:
        table.add_column(name)
    for d in modes.values():
        table.add_row(*(cell(d) for _, cell in columns))
    tables = [table]
    if trace_ids is not None:
        per_trace = Table(title="per trace step: matches the expected message")
        per_trace.add_column("trace id")
        for label in modes:
            per_trace.add_column(label)
        for i, trace_id in enumerate(trace_ids):
            per_trace.add_row(trace_id, *("yes" if modes[m]["per_step_correct"][i] else "no"
                                          for m in modes))
        tables.append(per_trace)
    return tables


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"
