"""Where the verifier's view cuts in AgentDojo, read off the tasks' own ground truth (no model).

Each user task ships the calls that solve it (`ground_truth`). Run through AgentDojo's
`GroundTruthPipeline` inside the harness's own pipeline head (its default system message, the
user's task), those calls give the tool outputs an agent that solves the task reads, rendered as
AgentDojo renders them. Converted as the harness converts them (messages.py), the default view
(or any CompressionConfig) is built at every point the model would be asked (after the user's
task, after each round of tool results), with a tokenizer only: per task, the outputs' token
lengths and the verifier's share of the context at each step. It picks the tasks of a sample
that exercise compression before any model runs (docs/evals.md, AgentDojo).

    python -m asymagent.evals.agentdojo.ground_truth --suites workspace,travel --tokenizer DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from asymagent.evals.agentdojo.messages import messages_to_openai, tools_to_openai
from asymagent.evals.agentdojo.tasks import BENCHMARK_VERSION, get_suite, pick_ids


@dataclass
class TaskViews:
    """One user task's ground-truth trajectory under one view."""

    suite: str
    user_task: str
    calls: list  # the ground truth's function names, in order
    output_tokens: list  # [n_calls] each tool output's length in tokens
    shares: list  # [n_steps] verifier view tokens / full view tokens at each model step
    full_tokens: int  # the full view at the last step (the answer's)
    verifier_tokens: int  # the verifier's view there

    @property
    def mean_share(self) -> float:
        return sum(self.shares) / len(self.shares)


def ground_truth_messages(suite, user_task) -> tuple:
    """(OpenAI messages, OpenAI tools) of `user_task`'s ground truth run on its environment."""
    from agentdojo.agent_pipeline import AgentPipeline, InitQuery, SystemMessage
    from agentdojo.agent_pipeline.agent_pipeline import load_system_message
    from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.logging import NullLogger

    env = user_task.init_environment(suite.load_and_inject_default_environment({}))
    runtime = FunctionsRuntime(suite.tools)
    pipeline = AgentPipeline([SystemMessage(load_system_message(None)), InitQuery(), GroundTruthPipeline(user_task)])
    with NullLogger():
        _, _, _, messages, _ = pipeline.query(user_task.PROMPT, runtime, env)
    return messages_to_openai(messages), tools_to_openai(runtime)


def step_points(messages: list) -> list:
    """Prefix lengths at which the model is asked: after the user's message, after each run of tool results."""
    return [i + 1 for i, m in enumerate(messages)
            if m["role"] == "user" or (m["role"] == "tool" and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool"))]


def task_views(suite_name: str, user_task_id: str, tokenizer, compression=None,
               version: str = BENCHMARK_VERSION) -> TaskViews:
    """The view along one task's ground truth (module docstring); `compression` as ContextViews takes it."""
    from asymagent.context.views import ContextViews

    suite = get_suite(suite_name, version)
    messages, tools = ground_truth_messages(suite, suite.get_user_task_by_id(user_task_id))
    views = ContextViews(tokenizer, compression)  # one conversation, built append-stably step by step
    shares, pair = [], None
    for end in step_points(messages):
        pair = views.build(messages[:end], tools)
        shares.append(pair.compression_ratio)
    return TaskViews(suite_name, user_task_id,
                     calls=[c["function"]["name"] for m in messages for c in m.get("tool_calls") or []],
                     output_tokens=[len(tokenizer(m["content"])["input_ids"]) for m in messages if m["role"] == "tool"],
                     shares=shares, full_tokens=pair.full_context_tokens, verifier_tokens=pair.verifier_context_tokens)


def survey(suite_name: str, tokenizer, compression=None, user_tasks: str | None = None,
           version: str = BENCHMARK_VERSION) -> list:
    """TaskViews of every (or each named) user task of a suite, in task order."""
    suite = get_suite(suite_name, version)
    return [task_views(suite_name, t, tokenizer, compression, version)
            for t in pick_ids(suite.user_tasks, user_tasks, "user_task")]


def suite_summary(rows: list) -> dict:
    """Per suite: tasks, the longest output, the view's share at the answer (min, median), and the
    tasks whose share at the answer is under 0.9 (where the view cuts a tenth of the context or more)."""
    out: dict = {}
    for suite in dict.fromkeys(r.suite for r in rows):
        mine = [r for r in rows if r.suite == suite]
        last = sorted(r.shares[-1] for r in mine)
        out[suite] = {"tasks": len(mine), "max_output_tokens": max((t for r in mine for t in r.output_tokens), default=0),
                      "min_share_at_answer": last[0], "median_share_at_answer": last[len(last) // 2],
                      "cut_below_0_9": [r.user_task for r in mine if r.shares[-1] < 0.9]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suites", default="workspace,travel,banking,slack")
    p.add_argument("--user-tasks", default=None, help="comma list (default all)")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder, .gguf file or cached HF id")
    p.add_argument("--compression", default=None, help="a CompressionConfig file or preset name (default view)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from asymagent.evals.probes.harness import compression_config, load_tokenizer

    compression = compression_config(args.compression) if args.compression else None
    tok = load_tokenizer(args.tokenizer)
    rows = [r for s in args.suites.split(",") if s.strip()
            for r in survey(s.strip(), tok, compression, args.user_tasks)]
    for r in rows:
        print(f"{r.suite:9s} {r.user_task:13s} outputs {r.output_tokens} share at the answer "
              f"{r.shares[-1]:.2f}, mean over {len(r.shares)} steps {r.mean_share:.2f}  {r.calls}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokenizer": args.tokenizer, "compression": args.compression or "default",
                       "benchmark_version": BENCHMARK_VERSION, "suites": suite_summary(rows),
                       "tasks": {f"{r.suite}/{r.user_task}": {**asdict(r), "mean_share": r.mean_share} for r in rows}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
