"""Decode speed and fidelity of weight-only int8 / int4 linears against bf16 (`--dtype int8w|int4w`).

    flock /tmp/asym-bench.lock python -m asymagent.evals.probes.lowbit_decode --pair qwen2.5-coder \\
        --kinds bfloat16,int8w,int4w --rounds 2 --json docs/results/lowbit_decode.json

One process, one model in the automatic dtype (bf16 on a CPU with a bf16 unit; `--dtype float32` for
what a CPU without one runs, e.g. with `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` in the
environment to keep torch's and oneDNN's kernels to AVX2 as on an AVX2-only machine), switched between
kinds in place, interleaved A B C A B C over `--rounds`: "bfloat16" is what the engine runs by
default (oneDNN-packed linears, the lean forward fused, asymagent/modeling/packed_linear.py),
"int8w" / "int4w" the weight-only low-bit copies (asymagent/modeling/weight_only.py; a GGUF's
int4w takes the file's Q4_K grid, "int4w:minmax" rounds the float weights instead; each layer
quantised at each switch, or once with `--keep-lowbit`), the lean forward re-attached after every switch (its own bit-identity
check). The text: a suite conversation (`--suite`, `--seed`; the oracle episode rendered with the
model's chat template) of at least `--context + --positions` tokens.

- Speed: the first `--context` tokens prefilled, then `--decode` greedy one-token forwards
  (ModelCache.forward_logits, the engine's decode path; the first WARMUP not timed); per kind the median ms of a one-token
  forward over every round's forwards, and each round's median.
- Fidelity (teacher-forced, against bfloat16 on the same positions): the first `--context` tokens
  prefilled, then the next `--positions` tokens fed `--chunk` at a time (a verify-sized forward:
  the low-bit kernel's rows); top-1 agreement with bf16's argmax and mean KL(bf16 || kind) in nats
  per position. The prefill runs the kept float weights in every kind (weight_only.py: forwards of
  more than 32 rows), as the engine does.
- "llama_cpp": llama.cpp (llama-cpp-python, its own kernels on the GGUF's blocks, the torch
  thread count) timed and teacher-forced the same way in the same rounds: the issue's peer per
  token, interleaved (`LlamaCppKind`).
- Verify rows (`--verify-rows 1,4,16`): after the same prefill, an R-row forward of the whole
  model (R tokens, R logits kept: a K+1-row verify) per row count, the cache cropped back after
  each; per kind the median over rounds of each round's median (issue 55: is 16 rows ~ one row?).
- Kernels alone (`--kernel-rows`): one random [8960, 1536] layer (the 1.5B's gate/up) at 1..512
  rows: bf16 packed and F.linear, int8w, int4w; median ms.
- `--compare REF.json,A.json,...`: no measurement; the steps of `asymagent eval` JSONs (one run
  per dtype) whose output equals REF's mode full (step identity to bf16 full).
Also: quantisation seconds and bytes per kind, the row floors probed, the lean forward's state.
"""

from __future__ import annotations

import os
import statistics
import time

from asymagent.evals.probes.harness import command, finish, parser

WARMUP = 2  # one-token forwards run before the timed ones after each switch (not counted)


def _conversation_ids(tokenizer, suite: str, seed: int, need: int) -> list:
    """Token ids of suite episodes rendered with the chat template, seeds from `seed` on until
    at least `need` tokens."""
    from asymagent.evals.running.fusion import conversations

    ids: list = []
    while len(ids) < need:
        conv = conversations(suite, [seed])[0]
        text = tokenizer.apply_chat_template(conv.messages, tools=conv.tools, tokenize=False)
        ids += tokenizer.encode(text, add_special_tokens=False)
        seed += 1
    return ids[:need]


def _switch(model, kind: str, store: dict, source: str) -> dict:
    """Put `model` in `kind` (module doc); returns what was done. "int4w" of a GGUF source takes
    the file's Q4_K grid (asymagent/modeling/gguf_blocks.py); "int4w:minmax" rounds the float
    weights as for any other source; "int4w:torch" / "int4w:tiles" force int4w's kernel (torch's op,
    or kernels/cpu_lowbit.py; plain "int4w": the tile kernel where it runs)."""
    from asymagent.kv import lean_forward
    from asymagent.modeling.packed_linear import pack_linears, unpack_linears
    from asymagent.modeling.weight_only import dequantize_weights, quantize_weights

    lean_forward.detach(model)
    unpack_linears(model)
    dequantize_weights(model)
    start = time.perf_counter()
    info = {}
    if kind in ("bfloat16", "float32"):
        info["packed"] = pack_linears(model).packed
    else:
        base, *suffixes = kind.split(":")
        gguf = source if source.endswith(".gguf") and "minmax" not in suffixes else None
        kernel = next((x for x in suffixes if x in ("tiles", "torch")), None)
        report = quantize_weights(model, base, store=store, gguf=gguf, kernel=kernel)
        info.update(lowbit_gb=report.lowbit_bytes / 1e9, float_gb=report.float_bytes / 1e9,
                    floors=report.floors, sources=report.sources, kernel=report.kernel,
                    kernel_why=report.kernel_why)
    info["switch_s"] = time.perf_counter() - start
    lean = lean_forward.attach(model)
    info["lean_forward"] = ("fused" if lean.fused else "on") if lean.attached else f"off: {lean.why}"
    return info


def _decode_ms(model, ids: list, context: int, steps: int) -> tuple[list, list]:
    """Prefill ids[:context], then `steps` greedy one-token forwards: (ms of each, tokens)."""
    import torch

    from asymagent.kv.cache import ModelCache

    cache = ModelCache(model)
    with torch.inference_mode():
        logits = cache.forward_logits(ids[:context], keep=1)
        times, tokens = [], []
        for _ in range(steps + WARMUP):
            tok = int(logits[-1].argmax())
            tokens.append(tok)
            start = time.perf_counter()
            logits = cache.forward_logits([tok], keep=1)
            times.append((time.perf_counter() - start) * 1e3)
    return times[WARMUP:], tokens


def _verify_ms(model, ids: list, context: int, rows: tuple, repeats: int) -> dict:
    """Prefill ids[:context], then per row count R: median ms of an R-row forward (the tokens
    after the context, R logits kept, as a K+1 verify), the cache cropped back after each."""
    import torch

    from asymagent.kv.cache import ModelCache

    cache = ModelCache(model)
    out = {}
    with torch.inference_mode():
        cache.forward_logits(ids[:context], keep=1)
        for r in rows:
            times = []
            for _ in range(repeats + 1):  # the first not timed
                start = time.perf_counter()
                cache.forward_logits(ids[context:context + r], keep=r)
                times.append((time.perf_counter() - start) * 1e3)
                cache.crop(context)
            out[str(r)] = statistics.median(times[1:])
    return out


def _forced_logprobs(model, ids: list, context: int, positions: int, chunk: int):
    """log-softmax [positions, V] (float32) of ids[context:context+positions], teacher-forced in
    `chunk`-row forwards after a prefill of ids[:context]; row i predicts ids[context + i + 1]."""
    import torch

    from asymagent.kv.cache import ModelCache

    cache = ModelCache(model)
    rows = []
    with torch.inference_mode():
        cache.forward_logits(ids[:context], keep=1)
        for lo in range(context, context + positions, chunk):
            part = ids[lo:min(lo + chunk, context + positions)]
            rows.append(torch.log_softmax(cache.forward_logits(part, keep=len(part)), dim=-1))
    return torch.cat(rows)  # [positions, V]


class LlamaCppKind:
    """The kind "llama_cpp": llama.cpp (llama-cpp-python) on the same GGUF file, its own 4-bit
    kernels, decoding and teacher-forced the same way as the engine's kinds (the peer the bench
    runs, evals/bench/llama_cpp_peer.py; here per token, interleaved with our kinds)."""

    def __init__(self, gguf: str, n_ctx: int, threads: int):
        from asymagent.evals.bench.llama_cpp_peer import LlamaCppPeer

        peer = LlamaCppPeer(gguf, n_ctx, threads, logits_all=True)
        self.llm = peer.llm
        self.info = {"llama_cpp": peer.version, "threads": threads}

    def _last(self):
        import torch

        return torch.from_numpy(self.llm.scores[self.llm.n_tokens - 1].copy())  # [V] float32

    def decode_ms(self, ids: list, context: int, steps: int) -> tuple[list, list]:
        self.llm.reset()
        self.llm.eval(ids[:context])
        times, tokens = [], []
        for _ in range(steps + WARMUP):
            tok = int(self._last().argmax())
            tokens.append(tok)
            start = time.perf_counter()
            self.llm.eval([tok])
            times.append((time.perf_counter() - start) * 1e3)
        return times[WARMUP:], tokens

    def forced_logprobs(self, ids: list, context: int, positions: int, chunk: int):
        import torch

        self.llm.reset()
        self.llm.eval(ids[:context])
        for lo in range(context, context + positions, chunk):
            self.llm.eval(ids[lo:min(lo + chunk, context + positions)])
        scores = torch.from_numpy(self.llm.scores[context:context + positions].copy())  # [P, V]
        return torch.log_softmax(scores, dim=-1)


def _fidelity(ref, low) -> dict:
    agree = (ref.argmax(-1) == low.argmax(-1)).float()  # [P]
    kl = (ref.exp() * (ref - low)).sum(-1)  # [P] KL(bf16 || kind)
    return {"positions": int(agree.numel()), "top1_agreement": float(agree.mean()),
            "mean_kl": float(kl.mean()), "max_kl": float(kl.max())}


def _kernel_rows(shape: tuple, rows: tuple, repeats: int = 5) -> dict:
    """Median ms of one random [out, in] layer at each row count: bf16 oneDNN-packed (the engine's
    few-row bf16 kernel), bf16 F.linear (its prefill kernel), int8w and int4w (weight_only.py)."""
    import torch
    import torch.nn.functional as F

    from asymagent.evals.probes.harness import median_ms_of, timed
    from asymagent.modeling.packed_linear import pack_weight, packed_forward
    from asymagent.modeling.weight_only import LowBitWeight

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(*shape, generator=g) / shape[1] ** 0.5).to(torch.bfloat16)  # [out, in]
    packed = pack_weight(w)
    low = {k: LowBitWeight.make(k, w, torch.bfloat16) for k in ("int8w", "int4w")}
    out = {}
    with torch.inference_mode():
        for n in rows:
            x = torch.randn(n, shape[1], generator=g).to(torch.bfloat16)  # [rows, in]
            calls = {"bf16_packed": lambda: packed_forward(x, packed), "bf16_linear": lambda: F.linear(x, w),
                     "int8w": lambda: low["int8w"].matmul(x), "int4w": lambda: low["int4w"].matmul(x)}
            for fn in calls.values():
                fn()  # warm-up (oneDNN picks its kernel on the first call)
            out[str(n)] = {k: median_ms_of([timed(fn)[1] for _ in range(repeats)]) for k, fn in calls.items()}
    return out


def compare_records(paths: list) -> dict:
    """Step identity of `asymagent eval` JSONs to the first one's mode full: per other file and
    mode, the share of steps whose output equals the reference's full output."""
    import json

    ref = json.loads(open(paths[0]).read())
    ref_out = [s["output"] for s in ref["per_step"]["full"]]
    doc = {"reference": paths[0], "steps": len(ref_out),
           "reference_full_step_accuracy": ref["modes"]["full"]["step_accuracy"], "files": {}}
    for path in paths[1:]:
        d = json.loads(open(path).read())
        doc["files"][path.rsplit("/", 1)[-1]] = {
            mode: {"identical_to_reference_full": sum(s["output"] == r for s, r in zip(steps, ref_out)) / len(ref_out),
                   "step_accuracy": d["modes"][mode]["step_accuracy"],
                   "fidelity_vs_full": d["modes"][mode]["fidelity_vs_full"]}
            for mode, steps in d["per_step"].items()}
    return doc


def _load(args):
    from asymagent.modeling.loading import load_model
    from asymagent.modeling.pairs import resolve_sources

    source = args.verifier if args.pair is None else resolve_sources("pair:" + args.pair, None)[0]
    loaded = load_model(source, dtype=args.dtype)
    return loaded, str(source)


def main(argv=None) -> int:
    import torch

    from asymagent.kv.attention import use_gqa_attention
    from asymagent.modeling.cpu_dtype import runtime_info

    p = parser(__doc__, "lowbit_decode")
    p.add_argument("--pair", default=None, help="a named pair: its verifier (asymagent/modeling/pairs.py)")
    p.add_argument("--verifier", default="default", help="a model source when --pair is not given")
    p.add_argument("--kinds", default="bfloat16,int8w,int4w",
                   help='comma list of bfloat16/float32, int8w, int4w, "int4w:torch" / "int4w:tiles" (int4w\'s kernel forced), "int4w:minmax" (int4w rounded from '
                        'the float weights even when the source is a GGUF), "llama_cpp" (llama-cpp-python '
                        "on the same GGUF file)")
    p.add_argument("--dtype", default="auto",
                   help="the float dtype the model loads in, which the low-bit kinds keep for activations "
                        "and prefill (auto: bfloat16 with a bf16 unit, else float32); name it first in --kinds")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--context", type=int, default=512, help="tokens prefilled before decoding")
    p.add_argument("--decode", type=int, default=16, help="one-token forwards timed per round")
    p.add_argument("--positions", type=int, default=256, help="teacher-forced positions for fidelity")
    p.add_argument("--chunk", type=int, default=8, help="rows per teacher-forced forward")
    p.add_argument("--suite", default="records")
    p.add_argument("--seed", type=int, default=100000, help="first episode seed (test seeds from 100000)")
    p.add_argument("--kernel-rows", default="1,8,32,128,512",
                   help="row counts at which one [8960, 1536] layer is timed per kernel ('' skips)")
    p.add_argument("--verify-rows", default="",
                   help="row counts at which an R-row forward of the whole model is timed per kind and round "
                        "(a K+1-row verify; '' skips), e.g. 1,4,16")
    p.add_argument("--keep-lowbit", action="store_true",
                   help="keep every kind's low-bit copies across switches (more memory, quantised once)")
    p.add_argument("--compare", default=None, metavar="REF.json,A.json,...",
                   help="no measurement: step identity of `asymagent eval` JSONs to REF's mode full")
    args = p.parse_args(argv)
    if args.compare:
        doc = compare_records([x for x in args.compare.split(",") if x])
        print(doc, flush=True)
        return finish(doc | {"command": command("lowbit_decode", argv)}, args.json)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    load_before = os.getloadavg()  # the machine's 1/5/15-minute load: is it quiet?
    loaded, source = _load(args)
    model = loaded.model
    use_gqa_attention(model)
    ids = _conversation_ids(loaded.tokenizer, args.suite, args.seed, args.context + args.positions + 1)
    store: dict = {}
    times = {k: [] for k in kinds}
    rounds = {k: [] for k in kinds}
    verify_rows = tuple(int(r) for r in args.verify_rows.split(",") if r.strip())
    verify = {k: [] for k in kinds}  # per round: {rows: median ms}
    info, tokens, fidelity, ref = {}, {}, {}, None
    peer = (LlamaCppKind(source, args.context + args.positions + args.decode + 8, torch.get_num_threads())
            if "llama_cpp" in kinds else None)
    for r in range(args.rounds):
        for kind in kinds:
            if kind == "llama_cpp":
                info[kind] = peer.info
                t, toks = peer.decode_ms(ids, args.context, args.decode)
            else:
                info[kind] = _switch(model, kind, store if args.keep_lowbit else {}, source)
                t, toks = _decode_ms(model, ids, args.context, args.decode)
                if verify_rows:
                    verify[kind].append(_verify_ms(model, ids, args.context, verify_rows, max(3, args.decode // 4)))
            times[kind] += t
            rounds[kind].append(statistics.median(t))
            tokens[kind] = toks
            if r == 0:  # fidelity once per kind (the bits do not change between rounds)
                lp = (peer.forced_logprobs(ids, args.context, args.positions, args.chunk) if kind == "llama_cpp"
                      else _forced_logprobs(model, ids, args.context, args.positions, args.chunk))
                if ref is None:
                    ref = lp
                fidelity[kind] = _fidelity(ref, lp)
            print(f"round {r} {kind}: {rounds[kind][-1]:.1f} ms/token", flush=True)
    rows = tuple(int(r) for r in args.kernel_rows.split(",") if r.strip())
    kernel = {"shape": [8960, 1536], "ms": _kernel_rows((8960, 1536), rows)} if rows else None
    base = kinds[0]
    doc = {"kernel_rows": kernel, "command": command("lowbit_decode", argv), "source": source,
           "runtime": runtime_info(model) | {"threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                                             "load_before": load_before, "load_after": os.getloadavg()},
           "settings": {k: getattr(args, k) for k in ("context", "decode", "positions", "chunk", "suite",
                                                      "seed", "rounds")},
           "reference": base,
           "kinds": {k: {"decode_ms_per_token": statistics.median(times[k]), "round_medians_ms": rounds[k],
                         "speedup_vs_" + base: statistics.median(times[base]) / statistics.median(times[k]),
                         "greedy_tokens_equal_" + base: tokens[k] == tokens[base],
                         "fidelity_vs_" + base: fidelity[k], **info[k]} for k in kinds}}
    for k in kinds:
        if verify[k]:
            med = {r: statistics.median(v[r] for v in verify[k]) for r in verify[k][0]}
            doc["kinds"][k]["verify_ms"] = med
            doc["kinds"][k]["verify_round_ms"] = verify[k]
            doc["kinds"][k]["verify_16_to_1"] = med["16"] / med["1"] if {"1", "16"} <= set(med) else None
    for k in kinds:
        print(k, {x: doc["kinds"][k][x] for x in ("decode_ms_per_token", "speedup_vs_" + base)},
              doc["kinds"][k]["fidelity_vs_" + base], flush=True)
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
