"""Decode and verify forwards of the embedded verifier: bf16 packed / plain / lean, fp32.

    python -m asymagent.evals.probes.packed_decode [--context 1000] [--repeats 10] [--rounds 3]
        [--verify-rows 4] [--prefill 1024] [--profile] [--time-grouped] [--json PATH]

One process, one bf16 model (its linears packed once, asymagent/modeling/packed_linear.py; the
unpacked runs set every PackedLinear's `max_rows` to 0, i.e. plain F.linear) and one float32
model. Each holds `--context` tokens in a GrowingCache (asymagent/kv/growing_cache.py: the
engine's default CPU cache, a DynamicCache without the per-token cat; aligned reads in bf16, as
the engine makes it) and in a StaticKV (asymagent/kv/static_cache.py). Per round, interleaved,
the median ms of a one-token forward (decode) and a `--verify-rows`-token forward (a K+1 verify)
for: float32 growing; bf16 growing through transformers' forward, plain and packed, with the
per-head attention call (`_perhead`: asymagent/kv/attention.py GROUP_ROWS = 0, the path before
grouped attention) and packed with grouped attention; bf16 static plain and packed; and the bf16
LeanForward (asymagent/kv/lean_forward.py: fused packed q|k|v and gate|up, no transformers
Python), per-head and grouped (`bfloat16_lean`: what the engine runs) and without row floors
(`_nofloors`: ASYMAGENT_ROW_FLOORS=0, asymagent/modeling/row_floor.py); and the median ms of a `--prefill`-token forward of the decoder body (no cache), float32 vs bf16.
Checks that the packed logits equal the plain ones bit for bit (1..16 rows, both caches), and
reports the weights' bytes and this machine's copy bandwidth (evals/bench/machine_limits.py):
the decode bound is bytes / bandwidth. `--profile`: the top operators of 5 packed one-token
forwards (growing cache; transformers' forward, then the lean forward) and of one bf16 prefill,
torch.profiler's self CPU time. On a CPU whose kernel does not give grouped rows the per-head
bits (`attention.grouped_rows_exact()`, recorded in the JSON), the "grouped" cases run per-head
like the engine, unless `--time-grouped` forces grouped rows to time them (`grouped_forced`).
"""

from __future__ import annotations

import json
import os
import time

from asymagent.evals.probes.harness import finish, parser


class _Runner:
    """One model + one cache holding the context; `step(rows)` feeds rows tokens and crops back."""

    def __init__(self, model, context: list, static: bool, lean: bool = False) -> None:
        import torch

        from asymagent.kv.growing_cache import ATTEND_ALIGN, GrowingCache
        from asymagent.kv.static_cache import StaticKV, StaticKVOptions
        from asymagent.kv.lean_forward import lean_of

        self.model, self.static = model, static
        self.lean = lean_of(model) if lean else None
        with torch.inference_mode():
            if static:
                self.kv = StaticKV(model, StaticKVOptions())
                self.kv.reserve(len(context) + 64)
                self.kv.run(context, head=False)
            else:  # as the engine makes it (ModelCache): aligned reads in bf16
                align = ATTEND_ALIGN if next(model.parameters()).dtype == torch.bfloat16 else 1
                self.kv = GrowingCache(config=model.config, attend_align=align)
                model(torch.tensor([context]), cache=self.kv, use_cache=True)

    def step(self, rows: int):
        import torch

        ids = list(range(7, 7 + rows))
        with torch.inference_mode():
            if self.static:
                out = self.kv.run(ids, head=True)  # [rows, V] float32
                self.kv.crop(-rows)
            elif self.lean is not None:
                out = self.lean.logits(torch.tensor([ids]), self.kv, rows)[0]
                self.kv.crop(-rows)
            else:
                out = self.model(torch.tensor([ids]), cache=self.kv, use_cache=True).logits[0]
                self.kv.crop(-rows)
        return out


def _top_ops(prof, per: int) -> list:
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
    return [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / per / 1e3, "calls": e.count // per}
            for e in events]


def measure(context: int, repeats: int, rounds: int, verify_rows: int, prefill: int,
            profile: bool, time_grouped: bool = False) -> dict:
    import torch

    from asymagent.evals.bench.machine_limits import copy_gbps, median_ms, weights_bytes
    from asymagent.kv import attention
    from asymagent.kv.attention import use_gqa_attention
    from asymagent.kv.lean_forward import attach as attach_lean
    from asymagent.modeling.loading import load_default_verifier
    from asymagent.modeling.cpu_dtype import runtime_info
    from asymagent.modeling.packed_linear import pack_linears

    ctx = list(range(1000, 1000 + context))
    f32 = load_default_verifier(dtype=torch.float32).model
    bf = load_default_verifier(dtype=torch.bfloat16).model
    for m in (f32, bf):
        use_gqa_attention(m)
    t0 = time.perf_counter()
    report = pack_linears(bf)
    pack_s = time.perf_counter() - t0

    def packed(on: bool) -> None:
        pack_linears(bf, max_rows=16 if on else 0)  # already packed: only the row limit changes

    lean = attach_lean(bf)  # after packing: fuses q|k|v and gate|up
    runners = {"float32_growing": _Runner(f32, ctx, False), "bfloat16_growing": _Runner(bf, ctx, False),
               "bfloat16_static": _Runner(bf, ctx, True),
               "bfloat16_lean": _Runner(bf, ctx, False, lean=True)}
    identical = {}
    for name in ("bfloat16_growing", "bfloat16_static"):
        for rows in range(1, 17):
            packed(False)
            a = runners[name].step(rows)
            packed(True)
            identical[f"{name}_{rows}"] = bool(torch.equal(a, runners[name].step(rows)))
    # (label, runner, packed linears on, grouped attention rows: attention.GROUP_ROWS)
    grouped = attention.GROUP_ROWS
    exact_grouped = attention.grouped_rows_exact()
    probe = attention.grouped_rows_exact
    if time_grouped:  # timing only: the bits may differ from the per-head call on this CPU
        attention.grouped_rows_exact = lambda threads=None: True
    cases = [("float32_growing", "float32_growing", None, grouped),
             ("bfloat16_growing_plain_perhead", "bfloat16_growing", False, 0),
             ("bfloat16_growing_packed_perhead", "bfloat16_growing", True, 0),
             ("bfloat16_growing_packed", "bfloat16_growing", True, grouped),
             ("bfloat16_static_plain", "bfloat16_static", False, grouped),
             ("bfloat16_static_packed", "bfloat16_static", True, grouped),
             ("bfloat16_lean_perhead", "bfloat16_lean", True, 0),
             ("bfloat16_lean", "bfloat16_lean", True, grouped),
             ("bfloat16_lean_nofloors", "bfloat16_lean", True, grouped)]  # ASYMAGENT_ROW_FLOORS=0
    out_rounds = []
    for _ in range(rounds):
        row = {}
        for rows in (1, verify_rows):
            for label, name, on, group_rows in cases:
                if on is not None:
                    packed(on)
                attention.GROUP_ROWS = group_rows
                runner = runners[name]
                saved = os.environ.pop("ASYMAGENT_ROW_FLOORS", None)
                if label.endswith("_nofloors"):  # no row floors (asymagent/modeling/row_floor.py)
                    os.environ["ASYMAGENT_ROW_FLOORS"] = "0"
                runner.step(rows)  # warm
                row[f"{label}_{rows}"] = median_ms(lambda: runner.step(rows), repeats)
                os.environ.pop("ASYMAGENT_ROW_FLOORS", None)
                if saved is not None:
                    os.environ["ASYMAGENT_ROW_FLOORS"] = saved
            attention.GROUP_ROWS = grouped
        long_ids = torch.tensor([list(range(1000, 1000 + prefill))])  # [1, prefill]
        for name, model in (("float32", f32), ("bfloat16", bf)):
            with torch.inference_mode():
                row[f"prefill_{name}"] = median_ms(lambda: model.model(long_ids), 1)
        row["load_average"] = os.getloadavg()[0]
        out_rounds.append(row)
    packed(True)
    attention.grouped_rows_exact = probe
    gbps = copy_gbps()
    sizes = {"float32": weights_bytes(f32), "bfloat16": weights_bytes(bf)}
    med = {k: sorted(r[k] for r in out_rounds)[len(out_rounds) // 2]
           for k in out_rounds[0] if k != "load_average"}
    doc = {"context": context, "threads": torch.get_num_threads(), "verify_rows": verify_rows,
           "cpu": runtime_info(), "grouped_rows_exact": exact_grouped, "grouped_forced": time_grouped,
           "prefill_tokens": prefill,
           "prefill_tok_s": {k: prefill / (med[f"prefill_{k}"] / 1e3) for k in ("float32", "bfloat16")},
           "lean_forward": {"attached": lean.attached, "fused": lean.fused, "why": lean.why},
           "packed_layers": report.packed, "packed_extra_bytes": report.extra_bytes,
           "pack_s": pack_s, "not_identical_layers": report.not_identical,
           "packed_equals_plain": all(identical.values()),
           "packed_equals_plain_by_rows": identical, "rounds": out_rounds,
           "median_ms": med,
           "weights_bytes": sizes, "copy_gbps": gbps,
           "decode_bound_ms": {k: v / (gbps * 1e9) * 1e3 for k, v in sizes.items()}}
    if profile:
        from torch.profiler import profile as torch_profile

        runner = runners["bfloat16_growing"]
        with torch_profile() as prof:
            for _ in range(5):
                runner.step(1)
        doc["profile_decode_top"] = _top_ops(prof, 5)
        runner = runners["bfloat16_lean"]
        with torch_profile() as prof:
            for _ in range(5):
                runner.step(1)
        doc["profile_decode_lean_top"] = _top_ops(prof, 5)
        with torch.inference_mode(), torch_profile() as prof:
            bf.model(torch.tensor([list(range(1000, 1000 + prefill))]))
        doc["profile_prefill_bfloat16_top"] = _top_ops(prof, 1)
    return doc


def main(argv=None) -> int:
    p = parser(__doc__, "packed_decode")
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--verify-rows", type=int, default=4)
    p.add_argument("--prefill", type=int, default=1024, help="tokens of the prefill forward")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--time-grouped", action="store_true",
                   help="time grouped attention rows even where they are not the per-head bits")
    args = p.parse_args(argv)
    doc = measure(args.context, args.repeats, args.rounds, args.verify_rows, args.prefill, args.profile,
                  args.time_grouped)
    print(json.dumps({k: v for k, v in doc.items() if k != "packed_equals_plain_by_rows"}, indent=2))
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
