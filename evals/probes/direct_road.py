"""The lean forward's direct road against its general loop: decode and verify forwards of one verifier.

    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.direct_road --pair qwen2.5-coder \\
        --context 1000 --rows 1 4 --repeats 20 --json docs/results/direct_road_pair.json

The verifier as the engine loads it (the embedded default, or `--pair NAME`'s; bf16 where the CPU
has bf16 units), `--context` random tokens in the engine's cache, then for each `--rows` count
the median ms of a forward of that many tokens, interleaved A B A B: the direct road (what the
engine runs: asymagent/kv/lean_forward.py, `_direct_layer`) and the general loop
(`lean_forward.general_loop()`, the layer-by-layer path a model took before its o / down kinds
were on the road). Each forward is undone (the cache cropped back) so every one sees the same
context. Reports whether the two give the same logits, bit for bit (they must), and which kinds
the model's o / down projections are (the reference pair's 1.5B keeps some down projections on
F.linear, `FloorLinear`, on the Intel AMX machine).
"""

from __future__ import annotations

import sys

from asymagent.evals.probes import harness


def _kinds(model) -> dict:
    """How many o / down projections are of each class (PackedLinear, FloorLinear, ...)."""
    counts: dict = {}
    for layer in model.model.layers:
        for m in (layer.self_attn.o_proj, layer.mlp.down_proj):
            counts[type(m).__name__] = counts.get(type(m).__name__, 0) + 1
    return counts


def measure(engine, context: int, rows_list: list, repeats: int) -> dict:
    import torch

    from asymagent.kv import lean_forward
    from asymagent.kv.cache import ModelCache

    model = engine.verifier
    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    cache = ModelCache(model)
    out: dict = {}
    with torch.inference_mode():
        cache.forward_hidden(torch.randint(0, min(vocab, 30000), (context,), generator=g).tolist())
        for rows in rows_list:
            ids = torch.randint(0, min(vocab, 30000), (rows,), generator=g).tolist()

            def forward(general: bool):
                length = len(cache.tokens)
                if general:
                    with lean_forward.general_loop():
                        logits = cache.forward_logits(ids, keep=rows)
                else:
                    logits = cache.forward_logits(ids, keep=rows)
                cache.crop(length)
                return logits

            same = torch.equal(forward(False), forward(True))
            times: dict = {"direct": [], "general": []}
            for i in range(repeats):
                order = ("direct", "general") if i % 2 == 0 else ("general", "direct")
                for name in order:
                    _, seconds = harness.timed(forward, name == "general")
                    times[name].append(seconds)
            direct, general = harness.median_ms_of(times["direct"]), harness.median_ms_of(times["general"])
            out[str(rows)] = {"direct_ms": direct, "general_ms": general,
                              "general_over_direct": general / direct, "same_logits": same}
            print(f"{rows} row(s): direct {direct:.1f} ms, general loop {general:.1f} ms "
                  f"({general / direct:.2f}x), same logits {same}", flush=True)
    return out


def main(argv: list | None = None) -> int:
    p = harness.parser(__doc__, "direct_road", repeats=20)
    p.add_argument("--pair", default=None, metavar="NAME", help="a named pair's verifier (default: the embedded one)")
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    args = p.parse_args(argv)
    import torch

    from asymagent.engine import Engine
    from asymagent.evals.probes.batching_load import cpu_name

    engine = Engine.from_pair(args.pair) if args.pair else Engine.from_default()
    forwards = measure(engine, args.context, args.rows, args.repeats)
    report = {"command": harness.command("direct_road", argv), "cpu": cpu_name(),
              "threads": torch.get_num_threads(), "verifier": args.pair or "default",
              "projections": _kinds(engine.verifier), "context": args.context, "forwards": forwards}
    return harness.finish(report, args.json,
                          status=0 if all(f["same_logits"] for f in forwards.values()) else 1)


if __name__ == "__main__":
    sys.exit(main())
