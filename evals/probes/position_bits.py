"""One position, one score on this CPU: does a position get the same logits in a decode and a verify?

    python -m asymagent.evals.probes.position_bits [--trials 6] [--context 300] [--rows 8]
        [--dtype auto] [--json PATH]

Lossless speculation (mode spec, asym on the full view) emits mode full's greedy tokens exactly
only if the verifier scores a position with the same bits whether it comes one token at a time
(mode full's decode) or inside a K+1-token verify forward. That is a property of the CPU's
kernels, not of the arithmetic: the bf16 paths were made bit-identical on an Intel CPU with AMX
(docs/kernels.md, "One position, one score"), float32 never was (a one-row GEMM rounds unlike a
several-row one), and an AMD EPYC without AMX differs in some draws (docs/results.md, "The same on
a second CPU"). This probe measures it on the machine it runs on, on the embedded verifier as the
engine runs it (packed linears, the lean forward when attached, the engine's attention choice),
at the engine's cache (asymagent/kv/growing_cache.py `for_model`):

for each trial, a random `--context`-token prompt is prefilled into two caches; cache A then
decodes `--rows` random tokens one at a time, cache B takes the same tokens as one forward; the
logits of each position are compared: bit-identical share, max |difference|, argmax agreement.
Plus the same comparison per kernel, with random data, so a mismatch can be placed: one attention
layer's shapes through the engine's attention function (per-head and grouped rows, each padded to
its row floor), the verifier's linear shapes through F.linear padded to the linear row floor
(asymagent/modeling/row_floor.py; `ASYMAGENT_ROW_FLOORS=0` measures the kernels without floors).
"""

from __future__ import annotations

import time

from asymagent.evals.probes.harness import finish, parser


def _compare(a, b) -> dict:
    """Row-wise comparison of two [rows, V] float tensors."""
    import torch

    same = [bool(torch.equal(x, y)) for x, y in zip(a, b)]
    return {"positions": len(same), "identical": sum(same),
            "max_abs_diff": float((a.float() - b.float()).abs().max()),
            "argmax_agree": int((a.argmax(-1) == b.argmax(-1)).sum())}


def model_positions(model, trials: int, context: int, rows: int, seed: int = 0) -> dict:
    """Decode one at a time vs one `rows`-token forward, after a `context`-token prefill."""
    import torch

    from asymagent.kv.growing_cache import for_model
    from asymagent.kv.lean_forward import lean_of

    lean = lean_of(model)
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(seed)

    def logits(ids, cache):  # [1, T] -> [T, V] float32, the engine's forward
        if lean is not None:
            return lean.logits(ids, cache, ids.shape[1])[0].float()
        return model(input_ids=ids, cache=cache, use_cache=True,
                     logits_to_keep=ids.shape[1]).logits[0].float()

    decoded, verified = [], []
    with torch.inference_mode():
        for _ in range(trials):
            prompt = torch.randint(0, vocab, (1, context), generator=g)  # [1, context]
            new = torch.randint(0, vocab, (1, rows), generator=g)  # [1, rows]
            one, many = for_model(model), for_model(model)
            logits(prompt, one)
            logits(prompt, many)
            decoded.append(torch.cat([logits(new[:, i:i + 1], one) for i in range(rows)]))
            verified.append(logits(new, many))  # [rows, V]
    out = _compare(torch.cat(decoded), torch.cat(verified))
    out["lean_forward"] = lean is not None
    return out


def kernel_positions(dtype, trials: int, seed: int = 0) -> dict:
    """Per kernel, random data: a row alone vs the same row inside a few-row forward."""
    import torch
    import torch.nn.functional as F
    from types import SimpleNamespace

    from asymagent.kv import attention
    from asymagent.modeling.packed_linear import linear_floor
    from asymagent.modeling.row_floor import pad_rows

    g = torch.Generator().manual_seed(seed)
    out = {}
    # attention: 9 query heads over 3 key/value heads of 64 (the verifier's), aligned key counts
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    paths = {"attention_per_head": 0}
    if dtype == torch.bfloat16:
        paths["attention_grouped_rows"] = attention.GROUP_ROWS
    saved_rows, saved_probe = attention.GROUP_ROWS, attention.grouped_rows_exact
    try:
        for name, group_rows in paths.items():
            attention.GROUP_ROWS = group_rows
            attention.grouped_rows_exact = lambda threads=None: True
            same = total = 0
            for _ in range(trials):
                keys = 64 * int(torch.randint(2, 40, (1,), generator=g))
                k = torch.randn(1, 3, keys, 64, generator=g).to(dtype)  # [1, Hkv, L, D]
                v = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
                rows = int(torch.randint(2, 9, (1,), generator=g))
                q = torch.randn(1, 9, rows, 64, generator=g).to(dtype)  # [1, Hq, T, D]
                past = keys - 64
                mask = (torch.arange(keys)[None, :] <= (torch.arange(rows) + past)[:, None])[None, None]
                many, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
                for t in range(rows):
                    one, _ = attention.gqa_sdpa_forward(module, q[:, :, t:t + 1].contiguous(), k, v,
                                                        mask[:, :, t:t + 1], scaling=0.125)
                    same += bool(torch.equal(one[:, 0], many[:, t]))
                    total += 1
            out[name] = {"positions": total, "identical": same}
    finally:
        attention.GROUP_ROWS, attention.grouped_rows_exact = saved_rows, saved_probe
    # linears: the verifier's shapes [out, in], one row alone vs row 0 of 2..32 rows, F.linear
    # with fewer rows than the linear row floor padded to it, as the engine's bf16 linears are
    for n_out, n_in in ((576, 576), (192, 576), (1536, 576), (576, 1536)):
        floor = linear_floor(dtype, (n_out, n_in)) if dtype == torch.bfloat16 else 1
        w = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(dtype)
        same = total = 0
        with torch.inference_mode():
            for _ in range(trials):
                x = torch.randn(32, n_in, generator=g).to(dtype)  # [32, in]
                alone = F.linear(pad_rows(x[:1], floor, 0), w)[0]
                for m in range(2, 33):
                    same += bool(torch.equal(F.linear(pad_rows(x[:m], floor, 0), w)[0], alone))
                    total += 1
        out[f"linear_{n_out}x{n_in}"] = {"positions": total, "identical": same, "floor": floor}
    return out


def measure(trials: int, context: int, rows: int, dtype: str = "auto") -> dict:
    import torch

    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.kv.attention import grouped_rows_exact
    from asymagent.modeling.row_floor import floors_off

    start = time.perf_counter()
    engine = build_engine("default", dtype=dtype).engine  # packs, attaches as the engine does
    doc = {"trials": trials, "context": context, "rows": rows, "threads": torch.get_num_threads(),
           "row_floors_off": floors_off(),
           "runtime": engine.runtime, "grouped_rows_exact": grouped_rows_exact(),
           "verifier": model_positions(engine.verifier, trials, context, rows),
           "kernels": kernel_positions(next(engine.verifier.parameters()).dtype, trials),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    doc["seconds"] = time.perf_counter() - start
    return doc


def main(argv=None) -> int:
    p = parser(__doc__, "position_bits")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--context", type=int, default=300, help="prompt tokens before the compared ones")
    p.add_argument("--rows", type=int, default=8, help="tokens decoded one by one / verified at once")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args(argv)
    doc = measure(args.trials, args.context, args.rows, args.dtype)
    v = doc["verifier"]
    print(f"verifier ({doc['runtime'].get('dtype')}, CPU bf16 unit {doc['runtime'].get('cpu_bf16')}): "
          f"{v['identical']}/{v['positions']} positions bit-identical, argmax agree "
          f"{v['argmax_agree']}/{v['positions']}, max |diff| {v['max_abs_diff']:.3g}")
    for name, k in doc["kernels"].items():
        if isinstance(k, dict):
            print(f"  {name}: {k['identical']}/{k['positions']} identical")
    return finish(doc, args.json, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
