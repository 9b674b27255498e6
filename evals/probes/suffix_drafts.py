"""Copied-draft drafters replayed on the bench workload: tokens per verifier forward and cost per proposal.

    python -m asymagent.evals.probes.suffix_drafts [--steps 12] [--max-new-tokens 32] [--json PATH]

The verifier decodes each step of the bench workload once (mode full, greedy: the reference
outputs); then every drafter is replayed on those outputs as greedy verification would see it:
at output position j it proposes a draft for the context prompt + output[:j], the accepted part is
the draft's common prefix with output[j:], the round emits that plus one token. This counts,
without a model in the loop, how many verifier forwards each drafter needs (tokens per forward),
how many tokens it asks the verifier to score (drafted), and what one proposal costs in wall time.
Previous steps' reference outputs feed the global store, as in a served agent.

Drafters: `lookup` (prompt lookup, n=3, the old default), `suffix` (ours, view + store),
`suffix-view` (ours, view only), and `arctic` (arctic-inference's `SuffixDecodingCache`, the
same algorithm in C++, when the package is importable: the dependency candidate of issue 19).
"""

from __future__ import annotations

import json

import numpy as np

from asymagent.evals.probes.harness import finish, median_ms_of, parser, timed


def replay(propose, prompt: list, output: list, k: int) -> dict:
    """Greedy verification of `propose(context, k) -> tokens` along `output`."""
    j = rounds = drafted = accepted = 0
    times = []
    while j < len(output):
        budget = min(k, len(output) - j - 1)
        draft, seconds = timed(lambda: propose(prompt + output[:j], budget) if budget > 0 else [])
        times.append(seconds)
        n = 0
        while n < len(draft) and j + n < len(output) and draft[n] == output[j + n]:
            n += 1
        rounds += 1
        drafted += len(draft)
        accepted += n
        j += n + 1
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted, "tokens": len(output),
            "propose_s": times}


class ArcticDrafter:
    """arctic-inference's SuffixDecodingCache fed as vLLM feeds it (prompt, then each output token)."""

    def __init__(self, cache, factor: float, min_prob: float, max_depth: int) -> None:
        self.cache, self.factor, self.min_prob, self.max_depth = cache, factor, min_prob, max_depth
        self.rid, self.have = None, 0

    def start(self, rid, prompt: list) -> None:
        self.cache.start_request(rid, np.asarray(prompt, dtype=np.int32))
        self.rid, self.have = rid, len(prompt)

    def __call__(self, ctx: list, k: int) -> list:
        if len(ctx) > self.have:
            self.cache.add_active_response(self.rid, ctx[self.have:])
            self.have = len(ctx)
        d = self.cache.speculate(self.rid, np.asarray(ctx[-self.max_depth:], dtype=np.int32),
                                 max_spec_tokens=k, max_spec_factor=self.factor,
                                 min_token_prob=self.min_prob)
        return list(d.token_ids)

    def stop(self) -> None:
        self.cache.stop_request(self.rid)


def arctic_drafter(factor: float, min_prob: float, max_depth: int):
    """ArcticDrafter, or None when arctic-inference is not installed."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError:
        return None
    cache = SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=256)
    return ArcticDrafter(cache, factor, min_prob, max_depth)


def main(argv=None) -> int:
    from asymagent.evals.bench.bench import add_workload_arguments

    p = parser(__doc__, "suffix_drafts", with_json=False)
    add_workload_arguments(p, steps=12)
    p.add_argument("--k", type=int, default=16, help="draft budget per round")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--min-prob", type=float, default=0.1)
    p.add_argument("--max-depth", type=int, default=32)
    p.add_argument("--outputs", metavar="PATH",
                   help="reference outputs: read from PATH when it exists, else decoded and written there")
    args = p.parse_args(argv)

    from asymagent.context.views import ContextViews
    from asymagent.decoding.lookup_drafter import lookup_continuation
    from asymagent.decoding.suffix_match import speculate
    from asymagent.decoding.suffix_store import SuffixStore
    from asymagent.evals.bench.bench import workload
    from asymagent.evals.running.engine_setup import build_engine

    import os

    work = workload(args.suite, args.seed, args.steps)
    if args.outputs and os.path.exists(args.outputs):
        with open(args.outputs) as f:
            saved = json.load(f)
        prompts, outputs = saved["prompts"], saved["outputs"]
    else:
        engine = build_engine("default").engine
        views = ContextViews(tokenizer=engine.tokenizer, compression=engine.compression)
        prompts = [views.build(h, work["tools"]).full_ids for h in work["histories"]]
        outputs = [engine.generate(pr, mode="full", max_new_tokens=args.max_new_tokens,
                                   cache_key="suffix-drafts").token_ids for pr in prompts]
        if args.outputs:
            with open(args.outputs, "w") as f:
                json.dump({"prompts": prompts, "outputs": outputs}, f)
    opts = dict(factor=args.factor, min_prob=args.min_prob, max_depth=args.max_depth, min_match=2)
    store = SuffixStore()
    arctic = arctic_drafter(args.factor, args.min_prob, args.max_depth)

    def ours(with_store: bool):
        def propose(ctx, k):
            arr = np.asarray(ctx, dtype=np.int32)
            best = speculate(arr, arr, max_tokens=k, **opts)
            if with_store:
                other = store.speculate(arr[-args.max_depth:], max_tokens=k, **opts)
                best = other if other.score > best.score else best
            return best.tokens
        return propose

    drafters = {"lookup": lambda ctx, k: lookup_continuation(ctx, 3, k),
                "suffix": ours(True), "suffix-view": ours(False)}
    if arctic is not None:
        drafters["arctic"] = arctic
    results = {name: [] for name in drafters}
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        for name, propose in drafters.items():
            if propose is arctic:
                arctic.start(f"step{i}", prompt)
            results[name].append(replay(propose, prompt, out, args.k))
            if propose is arctic:
                arctic.stop()
        store.add(out)  # the response joins the global store for the next steps
    summary = {}
    for name, recs in results.items():
        rounds = sum(r["rounds"] for r in recs)
        tokens = sum(r["tokens"] for r in recs)
        times = [t for r in recs for t in r["propose_s"]]
        summary[name] = {"tokens_per_forward": tokens / rounds, "rounds": rounds, "tokens": tokens,
                         "drafted": sum(r["drafted"] for r in recs),
                         "accepted": sum(r["accepted"] for r in recs),
                         "propose_ms_median": median_ms_of(times),
                         "propose_ms_p90": 1e3 * float(np.percentile(times, 90))}
    doc = {"workload": {k: v for k, v in work.items() if k not in ("histories", "tools")},
           "prompt_tokens": [len(x) for x in prompts],
           "settings": vars(args), "drafters": summary}
    for name, d in summary.items():
        print(f"{name:12s} tok/fwd {d['tokens_per_forward']:.2f}  rounds {d['rounds']:4d}  "
              f"drafted {d['drafted']:5d}  accepted {d['accepted']:4d}  "
              f"propose {d['propose_ms_median']:.3f} ms (p90 {d['propose_ms_p90']:.3f})")
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
