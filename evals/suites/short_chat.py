"""Short single-turn chat through full / spec / asym with and without adaptive K, interleaved.

`PROMPTS` (short agent-style turns, no tools; the server's load tool sends the same ones), decoded in one
process so the modes can be compared side by side (A B C A B C ..., totals and medians):
    python -m asymagent.evals.suites.short_chat [--repeats 2] [--max-new-tokens 32] [--json PATH]
It measures what speculation costs when there is no long context to compress or copy from,
the case that decided `SpecConfig.adaptive_k` (docs/log.md, "Adaptive K").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

PROMPTS = (  # short agent-style turns; loadtest request i sends PROMPTS[i % len(PROMPTS)]
    "List three things to check before deploying a web service.",
    "What is the capital of France? Answer in one sentence.",
    "Summarise: the build failed because a dependency was pinned to a yanked version.",
    "Write a haiku about caching.",
    "Explain what a KV cache is in two sentences.",
    "Give a JSON object with keys city and country for Paris.",
    "Which is larger, 17 * 23 or 400? Show the product.",
    "Name two sorting algorithms and their average complexity.",
)

VARIANTS = (("full", "full", False), ("asym", "asym", False), ("asym+adaptive_k", "asym", True),
            ("spec", "spec", False), ("spec+adaptive_k", "spec", True))


def run(engine, prompts, *, repeats: int = 2, max_new_tokens: int = 32) -> dict:
    """{variant: {total_s, median_s, tokens, same_as_full}}; greedy, one cold session per call."""
    from asymagent.evals.running.engine_setup import use_suffix_store

    base = engine.spec
    times = {name: [] for name, _, _ in VARIANTS}
    tokens = {name: 0 for name, _, _ in VARIANTS}
    outputs: dict = {name: [] for name, _, _ in VARIANTS}
    try:
        for rep in range(repeats):
            for i, prompt in enumerate(prompts):
                for name, mode, adaptive in VARIANTS:
                    engine.spec = dataclasses.replace(base, adaptive_k=adaptive)
                    use_suffix_store(engine, f"{name}-{rep}")
                    t0 = time.perf_counter()
                    result = engine.chat([{"role": "user", "content": prompt}], mode=mode,
                                         max_new_tokens=max_new_tokens, temperature=0.0,
                                         cache_key=f"short-{name}-{rep}-{i}")
                    times[name].append(time.perf_counter() - t0)
                    tokens[name] += result.stats.new_tokens
                    if rep == 0:
                        outputs[name].append(result.token_ids)
    finally:
        engine.spec = base
    return {name: {"total_s": round(sum(t), 3), "median_s": round(statistics.median(t), 4),
                   "tokens": tokens[name],
                   "same_as_full": sum(a == b for a, b in zip(outputs[name], outputs["full"]))}
            for name, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from asymagent import Engine

    result = run(Engine.from_default(), PROMPTS, repeats=args.repeats, max_new_tokens=args.max_new_tokens)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
