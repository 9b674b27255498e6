"""Where mode full's time goes next to stock transformers `generate` (hf_generate), on the bench workload.

    python -m asymagent.evals.probes.plain_profile [--steps 6] [--repeats 2] [--max-new-tokens 32] [--json PATH]

Interleaved per step (A B A B): mode full through `engine.chat` (what the bench times) and the
hf_generate peer (`generate` with a carried DynamicCache on pre-rendered ids). Mode full's wall
is split into the chat layer (rendering, views, tokenising, parsing: wall - prefill - decode),
prefill and decode (StepStats), and decode into per-token time. A cProfile of one more pass of mode full lists the functions that cost most (cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time


def main(argv=None) -> int:
    from asymagent.evals.bench.bench import add_workload_arguments, write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p, steps=6)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)

    from asymagent.context.views import ContextViews
    from asymagent.evals.bench.bench import workload
    from asymagent.evals.bench.bench_peers import PeerPrefix, run_peer
    from asymagent.evals.running.engine_setup import build_engine

    engine = build_engine("default").engine
    work = workload(args.suite, args.seed, args.steps)
    histories, tools = work["histories"], work["tools"]
    views = ContextViews(tokenizer=engine.tokenizer, compression=engine.compression)
    prompts = [views.build(h, tools).full_ids for h in histories]
    eos = sorted(engine.eos_ids)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos[0]
    rows = {"full": [], "hf_generate": []}
    parts = {"chat_s": [], "prefill_s": [], "decode_s": [], "decode_per_token_s": []}
    for r in range(args.repeats):
        prefix = PeerPrefix()
        for i in range(args.steps):
            order = ("full", "hf_generate") if (i + r) % 2 == 0 else ("hf_generate", "full")
            for m in order:
                if m == "full":
                    t0 = time.perf_counter()
                    res = engine.chat(histories[i], tools=tools, mode="full",
                                      max_new_tokens=args.max_new_tokens, cache_key=f"profile-{r}")
                    wall = time.perf_counter() - t0
                    st = res.stats
                    parts["chat_s"].append(wall - st.prefill_s - st.decode_s)
                    parts["prefill_s"].append(st.prefill_s)
                    parts["decode_s"].append(st.decode_s)
                    parts["decode_per_token_s"].append(st.decode_s / max(st.new_tokens, 1))
                else:
                    rec = run_peer("hf_generate", engine.verifier, prompts[i],
                                   max_new_tokens=args.max_new_tokens, eos_ids=eos, pad_id=pad,
                                   flops=engine.flops, prefix=prefix)
                    wall = rec.wall_s
                rows[m].append(wall)
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(args.steps):
        engine.chat(histories[i], tools=tools, mode="full", max_new_tokens=args.max_new_tokens,
                    cache_key="profile-cprofile")
    profiler.disable()
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(25)
    doc = {"settings": vars(args),
           "wall_s": {m: sum(v) for m, v in rows.items()},
           "full_vs_hf_generate": sum(rows["hf_generate"]) / sum(rows["full"]),
           "full_parts_s": {k: sum(v) for k, v in parts.items() if k != "decode_per_token_s"},
           "full_decode_per_token_ms_median": 1e3 * statistics.median(parts["decode_per_token_s"]),
           "profile_top": buf.getvalue().splitlines()[:60]}
    print(json.dumps({k: v for k, v in doc.items() if k != "profile_top"}, indent=1))
    print("\n".join(doc["profile_top"]))
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
