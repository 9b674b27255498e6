"""GPU benchmark: the fused gate's rows and engine decode (full, spec, asym) with CUDA graphs.

    python -m asymagent.evals.probes.gpu_bench --part engine --shape smollm2-360m --json e.json
    python -m asymagent.evals.probes.gpu_bench --part gate --json g.json
    python -m asymagent.evals.probes.gpu_bench --merge e.json g.json --json docs/results/gpu.json
    python -m asymagent.evals.probes.gpu_bench --device cpu --part engine --shape tiny ...  # smoke run

scripts/gpu_check.sh runs the parts one by one, each under its own timeout. Every part rewrites
its JSON after each figure, so a part that is killed still leaves what it measured; a figure
that fails (a capture error, say) is recorded under `errors` and the part goes on. Without CUDA
the parts refuse (exit 2) unless `--device cpu` asks for the smoke run (tiny shapes, fp32, the
static caches and graph-shaped rounds run eagerly: the same code minus the capture).

Engine (`--part engine`): a RANDOM-WEIGHT Llama of a real shape in bf16 (`--shape`:
SmolLM2-360M's 0.36B or SmolLM2-1.7B's), N(0, 1) embeddings and an untied head that maps each
token's embedding to a fixed random successor (so greedy decoding walks a long permutation
cycle: varied tokens, no EOS, no repeats for suffix drafts to copy). The drafter is the
verifier's first 2 layers with the same head plus Gaussian noise whose scale is set by bisection
so the drafter's next token agrees with the verifier's on `--agreement` (default 0.70) of random
contexts: a realistic per-token acceptance (reported: `drafter_agreement` on held-out contexts,
and each mode's accepted / drafted and accepted / tested (`_acceptance_per_token`: a round
stops testing at its first reject) during decoding). A 2048-token random prompt, 128 new
tokens, greedy, SpecConfig(k=--k, fixed K, no copied drafts). Figures: `eager_forward_ms` (one-token
forward, dynamic cache), `graph_forward_ms` (the same forward replayed from a CUDA graph on a
StaticKV), ms per new token of `full_eager` (no graphs), `full` (graphs), `spec` and `asym`
(graphs, rounds as captured graphs: asymagent/decoding/graph_round.py), `spec_stepwise` (graphs,
rounds step by step as before issue 28), medians over `--repeats` interleaved calls; speed-ups
vs full; acceptance. asym reads a compressed view (the first 256 + the last 768 prompt tokens).

Gate (`--part gate`): `asymagent.kernels.bench` rows (bf16, cda) with variants `kernel` (the
dispatched launch, timed from Python), `graph` (the same replayed from a CUDA graph: what a
captured round pays), `kernel_s1` and `eager`; `x_of_bound` against the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from asymagent.evals.probes.harness import run_verb

SHAPES = {  # LlamaConfig fields of real models (weights random)
    "smollm2-360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                         num_attention_heads=15, num_key_value_heads=5, vocab_size=49152,
                         rope_theta=100000.0),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=49152,
                         rope_theta=130000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,  # smoke runs only
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
}
# (V, K, B, launch overrides): the rows, then B=64 launches to tune from (one run)
GATE_CASES = [(151936, 8, 1, {}), (151936, 8, 64, {}), (151936, 8, 1, {"views": 1}),
              (49152, 4, 1, {"views": 1}), (151936, 2, 1, {}), (151936, 8, 16, {}),
              (49152, 4, 1, {}), (262144, 8, 64, {}), (151936, 8, 64, {"block_v": 2048}),
              (151936, 8, 64, {"block_v": 512}), (151936, 8, 64, {"splits": 8})]
SMOKE_GATE_CASES = [(300, 2, 1, {}), (300, 4, 2, {"splits": 3}), (300, 2, 1, {"views": 1})]
MODES = {  # name -> (mode, cuda graphs / static caches, graph-shaped rounds)
    "full_eager": ("full", False, False), "full": ("full", True, False),
    "spec": ("spec", True, True), "asym": ("asym", True, True),
    "spec_stepwise": ("spec", True, False),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default=None, help="write the figures here (after each one)")
    parser.add_argument("--part", default="all", choices=["all", "engine", "gate"])
    parser.add_argument("--merge", nargs="+", default=None,
                        help="merge these part files into --json (no measuring)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a smoke run of this code (tiny shapes; times nothing real)")
    parser.add_argument("--shape", default="smollm2-360m", choices=sorted(SHAPES))
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per call")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved calls per mode")
    parser.add_argument("--forwards", type=int, default=50, help="timed single forwards")
    parser.add_argument("--k", type=int, default=4, help="drafts per round (fixed)")
    parser.add_argument("--agreement", type=float, default=0.70,
                        help="the drafter's target per-token agreement with the verifier")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    # kept for the older command lines
    parser.add_argument("--skip-gate", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")


class Sink:
    """A JSON report rewritten (atomically) after every figure, so a killed run keeps them."""

    def __init__(self, path: str | None, report: dict) -> None:
        self.path, self.report = path, report

    def flush(self) -> None:
        if self.path:
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(self.report, fh, indent=2)
            os.replace(tmp, self.path)

    def error(self, where: str, exc: BaseException) -> None:
        self.report.setdefault("errors", {})[where] = repr(exc)[:500]
        print(f"[gpu_bench] {where} failed: {exc!r}", file=sys.stderr)
        self.flush()


# ---------------------------------------------------------------------------- models
def random_models(shape: str, dtype, device: str = "cuda"):
    """(verifier, drafter, successor): a random-weight Llama of `shape` whose greedy next token
    is a fixed random successor of the last token, and its 2-layer drafter (shared embeddings,
    its own copy of the head, to which `set_drafter_noise` adds noise)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from asymagent.modeling.drafter import build_drafter

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=False, **SHAPES[shape])
    with torch.device(device):
        verifier = LlamaForCausalLM(config)
    vocab = config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    successor = torch.arange(vocab)
    successor[3:] = 3 + torch.randperm(vocab - 3, generator=gen)  # ids 0-2 are special
    with torch.no_grad():
        emb = verifier.model.embed_tokens.weight
        emb.copy_(torch.randn(emb.shape, generator=gen).to(device))
        head = torch.zeros_like(emb)  # row j = the embedding of the token j follows
        head[successor[3:].to(device)] = emb[3:]
        verifier.lm_head.weight.copy_(head)
    verifier.to(dtype).eval()
    drafter = build_drafter(verifier, num_layers=2)
    drafter.lm_head = torch.nn.Linear(config.hidden_size, vocab, bias=False, device=device,
                                      dtype=dtype)
    drafter.lm_head.weight.requires_grad_(False)
    drafter.lm_head.weight.copy_(verifier.lm_head.weight)
    return verifier, drafter, successor


def _next_tokens(model, contexts):
    """The greedy next token after each context [N, L] -> [N]."""
    import torch

    with torch.inference_mode():
        return model(input_ids=contexts).logits[:, -1].argmax(-1)


def calibrate_drafter(verifier, drafter, target: float, device: str, steps: int = 12) -> dict:
    """Head noise scale s (head + s * N) giving the drafter `target` agreement with the verifier's
    next token (bisection on random contexts), then the agreement on held-out contexts."""
    import torch

    vocab = verifier.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(1)
    clean = verifier.lm_head.weight.detach().clone()
    noise = torch.randn(clean.shape, generator=gen).to(device=device, dtype=clean.dtype)
    fit, held = (torch.randint(3, vocab, (256, 16), generator=gen).to(device) for _ in range(2))
    want = {"fit": _next_tokens(verifier, fit), "held": _next_tokens(verifier, held)}

    def agreement_at(scale: float, name: str) -> float:
        with torch.no_grad():
            drafter.lm_head.weight.copy_(clean + scale * noise)
        got = _next_tokens(drafter, fit if name == "fit" else held)
        return float((got == want[name]).float().mean())

    lo, hi = 0.0, 1.0
    while agreement_at(hi, "fit") > target and hi < 1e4:
        lo, hi = hi, hi * 2
    for _ in range(steps):
        mid = (lo + hi) / 2
        if agreement_at(mid, "fit") > target:
            lo = mid
        else:
            hi = mid
    scale = (lo + hi) / 2
    return {"drafter_noise_scale": scale, "drafter_agreement": agreement_at(scale, "held"),
            "drafter_agreement_target": target}


# ---------------------------------------------------------------------------- engine
def _median_ms(fn, n: int) -> float:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def forward_ms(model, prompt: list, n: int, graphs: bool | None) -> float:
    """Median ms of one one-token forward after `prompt`: dynamic cache (graphs None), StaticKV
    eager (False) or a CUDA graph replay (True, CUDA only); cropped back after each."""
    from asymagent.kv.cache import ModelCache
    from asymagent.kv.static_cache import StaticKVOptions

    cache = ModelCache(model, static=None if graphs is None else StaticKVOptions(graphs=graphs))
    cache.reserve(len(prompt) + 8)
    cache.prefill(prompt)

    def one():
        cache.forward_logits([prompt[-1]], keep=1)
        cache.crop(len(prompt))

    for _ in range(3):  # warm-up (and the capture)
        one()
    return _median_ms(one, n)


def _engine(verifier, drafter, spec, graphs: bool, static: bool, rounds: bool):
    from asymagent.engine import Engine

    old = os.environ.get("ASYMAGENT_GRAPH_ROUND")
    os.environ["ASYMAGENT_GRAPH_ROUND"] = "1" if rounds else "0"  # read when the engine is made
    try:
        return Engine(verifier=verifier, drafter=drafter, spec=spec,
                      cuda_graphs=graphs and static, static_kv=static)
    finally:
        if old is None:
            os.environ.pop("ASYMAGENT_GRAPH_ROUND")
        else:
            os.environ["ASYMAGENT_GRAPH_ROUND"] = old


def bench_engine(args, device: str = "cuda", sink: Sink | None = None) -> dict:
    """The engine figures (see the module docstring). `device="cpu"`: a smoke run of this code
    (tests/test_gpu_bench.py; the "graph" runs use the static caches eagerly)."""
    import torch

    from asymagent.spec_config import SpecConfig

    graphs = device == "cuda"
    dtype = torch.bfloat16 if graphs else torch.float32
    out: dict = {"shape": args.shape}
    sink = sink if sink is not None else Sink(None, {})
    sink.report["engine"] = out
    verifier, drafter, _ = random_models(args.shape, dtype, device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, verifier.config.vocab_size, (args.prompt,), generator=gen).tolist()
    compressed = prompt[:256] + prompt[-768:]
    params = sum(p.numel() for p in verifier.parameters())
    out.update({
        "model": f"random-weight Llama, {args.shape} shape, {params / 1e9:.2f}B parameters, "
                 f"{str(dtype).removeprefix('torch.')}; greedy next token = a fixed random "
                 "successor of the last token",
        "drafter": "the verifier's first 2 layers (build_drafter), shared embeddings, the "
                   "verifier's head plus Gaussian noise scaled to the target agreement",
        "prompt_tokens": args.prompt, "new_tokens": args.tokens, "k": args.k,
        "asym_view_tokens": len(compressed), "graph_error": None})
    t0 = time.perf_counter()
    out.update(calibrate_drafter(verifier, drafter, args.agreement, device,
                                 steps=12 if graphs else 6))
    out["calibrate_s"] = time.perf_counter() - t0
    sink.flush()
    try:
        out["eager_forward_ms"] = forward_ms(verifier, prompt, args.forwards, None)
    except Exception as exc:
        sink.error("engine.eager_forward", exc)
    try:
        out["graph_forward_ms"] = forward_ms(verifier, prompt, args.forwards, graphs)
    except Exception as exc:  # a capture failure must not lose the other figures
        out["graph_forward_ms"], out["graph_error"] = None, repr(exc)[:500]
        sink.error("engine.graph_forward", exc)
    sink.flush()
    # the drafter model's rounds only: no copied drafts (a random prompt has nothing to copy
    # anyway), fixed K (adaptive K decides from timings)
    spec = SpecConfig(k=args.k, adaptive_k=False, lookup_ngram=0)
    calls = {name: MODES[name] for name in args.modes}
    engines = {}
    for name, (_, static, rounds) in calls.items():
        try:
            engines[name] = _engine(verifier, drafter, spec, graphs, static, rounds)
        except Exception as exc:
            sink.error(f"engine.{name}.build", exc)
    runs: dict = {name: [] for name in engines}
    for rep in range(args.repeats + 1):  # round 0 warms up (prefill, captures); interleaved
        for name in list(engines):
            mode = calls[name][0]
            try:
                r = engines[name].generate(prompt, mode=mode, max_new_tokens=args.tokens,
                                           compressed_prompt_ids=compressed if mode == "asym"
                                           else None)
            except Exception as exc:  # e.g. a capture error: record it, measure the others
                sink.error(f"engine.{name}", exc)
                del engines[name]
                continue
            if rep:
                runs[name].append(r)
        _summarise(out, runs)
        out["repeats_done"] = rep
        from asymagent.kv.cuda_graphs import CAPTURE_ERRORS

        out["round_capture_errors"] = list(CAPTURE_ERRORS)  # rounds then ran uncaptured
        sink.flush()
    return out


def _summarise(out: dict, runs: dict) -> None:
    """Per-mode medians and the ratios, from the runs so far."""
    for name, results in runs.items():
        if not results:
            continue
        key = "full_ms_per_token_eager" if name == "full_eager" else f"{name}_ms_per_token"
        out[key] = 1e3 * statistics.median(r.stats.decode_s / max(r.stats.new_tokens, 1)
                                           for r in results)
        if name in ("spec", "asym", "spec_stepwise"):
            drafted = sum(r.stats.drafted for r in results)
            out[f"{name}_acceptance"] = (sum(r.stats.accepted for r in results) / drafted
                                         if drafted else None)
            # per-token: accepted / drafts the gate tested (a round stops at its first reject)
            tested = sum(sum(r.stats.reached_by_position) for r in results)
            out[f"{name}_acceptance_per_token"] = (sum(r.stats.accepted for r in results) / tested
                                                   if tested else None)
            out[f"{name}_tokens_per_round"] = statistics.median(r.stats.mean_accepted_len
                                                                for r in results)
    full = out.get("full_ms_per_token")
    if full and out.get("graph_forward_ms"):
        out["full_over_graph_forward"] = full / out["graph_forward_ms"]
    if full and out.get("full_ms_per_token_eager"):
        out["graphs_speedup_full"] = out["full_ms_per_token_eager"] / full
    for mode in ("spec", "asym", "spec_stepwise"):
        if full and out.get(f"{mode}_ms_per_token"):
            out[f"{mode}_speedup_vs_full"] = full / out[f"{mode}_ms_per_token"]
    first = {name: results[0].token_ids for name, results in runs.items() if results}
    if "full" in first:
        for name in ("spec", "spec_stepwise", "full_eager"):
            if name in first:
                out[f"{name}_tokens_equal_full"] = first[name] == first["full"]


# ---------------------------------------------------------------------------- gate
def bench_gate(device: str = "cuda", sink: Sink | None = None) -> list[dict]:
    """Gate rows, one case at a time (each appended to the report as it is measured)."""
    from asymagent.kernels import bench

    sink = sink if sink is not None else Sink(None, {})
    rows = sink.report.setdefault("gate", [])
    cases = GATE_CASES if device == "cuda" else SMOKE_GATE_CASES
    peak = None if device == "cuda" else 1000.0
    for vocab, k, batch, launch in cases:
        tuning = {key: v for key, v in launch.items() if key != "views"}
        argv = ["--vocabs", str(vocab), "--ks", str(k), "--batches", str(batch), "--variants",
                "kernel", "graph"] + ([] if tuning else ["kernel_s1", "eager"]) \
            + (["graph_passes", "graph_fused"] if batch <= 8 else [])
        for name, value in launch.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        args = bench.parse_args(argv)
        args.peak_gbps = rows[0]["peak_gbps"] if rows else peak  # measure the bandwidth once
        try:
            rows.extend(bench.bench_gpu(args, device=device))
        except Exception as exc:
            sink.error(f"gate.V{vocab}.K{k}.B{batch}{launch or ''}", exc)
        sink.flush()
    return rows


# ---------------------------------------------------------------------------- main
def merge(paths: list, out_path: str | None) -> dict:
    """One report from the parts' files (missing or broken files are named under `errors`)."""
    report: dict = {"engine": {}, "gate": [], "errors": {}}
    for path in paths:
        try:
            with open(path) as fh:
                part = json.load(fh)
        except (OSError, ValueError) as exc:
            report["errors"][os.path.basename(path)] = f"not read: {exc!r}"[:300]
            continue
        for key, value in part.items():
            if key == "engine" and value:
                report["engine"][value.get("shape", os.path.basename(path))] = value
            elif key == "gate":
                report["gate"].extend(value)
            elif key == "errors":
                report["errors"].update({f"{os.path.basename(path)}:{k}": v
                                         for k, v in value.items()})
            else:
                report.setdefault(key, value)
    if out_path:
        Sink(out_path, report).flush()
    return report


def main(args: argparse.Namespace) -> int:
    import torch

    if args.merge:
        report = merge(args.merge, args.json)
        print(json.dumps({k: v for k, v in report.items() if k != "gate"}, indent=2)[:4000])
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench needs a CUDA GPU and found none; nothing was measured or written "
              "(--device cpu runs this code on tiny shapes; CPU figures: python -m "
              "asymagent.kernels.bench --cpu, asymagent bench)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    report = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke)",
              "note": "engine figures use random-weight models of real shapes: timings are "
                      "real; acceptance is set by the drafter's calibrated head noise",
              "torch": torch.__version__}
    sink = Sink(args.json, report)
    sink.flush()
    if args.part in ("all", "gate") and not args.skip_gate:
        try:
            bench_gate(args.device, sink)
        except Exception as exc:
            sink.error("gate", exc)
    if args.part in ("all", "engine") and not args.skip_engine:
        try:
            bench_engine(args, args.device, sink)
        except Exception as exc:
            sink.error("engine", exc)
    report["wall_s"] = time.perf_counter() - t0
    sink.flush()
    print(json.dumps({k: v for k, v in report.items() if k != "gate"}, indent=2)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(run_verb(__doc__, "gpu_bench", add_arguments, main))
