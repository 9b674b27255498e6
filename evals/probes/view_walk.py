"""Tokenizer-only walk of verifier views along the suites' oracle episodes: context share and prefill per config.

No model runs. For each suite (an eval suite or `domain:NAME`) and seed, the oracle episode
(evals/running/fusion.py `conversations`) is cut at every assistant turn, the point a model is
asked, and each CompressionConfig (a preset name, `default`, or a file) builds its view there
with one ContextViews per conversation, append-stably, as the engine builds it step by step.
Per suite and config:

- share: verifier view tokens / full view tokens, mean over steps;
- prefill: the tokens each view's cache has to prefill over the episode (at each step, the
  view's length past its common prefix with the previous step's view), the verifier's as a share
  of full's: what the view saves of full's prefill, rewrites included;
- changed: steps where the verifier view differs from the first config's (the baseline).

    python -m asymagent.evals.probes.view_walk --suites records,tickets,fs_audit,injection,domain:parcels \\
        --split dev --episodes 8 --configs default,id_keep_blocks --tokenizer DIR --json out.json
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class WalkRow:
    """One suite under one config."""

    suite: str
    config: str
    steps: int
    share: float  # mean verifier / full context tokens over the steps
    verifier_prefill: int  # tokens the verifier's cache prefills over every episode
    full_prefill: int  # tokens full's cache prefills over the same steps
    prefill_share: float  # verifier_prefill / full_prefill
    rewrites: int
    changed: int  # steps whose verifier view differs from the baseline config's


def walk(conv, tokenizer, compression) -> list:
    """[(full ids, verifier ids, rewrites)] at each assistant turn of one conversation."""
    from asymagent.context.views import ContextViews

    views = ContextViews(tokenizer, compression)
    out = []
    for i, m in enumerate(conv.messages):
        if m["role"] == "assistant":
            pair = views.build(conv.messages[:i], conv.tools)
            out.append((pair.full_ids, pair.compressed_ids, pair.rewrites))
    return out


def measure(suites: list, seeds: list, configs: list, tokenizer) -> list:
    """WalkRow per (suite, config), the first config the baseline of `changed`."""
    from asymagent.evals.probes.harness import compression_config
    from asymagent.evals.running.fusion import conversations
    from asymagent.kv.cache import common_prefix_len

    rows = []
    for suite in suites:
        convs = conversations(suite, seeds)
        base = None
        for name in configs:
            walks = [walk(c, tokenizer, compression_config(name)) for c in convs]
            shares, vp, fp, rw, changed, k = [], 0, 0, 0, 0, 0
            for w_i, w in enumerate(walks):
                prev_f, prev_v = [], []
                for j, (f, v, r) in enumerate(w):
                    shares.append(len(v) / max(len(f), 1))
                    vp += len(v) - common_prefix_len(prev_v, v)  # what a cache holding prev_v prefills
                    fp += len(f) - common_prefix_len(prev_f, f)
                    rw += r
                    changed += int(base is not None and base[w_i][j][1] != v)
                    prev_f, prev_v = f, v
                    k += 1
            base = walks if base is None else base
            rows.append(WalkRow(suite, name, k, sum(shares) / max(k, 1), vp, fp, vp / max(fp, 1), rw, changed))
    return rows


def main(argv=None) -> int:
    from asymagent.evals.probes.harness import command, finish, load_tokenizer, parser
    from asymagent.evals.suites.environments import pick_seeds

    p = parser(__doc__, "view_walk")
    p.add_argument("--suites", default="records,tickets,fs_audit,injection,domain:parcels")
    p.add_argument("--split", choices=("dev", "test"), default="dev")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--seeds", default=None)
    p.add_argument("--configs", default="default,id_keep_blocks", help="comma list: default, presets or files")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder, .gguf file or cached HF id")
    args = p.parse_args(argv)
    tok = load_tokenizer(args.tokenizer)
    seeds = pick_seeds(args.split, args.episodes, args.seeds)
    rows = measure([s.strip() for s in args.suites.split(",") if s.strip()], seeds,
                   [c.strip() for c in args.configs.split(",") if c.strip()], tok)
    for r in rows:
        print(f"{r.suite:16s} {r.config:16s} steps {r.steps:3d} share {r.share:.3f} prefill share "
              f"{r.prefill_share:.3f} ({r.verifier_prefill}/{r.full_prefill}) rewrites {r.rewrites} "
              f"changed {r.changed}")
    return finish({"command": command("view_walk", argv), "tokenizer": args.tokenizer, "split": args.split,
                   "seeds": seeds, "configs": args.configs.split(","),
                   "rows": {f"{r.suite}/{r.config}": asdict(r) for r in rows}}, args.json, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
