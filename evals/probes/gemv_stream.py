"""Where a CPU decode step's linear time goes: 120 small one-row matmuls vs one large one, GB/s.

    python -m asymagent.evals.probes.gemv_stream [--threads 2] [--repeats 15] [--json PATH]

A one-token forward of the embedded verifier reads every weight once: 30 layers x 4 packed
one-row matmuls (q|k|v [960, 576], o [576, 576], gate|up [3072, 576], down [576, 1536]: 7 MB a
layer, 212 MB) and the head ([49152, 576], 57 MB). This probe times, on random bf16 weights of
those shapes in the packed form the engine uses (asymagent/modeling/packed_linear.py), (1) the
120 layer calls in order, as a forward makes them, each weight different; (2) the head alone,
one large call; (3) the same 120 calls through `torch.mv` on plain weights (another kernel);
and reports each as GB/s of weights read, next to the machine's copy bandwidth
(evals/bench/machine_limits.py, what the bench's weights-read bound divides by: bytes read plus
written) and a read-only stream (a sum over 1 GiB, far larger than the cache). Then (4) the layer
calls over the first 1, 2, 4, 8, 16 and 30 layers only (`working_set`): while the weights cycled
fit the part of the last-level cache this process gets, they are read from there, not memory.
Interleaved rounds, medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # q|k|v, o, gate|up, down: [out, in]
LAYERS = 30
HEAD = (49152, 576)


def _median(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure(repeats: int, rounds: int) -> dict:
    import torch

    from asymagent.evals.bench.machine_limits import copy_gbps
    from asymagent.modeling.packed_linear import pack_weight, packed_forward

    gen = torch.Generator().manual_seed(0)

    def weight(o: int, i: int):
        return torch.randn(o, i, generator=gen).bfloat16()

    plain = [[weight(o, i) for o, i in SHAPES] for _ in range(LAYERS)]
    packed = [[pack_weight(w) for w in layer] for layer in plain]
    head = pack_weight(weight(*HEAD))
    xs = {i: torch.randn(1, i, generator=gen).bfloat16() for i in (576, 1536)}
    layer_bytes = sum(o * i * 2 for o, i in SHAPES) * LAYERS
    head_bytes = HEAD[0] * HEAD[1] * 2

    def layers_packed():
        for layer in packed:
            for (o, i), w in zip(SHAPES, layer):
                packed_forward(xs[i], w)

    def layers_mv():
        for layer in plain:
            for (o, i), w in zip(SHAPES, layer):
                torch.mv(w, xs[i][0])

    def head_packed():
        packed_forward(xs[576], head)

    out = []
    with torch.inference_mode():
        for _ in range(rounds):
            out.append({"layers_packed_s": _median(layers_packed, repeats),
                        "head_packed_s": _median(head_packed, repeats),
                        "layers_mv_s": _median(layers_mv, repeats)})
    med = {k: sorted(r[k] for r in out)[len(out) // 2] for k in out[0]}
    gbps = copy_gbps()
    working = {}
    for n in (1, 2, 4, 8, 16, LAYERS):
        def some(n=n):
            for layer in packed[:n]:
                for (o, i), w in zip(SHAPES, layer):
                    packed_forward(xs[i], w)
        seconds = _median(some, max(repeats, 150 // n))
        working[str(n)] = {"mb": layer_bytes / LAYERS * n / 1e6,
                           "gbps": layer_bytes / LAYERS * n / seconds / 1e9}
    big = torch.ones((1 << 30) // 4, dtype=torch.float32)  # [256M] 1 GiB
    read_gbps = big.numel() * 4 / _median(big.sum, 5) / 1e9
    del big
    return {"threads": torch.get_num_threads(), "layer_calls": LAYERS * len(SHAPES),
            "layer_bytes": layer_bytes, "head_bytes": head_bytes, "rounds": out, "median_s": med,
            "median_ms": {k[:-2] + "_ms": v * 1e3 for k, v in med.items()},
            "gbps": {"layers_packed": layer_bytes / med["layers_packed_s"] / 1e9,
                     "head_packed": head_bytes / med["head_packed_s"] / 1e9,
                     "layers_mv": layer_bytes / med["layers_mv_s"] / 1e9},
            "copy_gbps": gbps, "read_gbps": read_gbps, "working_set": working,
            "load_average": os.getloadavg()[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asymagent.evals.probes.gemv_stream",
                                description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from asymagent.evals.bench.bench import write_json

    doc = measure(args.repeats, args.rounds)
    doc["command"] = "python -m asymagent.evals.probes.gemv_stream " + " ".join(
        argv if argv is not None else sys.argv[1:])
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    g, m = doc["gbps"], doc["median_s"]
    print(f"{doc['layer_calls']} layer calls, {doc['layer_bytes'] / 1e6:.0f} MB: packed "
          f"{m['layers_packed_s'] * 1e3:.2f} ms ({g['layers_packed']:.1f} GB/s), mv "
          f"{m['layers_mv_s'] * 1e3:.2f} ms ({g['layers_mv']:.1f} GB/s); head, one call, "
          f"{doc['head_bytes'] / 1e6:.0f} MB: {m['head_packed_s'] * 1e3:.2f} ms ({g['head_packed']:.1f} GB/s); "
          f"copy {doc['copy_gbps']:.1f} GB/s, read-only stream {doc['read_gbps']:.1f} GB/s")
    print("working set: " + ", ".join(f"{w['mb']:.0f} MB {w['gbps']:.1f} GB/s" for w in doc["working_set"].values()))
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
