"""A/B of the CPU decode path on the bench workload: lean forward + grouped attention vs before.

    python -m asymagent.evals.probes.lean_ab [--modes full,spec,asym] [--steps 12] [--threads 2]
        [--dtype auto|float32|bfloat16] [--json PATH]

One engine on the embedded default (`--dtype`, auto: bf16 where the CPU has bf16 units), the
bench workload's teacher-forced steps (records dev seed 0, as `asymagent bench`), each mode run
twice per step, interleaved and in alternating order: "new" = the engine as shipped (LeanForward,
asymagent/kv/lean_forward.py, and grouped attention rows, asymagent/kv/attention.py GROUP_ROWS),
"old" = transformers' forward (`ASYMAGENT_LEAN_FORWARD=0`) with the per-head attention call
(GROUP_ROWS = 0), i.e. the path before both (in float32 only the lean forward differs: grouped
rows are a bf16 path). Each (mode, path) has its own cache session and
store of earlier responses. Reports per mode the wall seconds of each path, the ratio of the
sums and the median per-step ratio, prefill and decode seconds, and whether the output token ids
are identical on every step (they must be: both changes are bit-identical).
"""

from __future__ import annotations

import os
import statistics
import time

from asymagent.evals.probes.harness import command, finish, parser


def measure(modes: list, steps: int, max_new_tokens: int, dtype: str = "auto") -> dict:
    import torch
    from tqdm.auto import tqdm

    from asymagent.evals.running.engine_setup import build_engine, reset_suffix_stores, use_suffix_store
    from asymagent.evals.running.frontier import bench_conversation
    from asymagent.kv import attention

    conv = bench_conversation(steps)
    setup = build_engine("default", dtype=dtype)
    engine = setup.engine
    reset_suffix_stores(engine)
    grouped = attention.GROUP_ROWS
    saved_env = os.environ.get("ASYMAGENT_LEAN_FORWARD")
    walls = {(m, p): [] for m in modes for p in ("new", "old")}
    parts = {(m, p): [0.0, 0.0] for m in modes for p in ("new", "old")}  # prefill s, decode s
    identical = {m: True for m in modes}
    bar = tqdm(total=len(conv.steps) * len(modes) * 2, desc="lean A/B")
    try:
        with torch.inference_mode():
            for n, step in enumerate(conv.steps):
                for mode in modes:
                    tokens = {}
                    for path in (("new", "old") if n % 2 == 0 else ("old", "new")):
                        os.environ["ASYMAGENT_LEAN_FORWARD"] = "1" if path == "new" else "0"
                        attention.GROUP_ROWS = grouped if path == "new" else 0
                        key = f"lean-ab-{mode}-{path}"
                        use_suffix_store(engine, key)
                        t0 = time.perf_counter()
                        r = engine.chat(step.history, tools=step.tools, mode=mode, max_new_tokens=max_new_tokens,
                                        temperature=0.0, tool_choice=step.tool_choice, cache_key=key)
                        walls[(mode, path)].append(time.perf_counter() - t0)
                        parts[(mode, path)][0] += r.stats.prefill_s
                        parts[(mode, path)][1] += r.stats.decode_s
                        tokens[path] = list(r.token_ids)
                        bar.update(1)
                    identical[mode] &= tokens["new"] == tokens["old"]
    finally:
        bar.close()
        attention.GROUP_ROWS = grouped
        if saved_env is None:
            os.environ.pop("ASYMAGENT_LEAN_FORWARD", None)
        else:
            os.environ["ASYMAGENT_LEAN_FORWARD"] = saved_env
        for mode in modes:
            for path in ("new", "old"):
                engine.caches.drop(f"lean-ab-{mode}-{path}")
    out = {}
    for mode in modes:
        new, old = walls[(mode, "new")], walls[(mode, "old")]
        out[mode] = {"new_wall_s": sum(new), "old_wall_s": sum(old), "speedup": sum(old) / sum(new),
                     "median_step_speedup": statistics.median(o / w for o, w in zip(old, new)),
                     "new_prefill_s": parts[(mode, "new")][0], "old_prefill_s": parts[(mode, "old")][0],
                     "new_decode_s": parts[(mode, "new")][1], "old_decode_s": parts[(mode, "old")][1],
                     "identical_tokens": identical[mode],
                     "new_step_s": new, "old_step_s": old}
    return {"steps": len(conv.steps), "modes": modes, "threads": torch.get_num_threads(),
            "max_new_tokens": max_new_tokens, "runtime": engine.runtime, "results": out,
            "load_average": os.getloadavg()[0]}


def main(argv=None) -> int:
    p = parser(__doc__, "lean_ab")
    p.add_argument("--modes", default="full,spec,asym")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--dtype", default="auto", help="the verifier's dtype (asymagent --dtype names)")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    doc = measure([m.strip() for m in args.modes.split(",") if m.strip()], args.steps, args.max_new_tokens,
                  args.dtype)
    doc["command"] = command("lean_ab", argv)
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for mode, r in doc["results"].items():
        print(f"{mode:8s} new {r['new_wall_s']:6.2f} s  old {r['old_wall_s']:6.2f} s  "
              f"{r['speedup']:.2f}x (median step {r['median_step_speedup']:.2f}x)  "
              f"decode {r['old_decode_s']:.2f} -> {r['new_decode_s']:.2f} s  identical tokens: {r['identical_tokens']}")
    return finish(doc, args.json, indent=1,
                  status=0 if all(r["identical_tokens"] for r in doc["results"].values()) else 1)


if __name__ == "__main__":
    raise SystemExit(main())
