"""A recorded AgentDojo episode replayed without a model: the histories its steps saw and what the verifier's view cut of them.

An episode record keeps each step's action (its calls with parsed arguments, or its text), not
the tool outputs. AgentDojo's tools are deterministic, so replaying the actions through the
harness's own pipeline (pipeline.run_free with a scripted responder, the same attack's
injections) gives back the histories the model saw, and the view (ContextViews, a tokenizer
only) shows what the verifier read of each tool output. Used to read why a mode's answer
differs from full's (docs/evals.md, AgentDojo):

    python -m asymagent.evals.agentdojo.replay runs/x.episodes.jsonl workspace/user_task_26/none \\
        --mode full --tokenizer DIR [--show list_files] [--compression PRESET_OR_FILE]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from asymagent.evals.agentdojo.pipeline import run_free
from asymagent.evals.agentdojo.responder import Turn
from asymagent.evals.agentdojo.tasks import BENCHMARK_VERSION, load_episode


class ActionScript:
    """A responder playing recorded step actions in order (the last one repeats if the episode goes on)."""

    def __init__(self, actions: list) -> None:
        self.actions = actions
        self.n = 0

    def reset(self) -> None:
        self.n = 0

    def __call__(self, messages: list, tools: list) -> Turn:
        action = self.actions[min(self.n, len(self.actions) - 1)]
        self.n += 1
        if isinstance(action, str):
            return Turn(action)
        calls = [{"id": f"replay_{self.n}_{i}", "type": "function",
                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])
                               if not isinstance(c["arguments"], str) else c["arguments"]}}
                 for i, c in enumerate(action["calls"])]
        return Turn("", calls)


def replay(key: str, actions: list, version: str = BENCHMARK_VERSION, max_iters: int = 15) -> tuple:
    """(episode dict, [StepLog]) of `actions` replayed on episode `key` (module docstring)."""
    suite, user_task, injection_task, injections = load_episode(key, version)
    return run_free(suite, user_task, injection_task, injections, ActionScript(actions), max_iters=max_iters)


@dataclass
class CutOutput:
    """One tool output of a history: whole, and as the verifier's view shows it."""

    index: int  # position in the history
    name: str  # the tool
    full: str
    view: str
    full_tokens: int
    view_tokens: int


def cut_outputs(history: list, tools: list, tokenizer, compression=None) -> list:
    """Each tool output of `history` whole and in the verifier's view (`compression` as ContextViews takes it)."""
    from asymagent.context.views import ContextViews

    views = ContextViews(tokenizer, compression)
    shown = views.compress_messages(history, tools).messages

    def count(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    return [CutOutput(i, m.get("name", ""), m["content"], v["content"], count(m["content"]), count(v["content"]))
            for i, (m, v) in enumerate(zip(history, shown)) if m["role"] == "tool"]


def recorded_actions(log_path: str, key: str, mode: str) -> list:
    """The free-running step actions of `mode` in episode `key` of an episode log (or a run's JSON)."""
    with open(log_path) as f:
        text = f.read()
    if log_path.endswith(".json"):
        records = json.loads(text)["records"]
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]  # the first: the log's header
    for r in records:
        if r.get("seed") == key:
            return [s["action"] for s in r["modes"][mode]["free"]["steps"]]
    raise KeyError(f"episode {key} is not in {log_path}")


def main(argv=None) -> int:
    from asymagent.evals.probes.harness import compression_config, load_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log", help="an episode log (.jsonl) or a run's JSON")
    p.add_argument("key", help="episode key, e.g. workspace/user_task_26/none")
    p.add_argument("--mode", default="full")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--show", default=None, help="print the view of this tool's outputs whole")
    p.add_argument("--compression", default=None, help="a CompressionConfig file or preset name (default view)")
    args = p.parse_args(argv)
    compression = compression_config(args.compression) if args.compression else None
    episode, steps = replay(args.key, recorded_actions(args.log, args.key, args.mode))
    tok = load_tokenizer(args.tokenizer)
    print(f"{args.key} {args.mode}: utility {episode['utility']} security {episode['security']} "
          f"calls {episode['function_trace']} answer {episode['answer']!r}")
    history = steps[-1].history if steps else []
    for c in cut_outputs(history, steps[-1].tools if steps else [], tok, compression):
        print(f"[{c.index}] {c.name}: {c.full_tokens} tokens, view {c.view_tokens}")
        if args.show and c.name == args.show:
            print(c.view)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
