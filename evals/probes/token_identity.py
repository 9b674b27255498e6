"""Token-identity probe: the bench workload's output token ids per step, per mode, as JSON.

A refactor that must not change behaviour runs this before and after and compares the two files
(`--compare BEFORE`). Runs our four modes greedy, seeded sampled runs (temperature 0.7, fixed
seed) in asym, spec and full, one run with the other sampling knobs (top_p, top_k, min_p,
penalties, logit bias), one constrained run (tool_choice "required") and one `Engine.generate`
call per step with log-probs, each on its own cold cache session and SuffixStore.

    python -m asymagent.evals.probes.token_identity --json /tmp/after.json [--compare /tmp/before.json]
"""

from __future__ import annotations

import json
import sys

from asymagent.evals.probes.harness import parser, write

# name -> (mode, chat keywords)
RUNS = {
    "full": ("full", {}),
    "compressed": ("compressed", {}),
    "spec": ("spec", {}),
    "asym": ("asym", {}),
    "asym_t0.7_seed7": ("asym", {"temperature": 0.7, "seed": 7}),
    "spec_t0.7_seed7": ("spec", {"temperature": 0.7, "seed": 7}),
    "full_t0.7_seed7": ("full", {"temperature": 0.7, "seed": 7}),
    "asym_knobs_seed3": ("asym", {"temperature": 0.9, "seed": 3, "top_p": 0.9, "top_k": 40,
                                  "min_p": 0.02, "frequency_penalty": 0.3,
                                  "presence_penalty": 0.2, "logit_bias": {13: -2.0}}),
    "asym_required": ("asym", {"tool_choice": "required"}),
}


def run(steps: int, max_new_tokens: int, runs: list) -> dict:
    """{run name: [token ids per step]} (+ "generate_logprobs": [[token, logprob] per step])."""
    from tqdm.auto import tqdm

    from asymagent.context.views import ContextViews
    try:
        from asymagent.evals.bench.bench import workload
        from asymagent.evals.running.engine_setup import build_engine, use_suffix_store
    except ImportError:  # a tree from before evals/ had sub-packages (a "before" run)
        from asymagent.evals.bench import workload
        from asymagent.evals.engine_setup import build_engine, use_suffix_store

    engine = build_engine("default").engine
    work = workload("records", 0, steps)
    out: dict = {}
    bar = tqdm(total=len(runs) * steps + steps, desc="token identity")
    for name in runs:
        mode, kw = RUNS[name]
        kw = {"tool_choice": "auto", **kw}
        use_suffix_store(engine, f"ti-{name}")
        out[name] = []
        for history in work["histories"]:
            r = engine.chat(history, tools=work["tools"], mode=mode,
                            max_new_tokens=max_new_tokens, cache_key=f"ti-{name}", **kw)
            out[name].append(list(r.token_ids))
            bar.update(1)
    use_suffix_store(engine, "ti-generate")
    out["generate_logprobs"] = []
    for history in work["histories"]:
        ids = ContextViews(engine.tokenizer, engine.compression).build(
            history, work["tools"]).full_ids
        r = engine.generate(ids, mode="asym", max_new_tokens=max_new_tokens, cache_key="ti-gen",
                            logprobs=2)
        out["generate_logprobs"].append(
            [[t, round(e.logprob, 4)] for t, e in zip(r.token_ids, r.logprobs)])
        bar.update(1)
    bar.close()
    return out


def compare(before: dict, after: dict) -> list:
    """Lines naming every run whose outputs differ (empty: identical)."""
    diffs = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a != b:
            step = next((i for i, (x, y) in enumerate(zip(a or [], b or [])) if x != y), None)
            diffs.append(f"{name}: differs (first differing step {step})")
    return diffs


def main(argv=None) -> int:
    p = parser(__doc__, "token_identity", json_help="write {run: [token ids per step]} here", json_required=True)
    p.add_argument("--compare", metavar="BEFORE", help="compare with an earlier --json file")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--runs", default=",".join(RUNS), help="comma list of " + ", ".join(RUNS))
    args = p.parse_args(argv)
    out = run(args.steps, args.max_new_tokens, args.runs.split(","))
    write(out, args.json, indent=None)
    if args.compare:
        with open(args.compare) as f:
            diffs = compare(json.load(f), out)
        print("\n".join(diffs) if diffs else f"identical: {len(out)} runs x {args.steps} steps")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
