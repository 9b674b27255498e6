"""Decode and verify forwards of the embedded verifier: float32 / bfloat16 eager / bfloat16 compiled.

    python -m asymagent.evals.probes.compiled_decode [--context 1000] [--repeats 10] [--rounds 2] [--json PATH]

One process: the verifier in float32 and in bfloat16, each with a StaticKV holding `--context`
tokens (asymagent/kv/static_cache.py); then, interleaved per round, the median ms of a one-token
forward (decode) and a 3-token forward (verify, K=2) for float32 eager, bfloat16 eager and bfloat16
through torch.compile (asymagent/kv/compiled_forward.py: frozen weights unless
ASYMAGENT_COMPILE_FREEZING=0), next to `bfloat16_default`: the engine's default CPU path, which
compile=True replaces (a copy of the bf16 model with packed linears and the lean forward over a
GrowingCache, asymagent/kv/cache.py ModelCache). Reports the compile warm-up of each shape
(first call), the largest logit difference and the argmax agreement between bf16 eager and
compiled, whether a token's logits get the same bits alone and as the first of a 3-token forward
(compiled: two programs; the default path: by construction), the weights' bytes and this
machine's copy bandwidth (evals/bench/machine_limits.py): the decode floor is bytes / bandwidth.
"""

from __future__ import annotations

import copy
import os

from asymagent.evals.probes.harness import finish, parser


def measure(context: int, repeats: int, rounds: int) -> dict:
    import torch

    from asymagent.evals.bench.machine_limits import copy_gbps, median_ms, weights_bytes
    from asymagent.kv.attention import use_gqa_attention
    from asymagent.kv.cache import ModelCache
    from asymagent.kv.compiled_forward import FREEZING, WARMUP, compile_failed, compiled_step
    from asymagent.kv.lean_forward import attach as attach_lean
    from asymagent.modeling.packed_linear import pack_linears
    from asymagent.kv.static_cache import StaticKV, StaticKVOptions
    from asymagent.modeling.loading import load_default_verifier

    kvs, sizes = {}, {}
    for name in ("float32", "bfloat16"):
        model = load_default_verifier(dtype=getattr(torch, name)).model
        use_gqa_attention(model)
        kv = StaticKV(model, StaticKVOptions())
        kv.reserve(context + 64)
        kv.run(list(range(1000, 1000 + context)), head=False)  # the context, prefilled eagerly
        kvs[name], sizes[name] = kv, weights_bytes(model)
    f32, bf = kvs["float32"], kvs["bfloat16"]
    # the engine's default CPU path: a copy of the bf16 model with packed linears and the lean
    # forward over a GrowingCache (ModelCache), which compile=True replaces
    lean_model = copy.deepcopy(bf.model)
    pack_linears(lean_model)
    attach_lean(lean_model)
    lean = ModelCache(lean_model)
    lean.prefill(list(range(1000, 1000 + context)))

    def compiled(ids):
        with torch.inference_mode():
            out = compiled_step(bf, torch.tensor([ids]), True)
        bf.seen += len(ids)
        return out.float()

    def once(kv, ids, fn=None):
        out = fn(ids) if fn else kv.run(ids)
        kv.crop(-len(ids))
        return out

    def default_path(ids):
        out = lean.forward_logits(ids, len(ids))  # [T, V] float32
        lean.crop(context)
        return out

    for ids in ([5], [5, 6, 7]):
        once(bf, ids, compiled)  # compiles (the warm-up)
    eager, comp = once(bf, [5, 6, 7]), once(bf, [5, 6, 7], compiled)
    # a row scored alone and as the first of three: the same bits? (mode spec's verify vs mode
    # full's decode, compiled: two programs; eager default path: by construction)
    same_bits = {"compiled": torch.equal(once(bf, [5], compiled)[0], comp[0]),
                 "default_path": torch.equal(default_path([5])[0], default_path([5, 6, 7])[0])}
    rows = []
    for _ in range(rounds):
        row = {}
        for t, ids in ((1, [5]), (3, [5, 6, 7])):
            row[f"float32_eager_{t}"] = median_ms(lambda: once(f32, ids), repeats)
            row[f"bfloat16_eager_{t}"] = median_ms(lambda: once(bf, ids), repeats)
            row[f"bfloat16_compiled_{t}"] = median_ms(lambda: once(bf, ids, compiled), repeats)
            row[f"bfloat16_default_{t}"] = median_ms(lambda: default_path(ids), repeats)
        row["load_average"] = os.getloadavg()[0]
        rows.append(row)
    gbps = copy_gbps()
    return {"context": context, "threads": torch.get_num_threads(), "compile_failed": compile_failed(),
            "warmup_s": {f"T={k[0]}": v for k, v in WARMUP.items()},
            "bf16_eager_vs_compiled_max_logit_diff": float((eager - comp).abs().max()),
            "bf16_eager_vs_compiled_argmax_equal": (eager.argmax(-1) == comp.argmax(-1)).tolist(),
            "row_bits_one_vs_three_tokens": same_bits, "freezing": FREEZING,
            "rounds": rows, "weights_bytes": sizes, "copy_gbps": gbps,
            "decode_bound_ms": {k: v / (gbps * 1e9) * 1e3 for k, v in sizes.items()}}


def main(argv=None) -> int:
    p = parser(__doc__, "compiled_decode")
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    return finish(measure(args.context, args.repeats, args.rounds), args.json, show=True)


if __name__ == "__main__":
    raise SystemExit(main())
