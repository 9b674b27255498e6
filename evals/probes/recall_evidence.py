"""Which evidence could trigger a recall: copy counts and the drafter's full view against the step where asym leaves full.

    python -m asymagent.evals.probes.recall_evidence --frontier runs/frontier_bench.json [--policy asym] [--json PATH]

Reads a frontier run of the bench workload (evals/running/frontier.py, with policies `full` and
`--policy`), rebuilds each step's two views with that policy's CompressionConfig, and along the
policy's own output reports, per step:

- where its tokens first differ from full's (None: identical);
- the first output position where each copy evidence of asymagent/context/recall.py fires
  (`copy`: the full view copies a continuation only removed text holds and another token was
  emitted; `copy_any`: the full view copies from removed text at all) and the messages it points at;
- the drafter's JSD between its full-view and compressed-view distributions at the divergence and
  its maximum over the step (escalate_jsd's signal, position by position);
- the output positions where the drafter's full-view argmax is not in the compressed verifier's
  top 5 (the issue's "drafter argmax absent from the verifier's top-k");
- the compressed verifier's own top-2 log-prob margin at the divergence and the three positions
  where it is lowest (a trigger for decisions, which copy evidence cannot see).

An evidence is useful when it fires at (or before) the divergence and rarely elsewhere.
"""

from __future__ import annotations

import json

from asymagent.evals.probes.harness import finish, parser


def _logprobs(model, ids: list):
    import torch

    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # [T, V]


def probe(frontier: dict, policy: str) -> list:
    from asymagent.context.compressors import CompressionConfig
    from asymagent.context.recall import evidence_sources
    from asymagent.context.views import ContextViews
    from asymagent.engine import Engine
    from asymagent.evals.running.frontier import bench_conversation

    by: dict = {}
    for r in frontier["records"]:
        if r["workload"] == "bench":
            by.setdefault(r["step"], {})[r["policy"]] = r
    comp = frontier["settings"]["policies"][policy]["compression"]
    conv = bench_conversation(frontier["settings"]["bench_steps"])
    engine = Engine.from_default()
    views = ContextViews(engine.tokenizer, CompressionConfig.from_any(comp), engine.chat_format)
    rows = []
    for n, step in enumerate(conv.steps):
        if n not in by or policy not in by[n] or "full" not in by[n]:
            continue
        pair = views.build(step.history, step.tools)
        spans = views.message_spans()
        toks, full = by[n][policy]["token_ids"], by[n]["full"]["token_ids"]
        div = next((i for i in range(min(len(toks), len(full))) if toks[i] != full[i]),
                   None if len(toks) == len(full) else min(len(toks), len(full)))
        fired = {}
        for kind in ("copy", "copy_any", "copy_any_length"):
            for t in range(len(toks)):
                src = evidence_sources(kind, pair.full_ids + toks[:t], pair.compressed_ids + toks[:t], toks[t])
                where = sorted({i for i, s in enumerate(spans) for p in src
                                if s.full[0] <= p < s.full[1] and not s.same})
                if where:
                    fired[kind] = {"position": t, "messages": where}
                    break
        nf, nc = len(pair.full_ids), len(pair.compressed_ids)
        df = _logprobs(engine.drafter, pair.full_ids + toks)[nf - 1: nf - 1 + len(toks)]  # [T, V]
        dc = _logprobs(engine.drafter, pair.compressed_ids + toks)[nc - 1: nc - 1 + len(toks)]
        vc = _logprobs(engine.verifier, pair.compressed_ids + toks)[nc - 1: nc - 1 + len(toks)]
        m = (0.5 * (df.exp() + dc.exp())).clamp_min(1e-30).log()
        jsd = 0.5 * ((df.exp() * (df - m)).sum(-1) + (dc.exp() * (dc - m)).sum(-1))  # [T]
        top5 = vc.topk(5, -1).indices
        top2 = vc.topk(2, -1).values  # [T, 2] log-probs
        margin = (top2[:, 0] - top2[:, 1]) if len(toks) else top2[:, 0]  # the verifier's own confidence
        low = sorted(range(len(toks)), key=lambda i: float(margin[i]))[:3]
        absent = [i for i in range(len(toks)) if not bool((top5[i] == df[i].argmax()).any())]
        rows.append({"step": n, "tokens": len(toks), "diverges_at": div, "copy": fired.get("copy"),
                     "copy_any": fired.get("copy_any"), "copy_any_length": fired.get("copy_any_length"),
                     "jsd_at_divergence": None if div is None or div >= len(toks) else float(jsd[div]),
                     "jsd_max": float(jsd.max()) if len(toks) else 0.0,
                     "jsd_mean": float(jsd.mean()) if len(toks) else 0.0,
                     "drafter_argmax_not_in_top5": absent,
                     "margin_at_divergence": None if div is None or div >= len(toks) else float(margin[div]),
                     "lowest_margin_positions": low,
                     "lowest_margins": [float(margin[i]) for i in low]})
    return rows


def main(argv=None) -> int:
    p = parser(__doc__, "recall_evidence")
    p.add_argument("--frontier", required=True, help="a frontier JSON of the bench with policies full and --policy")
    p.add_argument("--policy", default="asym")
    args = p.parse_args(argv)
    rows = probe(json.load(open(args.frontier)), args.policy)
    for r in rows:
        print(f"step {r['step']:2d}: diverges at {r['diverges_at']}, copy {r['copy']}, copy_any {r['copy_any']}, copy_any_length {r['copy_any_length']}, "
              f"JSD at divergence {r['jsd_at_divergence']}, max {r['jsd_max']:.4f}, mean {r['jsd_mean']:.4f}, "
              f"drafter argmax not in top 5 at {len(r['drafter_argmax_not_in_top5'])}/{r['tokens']} positions, "
              f"verifier top-2 margin at divergence {r['margin_at_divergence']}, lowest at "
              f"{r['lowest_margin_positions']} ({', '.join('%.2f' % m for m in r['lowest_margins'])})")
    return finish(rows, args.json, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
