"""`asymagent eval agentdojo`: run AgentDojo episodes locally or on Ray, stream them to an episode log, merge.

    asymagent eval agentdojo --suites banking --user-tasks 0,1,2 --modes full,asym --pair qwen2.5-coder \\
        --attacks none,important_instructions --injection-tasks 0 --json runs/dojo.json --report runs/dojo
    asymagent eval agentdojo --suites banking,slack --ray --json runs/dojo.json --resume

In-process: each mode is an AgentDojo pipeline element calling `Engine.chat` in this process
(responder.py), not AgentDojo's OpenAI-compatible client against `asymagent serve`, because (1)
that client (`LocalLLM`) prompts its own `<function=...>` call format instead of the model's
own and turns any request error into an empty answer, (2) the per-step StepStats (acceptance,
accepted length, the verifier's share of the context) stay in hand rather than behind HTTP, and
(3) the teacher-forced fidelity pass needs the same engine on the same histories. The server path
is still open to anyone: AgentDojo's `OpenAILLM` against `asymagent serve` is a plain OpenAI
client (docs/serving.md).

Work unit: one episode (a key, tasks.py) with every mode, like a suite seed in `asymagent eval`;
the episode log and `--resume`, and `--ray` (evals/running/ray_eval.py with `DojoWorker`) are
the suites' own.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from asymagent.evals.agentdojo.episode import ordered, run_dojo_episode
from asymagent.evals.agentdojo.tasks import DojoPlan
from asymagent.evals.running.ray_eval import EpisodeWorker, run_logged

DEFAULT_MODES = "full,spec,asym"
DEFAULT_MAX_NEW_TOKENS = 256


class DojoWorker(EpisodeWorker):
    """A Ray actor body (evals/running/ray_eval.py `worker_cls`): one engine, AgentDojo episodes."""

    episode = staticmethod(run_dojo_episode)


def run_local(engine, plan: DojoPlan, keys: list, *, engine_info=None, log=None, progress: bool = True) -> dict:
    """The episodes of `keys` not already in `log`, one after another on `engine`; {key: record}."""
    import torch
    from tqdm.auto import tqdm

    done = dict(log.done) if log is not None else {}
    todo = [k for k in keys if k not in done]
    with tqdm(total=len(keys), initial=len(keys) - len(todo), desc="agentdojo", unit="ep",
              disable=not progress) as bar, torch.inference_mode():
        for key in todo:
            record = run_dojo_episode(engine, plan, key, engine_info)
            if log is not None:
                log.append(record)
            done[key] = record
            bar.update(1)
    return {k: done[k] for k in keys}


def evaluate_dojo(spec, plan: DojoPlan, keys: list, *, ray: bool = False, address: str | None = None,
                  workers: int | None = None, worker_cpus: float = 1, jsonl: str | None = None,
                  resume: bool = False, progress: bool = True) -> dict:
    """The run's JSON (summary.py) for an EngineSpec: locally, or on Ray actors (`ray=True`)."""
    from asymagent.evals.agentdojo.summary import dojo_result

    t0 = time.perf_counter()

    def local(engine, engine_info, log):
        return run_local(engine, plan, keys, engine_info=engine_info, log=log, progress=progress)

    records, resumed, ray_settings = run_logged(
        spec, plan, keys, log_key={"benchmark": "agentdojo", **asdict(plan), "engine": asdict(spec)},
        run_local=local, label="eval agentdojo", jsonl=jsonl, resume=resume, ray=ray, address=address,
        workers=workers, worker_cpus=worker_cpus, progress=progress, worker_cls=DojoWorker)
    result = dojo_result(plan, keys, records)
    result["settings"].update(ray=ray_settings, resumed_episodes=resumed, total_wall_s=time.perf_counter() - t0)
    return result


def plan_of(args) -> DojoPlan:
    from asymagent.evals.running.runner import split_mode_labels

    labels = split_mode_labels(args.modes if args.modes is not None else DEFAULT_MODES)
    if not labels:
        raise ValueError(f"--modes {args.modes!r} names no mode; give e.g. full,asym")
    return DojoPlan(tuple(ordered(labels)), args.benchmark_version, args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                    args.max_iters, not args.no_fidelity)


def keys_of(args) -> list:
    from asymagent.evals.agentdojo.tasks import episode_keys

    suites = [s.strip() for s in (args.suites or "banking").split(",") if s.strip()]
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    return episode_keys(suites, attacks, user_tasks=args.user_tasks, injection_tasks=args.injection_tasks,
                        max_user_tasks=args.max_user_tasks, version=args.benchmark_version,
                        attacked_user_tasks=getattr(args, "attacked_user_tasks", None))


def check_args(args) -> None:
    """Refuse mistakes before any model loads: agentdojo installed, modes, tasks, attacks, numbers."""
    from asymagent.evals.agentdojo.responder import check_label

    try:
        import agentdojo  # noqa: F401
    except ImportError:
        raise ValueError("eval agentdojo needs AgentDojo, which is not installed: "
                         "pip install 'asymagent[agentdojo]'") from None
    plan = plan_of(args)
    for label in plan.labels:
        check_label(label)
    if not keys_of(args):
        raise ValueError("no AgentDojo episode selected (check --suites, --user-tasks, --attacks)")
    if plan.max_new_tokens < 1 or plan.max_iters < 1:
        raise ValueError("--max-new-tokens and --max-iters must be >= 1")
    if plan.fidelity and "full" not in plan.labels:
        raise ValueError("step fidelity is measured along mode full's trajectory: add full to --modes "
                         "or pass --no-fidelity")


def main(args, jsonl: str | None = None) -> int:
    """The verb (evals/running/cli.py hands it the episode log path, `log_path`)."""
    from asymagent.evals.running.engine_setup import EngineSpec

    check_args(args)
    compression = None
    if args.compression:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig.from_file(args.compression).model_dump(mode="json")
    spec = EngineSpec(args.verifier, args.drafter, compression, dtype=args.dtype)
    result = evaluate_dojo(spec, plan_of(args), keys_of(args), ray=args.ray is not None, address=args.ray or None,
                           workers=args.workers, worker_cpus=args.worker_cpus, jsonl=jsonl,
                           resume=args.resume, progress=not args.quiet)
    from asymagent.evals.agentdojo.report import markdown, write_report

    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    if args.report:
        print(write_report(result, args.report))
    if not args.quiet:
        print(markdown(result))
    return 0
