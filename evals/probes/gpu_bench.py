"""GPU benchmark: the fused gate's kernel rows and engine decode with and without CUDA graphs.

    python -m asymagent.evals.probes.gpu_bench --json docs/results/gpu.json     # ~3-4 min on an H200

Needs CUDA and refuses without it (exit 2). Writes
`{"device", "note", "gate": [rows of asymagent.kernels.bench], "engine": {...}}`:
- gate: `kernels.bench` rows (bf16, cda) for V=151936 x K {2, 8} x B {1, 16, 64}, V=262144 x
  K=8 x B {1, 64} and V=49152 x K=2 x B=1; variants `kernel` (split-V as dispatched),
  `kernel_s1` (the same kernels, one slice per row) and `eager` (the torch reference), with
  `x_of_bound` against the measured copy bandwidth;
- engine: a RANDOM-WEIGHT verifier of a real shape (default SmolLM2-360M's: 32 layers, hidden
  960, 15/5 heads, vocabulary 49152, 0.36B parameters; N(0, 1) embeddings so the logits are
  peaked) in bf16, with the project's drafter shape (the verifier's first 2 layers, shared
  embeddings and head); a 2048-token random prompt, 128 new tokens, greedy. Figures:
  `eager_forward_ms` (one-token forward on the stock dynamic cache), `graph_forward_ms` (the
  same forward replayed from a CUDA graph on a StaticKV), `full_ms_per_token` /
  `spec_ms_per_token` / `asym_ms_per_token` (Engine(cuda_graphs=True), decode seconds per new
  token, median over `--repeats` interleaved calls), `full_ms_per_token_eager` (the engine
  without graphs), ratios and acceptance. asym reads a compressed view (the first 256 + the last
  768 prompt tokens). Random weights make the timings real and the acceptance rates not:
  acceptance figures need trained weights.
A capture failure is recorded (`engine.graph_error`) and the eager figures are still written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPES = {  # LlamaConfig fields of real models (weights random)
    "smollm2-360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                         num_attention_heads=15, num_key_value_heads=5, vocab_size=49152,
                         rope_theta=100000.0, tie_word_embeddings=True),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=49152,
                         rope_theta=130000.0, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,  # tests only
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                 tie_word_embeddings=True),
}
GATE_CASES = ([(151936, k, b) for k in (2, 8) for b in (1, 16, 64)]
              + [(262144, 8, b) for b in (1, 64)] + [(49152, 2, 1)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--shape", default="smollm2-360m", choices=sorted(SHAPES))
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per call")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved calls per mode")
    parser.add_argument("--forwards", type=int, default=50, help="timed single forwards")
    parser.add_argument("--skip-gate", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")


def random_models(shape: str, dtype, device: str = "cuda"):
    """(verifier, drafter): a random-weight LlamaForCausalLM of `shape` and its 2-layer drafter."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from asymagent.modeling.drafter import build_drafter

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, **SHAPES[shape])
    with torch.device(device):
        verifier = LlamaForCausalLM(config)
    with torch.no_grad():  # N(0, 1) embeddings (tied head): peaked logits, few bf16 argmax ties
        verifier.model.embed_tokens.weight.normal_(0.0, 1.0)
    verifier.to(dtype).eval()
    return verifier, build_drafter(verifier, num_layers=2)


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


def bench_engine(args, device: str = "cuda") -> dict:
    """The engine figures. `device="cpu"` is a smoke test of this code (tests/test_gpu_bench.py):
    the "graph" runs then use the static caches eagerly (CUDA graphs need CUDA)."""
    import torch

    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig

    graphs = device == "cuda"
    dtype = torch.bfloat16 if graphs else torch.float32
    verifier, drafter = random_models(args.shape, dtype, device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, verifier.config.vocab_size, (args.prompt,), generator=gen).tolist()
    compressed = prompt[:256] + prompt[-768:]
    params = sum(p.numel() for p in verifier.parameters())
    out = {"model": f"random-weight Llama, {args.shape} shape, {params / 1e9:.2f}B parameters, "
                    f"{str(dtype).removeprefix('torch.')}",
           "drafter": "the verifier's first 2 layers (asymagent.modeling.drafter.build_drafter), "
                      "shared embeddings and head",
           "prompt_tokens": args.prompt, "new_tokens": args.tokens,
           "asym_view_tokens": len(compressed), "graph_error": None}
    out["eager_forward_ms"] = forward_ms(verifier, prompt, args.forwards, None)
    try:
        out["graph_forward_ms"] = forward_ms(verifier, prompt, args.forwards, graphs)
    except Exception as exc:  # a capture failure must not lose the eager figures
        out["graph_forward_ms"], out["graph_error"] = None, repr(exc)
    calls = {"full_eager": ("full", False)}
    if out["graph_error"] is None:
        calls.update(full=("full", True), spec=("spec", True), asym=("asym", True))
    engines = {name: Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(),
                            cuda_graphs=static and graphs, static_kv=static)
               for name, (_, static) in calls.items()}
    runs: dict = {name: [] for name in calls}
    for rep in range(args.repeats + 1):  # round 0 warms up (prefill, captures); interleaved
        for name, (mode, _) in calls.items():
            r = engines[name].generate(prompt, mode=mode, max_new_tokens=args.tokens,
                                       compressed_prompt_ids=compressed if mode == "asym" else None)
            if rep:
                runs[name].append(r)
    for name, results in runs.items():
        key = "full_ms_per_token_eager" if name == "full_eager" else f"{name}_ms_per_token"
        out[key] = 1e3 * statistics.median(r.stats.decode_s / r.stats.new_tokens for r in results)
        if name in ("spec", "asym"):
            drafted = sum(r.stats.drafted for r in results)
            out[f"{name}_acceptance"] = sum(r.stats.accepted for r in results) / drafted if drafted else None
    if out["graph_error"] is None:
        out["full_over_graph_forward"] = out["full_ms_per_token"] / out["graph_forward_ms"]
        out["graphs_speedup_full"] = out["full_ms_per_token_eager"] / out["full_ms_per_token"]
        for mode in ("spec", "asym"):
            out[f"{mode}_speedup_vs_full"] = out["full_ms_per_token"] / out[f"{mode}_ms_per_token"]
        out["greedy_spec_equals_full"] = runs["spec"][0].token_ids == runs["full"][0].token_ids
    out["graphs_equal_eager_full"] = (out["graph_error"] is None
                                      and runs["full"][0].token_ids == runs["full_eager"][0].token_ids)
    return out


def bench_gate() -> list[dict]:
    from asymagent.kernels import bench

    rows = []
    for vocab, k, batch in GATE_CASES:
        args = bench.parse_args(["--vocabs", str(vocab), "--ks", str(k), "--batches", str(batch),
                                 "--variants", "kernel", "kernel_s1", "eager"])
        args.peak_gbps = rows[0]["peak_gbps"] if rows else None  # measure the bandwidth once
        rows.extend(bench.bench_gpu(args))
    return rows


def main(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_bench needs a CUDA GPU and found none; nothing was measured or written "
              "(CPU figures: python -m asymagent.kernels.bench --cpu, asymagent bench)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    report = {"device": torch.cuda.get_device_name(),
              "note": "engine figures use random-weight models of real shapes: timings are real, "
                      "acceptance rates are not",
              "torch": torch.__version__, "gate": [], "engine": None}
    if not args.skip_gate:
        report["gate"] = bench_gate()
    if not args.skip_engine:
        report["engine"] = bench_engine(args)
    report["wall_s"] = time.perf_counter() - t0
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
