"""The suites' train split as a trace file: oracle episodes of dev seeds, one trace line per episode, for `train-drafter --traces`.

    python -m asymagent.evals.suites.train_traces --out runs/suite_train.jsonl --seeds 1-12

Each line is a whole oracle episode (the history before the final answer, the suite's tools, the
final answer as the expected message), so `asymagent.traces.conversations` reads one conversation
per episode. The train split is the dev seeds from 1 on: seed 0 is the dev bench's workload
(`asymagent bench`, records:seed0) and is refused, and so are the held-out test seeds and the
held-out suites (`HELD_OUT_SUITES`, test seeds only): what trains a drafter is never what measures it.
"""

from __future__ import annotations

import argparse

from asymagent.evals.suites.environments import (HELD_OUT_SUITES, SUITES, is_test_seed, make_env,
                                                 oracle_episode)
from asymagent.traces import TraceExample, write_traces

BENCH_SEED = 0  # the dev bench's workload seed (evals/bench/bench.py --seed default)
TRAIN_SUITES = tuple(s for s in SUITES if s not in HELD_OUT_SUITES)


def parse_seeds(text: str) -> list:
    """'1-4,9' -> [1, 2, 3, 4, 9]."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def check_train_split(suites: list, seeds: list) -> None:
    """ValueError for a seed or suite outside the train split (module doc)."""
    for s in suites:
        if s not in SUITES:
            raise ValueError(f"unknown suite {s!r}; available: {', '.join(SUITES)}")
        if s in HELD_OUT_SUITES:
            raise ValueError(f"suite {s!r} is held out: never trained on")
    for seed in seeds:
        if is_test_seed(seed):
            raise ValueError(f"seed {seed} is a held-out test seed: never trained on")
        if seed == BENCH_SEED:
            raise ValueError(f"seed {BENCH_SEED} is the dev bench's workload: not in the train split")


def suite_traces(suites: list, seeds: list) -> list:
    """[TraceExample] one per (seed, suite) oracle episode, suites interleaved seed by seed (a
    budget that cuts the list keeps every suite)."""
    check_train_split(suites, seeds)
    out = []
    for seed in seeds:
        for s in suites:
            task, history = oracle_episode(make_env(s), seed)
            out.append(TraceExample(f"{s}:{seed}", history[:-1], task.tools, history[-1]))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSONL trace file to write")
    p.add_argument("--seeds", default="1-12", help="dev seeds, e.g. 1-12 or 1,3,5 (not 0: the bench's)")
    p.add_argument("--suites", default=",".join(TRAIN_SUITES), help="comma-separated suites")
    args = p.parse_args(argv)
    examples = suite_traces([s for s in args.suites.split(",") if s], parse_seeds(args.seeds))
    write_traces(args.out, examples)
    print(f"{len(examples)} episodes -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
