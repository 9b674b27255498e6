"""Per-forward overheads of the CPU forward, before and after, interleaved: row-floor padding, the grouped mask, the prefill mask, the fresh prefill's causal call, the direct road.

    python -m asymagent.evals.probes.overhead_ab [--context 1000] [--repeats 25] [--threads 2] \
        [--prefill-rows 490] [--changes pad,mask,prefill_mask,fresh_causal,direct] [--json PATH]

One process, the embedded verifier as the engine loads it (bf16 where the CPU has bf16 units,
packed linears, lean forward, row floors, grouped attention rows), `--context` random tokens
cached. For each change, per repeat, A (before) then B (now): a one-token forward (a decode) and
a 4-token forward (a K+1 verify); the other change stays as now. The logits of A and B must be
bit-identical; the medians and their ratio are reported.

- `pad`: asymagent/modeling/row_floor.py `pad_rows` by `repeat` + `narrow` (before) vs one `cat`
  (now), swapped in both modules that pad (kv/attention.py, modeling/packed_linear.py);
- `mask`: kv/attention.py's grouped mask (rows padded, repeated per group member, 0/-inf) built
  in every layer (before: `attention.per_layer_masks()`; SDPA converted the bool mask in every
  layer) vs once per forward (now);
- `prefill_mask`: a `--prefill-rows`-token forward (an agent step's appended tool output, on the
  per-head path) with the bool mask handed to SDPA, which converts it in every layer (before), vs
  its additive form built once per forward (now; before: `attention.sdpa_converts_masks()`);
- `fresh_causal`: a prefill of `--prefill-rows` and of 1024 tokens on an EMPTY cache (a
  conversation's first prompt, a long prompt's first chunk) under its mask (before:
  `attention.masked_fresh_prefill()`) vs as SDPA's `is_causal` (now: the kernel skips the blocks
  above the diagonal);
- `direct`: 1-, 4- and 17-token forwards (a decode, verifies) through the lean forward's general
  loop, every per-call decision made in every layer (before: `lean_forward.general_loop()`), vs
  the direct road, those decisions made once per forward (now; asymagent/kv/lean_forward.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time


def pad_rows_repeat(x, floor: int, dim: int):
    """The padding before: `repeat` the rows, `narrow` to the floor (same values as pad_rows)."""
    n = x.shape[dim]
    if n >= floor:
        return x
    reps = [1] * x.dim()
    reps[dim] = -(-floor // n)
    return x.repeat(*reps).narrow(dim, 0, floor)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prefill-rows", type=int, default=490, help="rows of the prefill_mask forward")
    p.add_argument("--changes", default="pad,mask,prefill_mask,fresh_causal,direct")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)

    import torch

    import asymagent.kv.attention as attention
    import asymagent.modeling.packed_linear as packed_linear
    from asymagent.engine import Engine
    from asymagent.kv.cache import ModelCache
    from asymagent.kv.lean_forward import general_loop
    from asymagent.modeling.row_floor import pad_rows

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.from_default()
    ids = torch.randint(100, 40000, (args.context + max(1024, args.prefill_rows),), generator=torch.Generator().manual_seed(0)).tolist()
    cache = ModelCache(engine.verifier)
    cache.prefill(ids[: args.context])
    settings = {"pad": ({"pad": pad_rows_repeat}, {}), "mask": ({"per_layer_masks": True}, {}),
                "prefill_mask": ({"sdpa_converts_masks": True}, {}),
                "fresh_causal": ({"masked_fresh": True, "fresh": True}, {"fresh": True}),
                "direct": ({"general_loop": True}, {})}
    rows_of = {"pad": (1, 4), "mask": (1, 4), "prefill_mask": (args.prefill_rows,),
               "fresh_causal": (args.prefill_rows, 1024), "direct": (1, 4, 17)}
    fresh = ModelCache(engine.verifier)  # the fresh_causal forwards: an empty cache each time

    def forward(setting: dict, rows: int):
        attention.pad_rows = packed_linear.pad_rows = setting.get("pad", pad_rows)
        masks = (attention.per_layer_masks() if setting.get("per_layer_masks") else
                 attention.sdpa_converts_masks() if setting.get("sdpa_converts_masks") else
                 attention.masked_fresh_prefill() if setting.get("masked_fresh") else
                 general_loop() if setting.get("general_loop") else contextlib.nullcontext())
        on, start = (fresh, 0) if setting.get("fresh") else (cache, args.context)
        on.crop(start)
        with masks:
            t0 = time.perf_counter()
            logits = on.forward_logits(ids[start: start + rows], rows if rows <= 32 else 4)  # [<=32, V]
            return time.perf_counter() - t0, logits

    result = {"command": " ".join(["python -m asymagent.evals.probes.overhead_ab"] + (argv or [])),
              "threads": torch.get_num_threads(), "runtime": engine.runtime, "changes": {}}
    try:
        for change in args.changes.split(","):
            before_setting, now_setting = settings[change]
            for rows in rows_of[change]:
                for setting in (before_setting, now_setting):  # warm-up
                    forward(setting, rows)
                before, now = [], []
                for _ in range(args.repeats):
                    a, logits_a = forward(before_setting, rows)
                    b, logits_b = forward(now_setting, rows)
                    if not torch.equal(logits_a, logits_b):
                        raise SystemExit(f"{change}, {rows}-token forward: before and now gave different logits")
                    before.append(a)
                    now.append(b)
                ms_a, ms_b = 1e3 * statistics.median(before), 1e3 * statistics.median(now)
                result["changes"].setdefault(change, {})[str(rows)] = {
                    "before_ms": ms_a, "now_ms": ms_b, "ratio": ms_a / ms_b, "identical_logits": True}
                print(f"{change}: {rows}-token forward before {ms_a:.2f} ms, now {ms_b:.2f} ms, "
                      f"{ms_a / ms_b:.3f}x (identical logits)")
    finally:
        attention.pad_rows = packed_linear.pad_rows = pad_rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
