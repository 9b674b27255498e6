"""`asymagent bench`: one long-horizon workload through every mode and the HF peers, in one process.

Workload: the first `--steps` assistant turns of one oracle episode (suite `records`, dev seed 0
by default), teacher-forced: each step's prompt is the oracle's history, so every mode and peer
decodes the same prompts. Our modes run through `engine.chat` with one cache session per mode
(agent loops append, so prefix reuse applies, as in a real run); the peers run stock
`generate` on the full rendered prompt (bench_peers.py; hf_generate carries its KV cache from step
to step, the speculative peers cannot). Repeats are interleaved (step-major,
mode order rotated per repeat) and the JSON reports medians, each mode's spread over repeats
(`wall_s_spread`: min, max, IQR) and each speed-up with a 95% bootstrap interval over steps x
repeats (`speedup_vs_full_ci95`; `pairs` holds full/hf_generate and asym over every other mode).
The two slow speculative peers run `--slow-peer-repeats` repeats (default 1: they cost ~5x a mode
of ours and trail by far more than the noise). Each of our modes gets its own cold `SuffixStore`
per repeat, so no mode copies another's output. Default `--tool-choice auto`
(unconstrained) so that modes and peers compute the same thing and fidelity is comparable.

JSON (docs/architecture.md §6): {"verifier", "drafter", "workload": {...}, "settings": {...},
"modes": {name: {wall_s, per_step_s, output_tokens, verifier_prefill_tokens, verifier_flops,
fidelity_vs_full, speedup_vs_full, speedup_vs_full_ci95, wall_s_spread, flops_vs_full,
[acceptance_rate, mean_accepted_len, acceptance_by_position, draft_source, by_source]}},
"pairs": {...}}; `by_source` holds per draft source (suffix, lookup, model, feature) the rounds,
mean accepted length and acceptance by position (RunStats.totals).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

OUR_MODES = ("full", "compressed", "spec", "asym")
LLAMA_CPP = "llama_cpp"  # the llama.cpp peer (bench/llama_cpp_peer.py), skipped when not installed
ALL_MODES = OUR_MODES + ("hf_generate", "hf_prompt_lookup", "hf_assisted", LLAMA_CPP)
SPECULATIVE = ("spec", "asym", "hf_prompt_lookup", "hf_assisted")
SLOW_PEERS = ("hf_prompt_lookup", "hf_assisted")  # re-prefill the whole prompt every step
BOOTSTRAP = 2000  # resamples for the speed-up intervals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--modes", default=",".join(ALL_MODES),
                   help="comma list of modes and peers (mode labels may carry SpecConfig overrides, "
                        "e.g. asym:k=4)")
    p.add_argument("--suite", default="records", help="suite the workload comes from")
    p.add_argument("--seed", type=int, default=0, help="episode seed (a dev seed)")
    p.add_argument("--steps", type=int, default=12, help="teacher-forced steps (>= 12 for the contract run)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    p.add_argument("--slow-peer-repeats", type=int, default=1,
                   help=f"repeats of {', '.join(SLOW_PEERS)} (each costs ~5x a mode of ours; "
                        "they run in the first repeats only)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="per step (the workload's calls take ~23)")
    p.add_argument("--tool-choice", default="auto", choices=("auto", "required"),
                   help="our modes' tool_choice (peers are unconstrained either way)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="hf_prompt_lookup's n-gram draft length")
    p.add_argument("--verifier", default="default", help="verifier (default: embedded SmolLM2; pair:NAME: a named pair)")
    p.add_argument("--pair", dest="verifier", type=lambda name: "pair:" + name, metavar="NAME",
                   help="a named verifier + drafter pair (as --verifier pair:NAME): 'qwen2.5-coder' "
                        "(`make setup-pair`; docs/pair.md)")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: the shipped one)")
    p.add_argument("--feature-head", metavar="PATH", default=None,
                   help="an EAGLE-3 feature head (`train-drafter --kind feature`) for the verifier: "
                        "spec/asym rounds without a copy draft with it (a mode label may turn it off: "
                        "spec:feature_head=false)")
    p.add_argument("--compression", metavar="FILE", default=None,
                   help="CompressionConfig YAML/JSON for the verifier's view (default: tool_output 64/32)")
    p.add_argument("--dtype", default="auto",
                   help="weights dtype of every mode and peer: auto (bfloat16 on a CPU with bf16 "
                        "matrix units, else float32), float32, bfloat16, int8 (asymagent/modeling/"
                        "cpu_dtype.py); a mode label may name another with '@', e.g. full@float32")
    p.add_argument("--compile", action="store_true",
                   help="static KV + torch.compile'd decode/verify forwards (asymagent/kv/compiled_forward.py)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")


def add_workload_arguments(p: argparse.ArgumentParser, steps: int) -> None:
    """The bench workload's options for probes on it (suffix_drafts)."""
    p.add_argument("--suite", default="records")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", metavar="PATH")


def write_json(path: str | None, doc: dict) -> None:
    """Write `doc` to `path` (nothing without a path)."""
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)


def workload(suite: str, seed: int, steps: int) -> dict:
    """{"name", "steps", "histories": [messages], "tools", ...} from one oracle episode."""
    from asymagent.evals.suites.environments import is_test_seed, make_env, oracle_episode

    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if is_test_seed(seed):
        raise ValueError(f"seed {seed} is a held-out test seed; the bench uses dev seeds")
    task, history = oracle_episode(make_env(suite), seed)
    cut = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    if len(cut) < steps:
        raise ValueError(f"{suite}:{seed} has only {len(cut)} assistant turns, fewer than --steps {steps}")
    return {"name": f"{suite}:seed{seed}", "suite": suite, "seed": seed, "steps": steps,
            "histories": [history[:i] for i in cut[:steps]], "tools": task.tools}


def split_dtype(label: str) -> tuple[str, str | None]:
    """'full@float32' -> ('full', 'float32'); 'asym:k=4' -> ('asym:k=4', None)."""
    base, _, dtype = label.partition("@")
    return base, (dtype or None)


def check_modes(modes: list, repeats: int) -> None:
    """ValueError for a bad mode label, a missing 'full' or repeats < 1."""
    from asymagent.evals.bench.bench_peers import PEERS
    from asymagent.evals.running.runner import parse_mode
    from asymagent.modeling.cpu_dtype import resolve_dtype

    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    for m in modes:
        base, dtype = split_dtype(m)
        if dtype is not None:
            resolve_dtype(dtype)
            if base in PEERS or base == LLAMA_CPP:
                raise ValueError(f"{m}: only our modes take '@dtype' (peers run the bench's --dtype)")
        if base not in PEERS and base != LLAMA_CPP:
            parse_mode(base)
    if "full" not in modes:
        raise ValueError("the bench needs mode 'full' (speedup and fidelity are relative to it)")


def check_args(args) -> None:
    """Refuse mistakes before any model loads (`asymagent` prints them on one line, exit 2)."""
    from asymagent.evals.suites.environments import SUITES
    from asymagent.evals.running.runner import split_mode_labels
    from asymagent.modeling.loading import check_drafter_source
    from asymagent.modeling.pairs import check_model_source

    if args.suite not in SUITES:
        raise ValueError(f"unknown suite {args.suite!r}; use one of {', '.join(SUITES)}")
    check_modes(split_mode_labels(args.modes), args.repeats)
    from asymagent.modeling.cpu_dtype import resolve_dtype

    resolve_dtype(args.dtype)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    workload(args.suite, args.seed, args.steps)  # seed and steps fit the episode
    if args.compression:
        from asymagent.context.views import CompressionConfig

        CompressionConfig.from_file(args.compression)
    check_model_source(args.verifier)
    if args.drafter:
        check_drafter_source(args.drafter)


def run_bench(engine, work: dict, modes: list, *, repeats: int = 2, max_new_tokens: int = 48,
              tool_choice: str = "auto", prompt_lookup_tokens: int = 10, progress: bool = True,
              on_step=None, slow_peer_repeats: int | None = None, engines: dict | None = None,
              llama=None) -> dict:
    """Run the workload; returns {"modes": {name: summary}, "workload": {...}} (no model ids).

    `engines`: {dtype name: Engine} for labels 'mode@dtype' (the same pair in another dtype);
    `llama`: a LlamaCppPeer for mode `llama_cpp` (bench/llama_cpp_peer.py).

    `on_step(partial)` is called after every step of the first repeat with the same structure
    over the steps done so far (plus "partial": {"steps_done": k}); `main` uses it to keep a
    valid JSON on disk should a long run be cut short."""
    from tqdm.auto import tqdm

    from asymagent.evals.bench.bench_peers import PEERS, PeerPrefix, run_peer
    from asymagent.request import GenerationRequest
    from asymagent.context.views import ContextViews
    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.evals.running.runner import parse_mode, spec_overrides

    check_modes(modes, repeats)
    histories, tools = work["histories"], work["tools"]
    views = ContextViews(tokenizer=engine.tokenizer, compression=engine.compression)
    prompts = [views.build(h, tools).full_ids for h in histories]  # [steps][P_i] full view ids
    eos = sorted(engine.eos_ids)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos[0]
    n = len(histories)
    info = {k: v for k, v in work.items() if k not in ("histories", "tools")}
    info["prompt_tokens"] = [len(p) for p in prompts]
    slow = repeats if slow_peer_repeats is None else max(1, min(slow_peer_repeats, repeats))
    runs = {m: slow if m in SLOW_PEERS else repeats for m in modes}  # repeats per mode
    times = {m: [[0.0] * n for _ in range(runs[m])] for m in modes}  # [repeat][step] seconds
    first: dict = {m: [None] * n for m in modes}  # first repeat's per-step record
    bar = tqdm(total=sum(runs.values()) * n, desc="bench", disable=not progress)
    store = engine.suffix_store
    for r in range(repeats):
        order = modes[r % len(modes):] + modes[: r % len(modes)]  # rotate who goes first
        order = [m for m in order if r < runs[m]]
        prefixes = {"hf_generate": PeerPrefix()}  # cold per repeat, like the modes' cache_key
        if llama is not None:
            llama.reset()
        for i in range(n):
            for m in order:
                if m == LLAMA_CPP:
                    rec = llama.run(prompts[i], max_new_tokens=max_new_tokens, eos_ids=eos,
                                    flops=engine.flops)
                    times[m][r][i] = rec.wall_s
                elif m in PEERS:
                    rec = run_peer(m, engine.verifier, prompts[i], max_new_tokens=max_new_tokens,
                                   eos_ids=eos, pad_id=pad, flops=engine.flops, drafter=engine.drafter,
                                   prompt_lookup_tokens=prompt_lookup_tokens, prefix=prefixes.get(m))
                    times[m][r][i] = rec.wall_s
                else:
                    base, dtype = split_dtype(m)
                    eng = engine if dtype is None else engines[dtype]
                    mode, overrides = parse_mode(base)
                    # earlier responses for suffix drafts: one store per mode and repeat, cold like
                    # the cache sessions, so no mode copies another mode's (or repeat's) output
                    use_suffix_store(eng, f"bench-{m}-{r}")
                    with spec_overrides(eng, overrides):
                        t0 = time.perf_counter()
                        request = GenerationRequest(  # greedy; cold session per repeat
                            mode=mode, max_new_tokens=max_new_tokens, tools=tools,
                            tool_choice=tool_choice, cache_key=f"bench-{m}-{r}")
                        rec = eng.chat(histories[i], request=request)
                        times[m][r][i] = time.perf_counter() - t0
                if r == 0:
                    first[m][i] = rec
                bar.update(1)
            if r == 0 and on_step is not None and i + 1 < n:
                one = {m: t[:1] for m, t in times.items()}
                on_step({"workload": info, "modes": _summarize(modes, one, first, i + 1),
                         "partial": {"steps_done": i + 1, "repeats_done": 0}})
    bar.close()
    engine.suffix_store = store
    if engines:
        for eng in engines.values():
            eng.caches.clear()  # the other dtypes' KV caches
    return {"workload": info, "modes": _summarize(modes, times, first, n),
            "pairs": _pairs(modes, times, n)}


def bootstrap_ratio(num: list, den: list, n: int, *, resamples: int = BOOTSTRAP,
                    seed: int = 0, level: float = 0.95) -> list:
    """Interval of sum(num) / sum(den) over steps x repeats: [low, high].

    `num`, `den`: [repeat][step] seconds of two modes over the same steps. Each resample draws
    the steps with replacement (paired: both modes get the same steps) and, per drawn step, one
    repeat of each mode at random; the interval is the central `level` of the resampled ratios.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float)[:, :n], np.asarray(den, dtype=float)[:, :n]  # [R, n]
    steps = rng.integers(0, n, size=(resamples, n))  # [B, n]
    ra = rng.integers(0, a.shape[0], size=(resamples, n))
    rb = rng.integers(0, b.shape[0], size=(resamples, n))
    ratios = a[ra, steps].sum(1) / b[rb, steps].sum(1)  # [B]
    tail = (1.0 - level) / 2 * 100
    return [float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))]


def _pairs(modes: list, times: dict, n: int) -> dict:
    """The comparisons the targets read: "a/b" = wall(b) / wall(a) (a's speed-up over b), with
    the median-of-repeats ratio and its bootstrap interval."""
    out = {}
    wanted = [("full", "hf_generate")] + [("full", m) for m in modes if m.startswith("full@")] + \
        [("asym", m) for m in modes if m != "asym"]
    for a, b in wanted:
        if a in times and b in times:
            med = statistics.median(sum(t[:n]) for t in times[b]) / statistics.median(sum(t[:n]) for t in times[a])
            out[f"{a}/{b}"] = {"speedup": med, "ci95": bootstrap_ratio(times[b], times[a], n)}
    return out


def _summarize(modes: list, times: dict, first: dict, n: int) -> dict:
    """Per-mode summary over the first `n` steps and every repeat in `times` (medians over repeats)."""
    import numpy as np

    from asymagent.evals.bench.bench_peers import PEERS
    from asymagent.evals.running.runner import parse_mode
    from asymagent.stats import RunStats

    out = {}
    full_ids = [list(rec.token_ids) for rec in first["full"][:n]]
    for m in modes:
        reps = times[m]
        per_step = [statistics.median(t[i] for t in reps) for i in range(n)]
        recs = first[m][:n]
        walls = [sum(t[:n]) for t in reps]
        q1, q3 = np.percentile(walls, [25, 75])
        d = {"wall_s": statistics.median(walls),
             "wall_s_repeats": walls,
             "wall_s_spread": {"min": min(walls), "max": max(walls), "iqr": float(q3 - q1),
                               "repeats": len(walls)},
             "per_step_s": per_step,
             "output_tokens": sum(len(x.token_ids) for x in recs),
             "fidelity_vs_full": sum(list(x.token_ids) == f for x, f in zip(recs, full_ids)) / n}
        if m == LLAMA_CPP:
            d["verifier_prefill_tokens"] = sum(x.verifier_prefill_tokens for x in recs)
            d["verifier_flops"] = sum(x.verifier_flops for x in recs)
            d.update(_speeds(sum(x.prefill_s for x in recs), d["verifier_prefill_tokens"],
                             sum(x.decode_s for x in recs), sum(max(len(x.token_ids) - 1, 0) for x in recs)))
        elif m in PEERS:
            d["verifier_prefill_tokens"] = sum(x.verifier_prefill_tokens for x in recs)
            d["verifier_flops"] = sum(x.verifier_flops for x in recs)
            drafted, accepted = sum(x.drafted for x in recs), sum(x.accepted for x in recs)
            rounds = sum(x.rounds for x in recs)
            acc_pos, reach_pos = _pool([x.accepted_by_position for x in recs], [x.reached_by_position for x in recs])
            if m != "hf_generate":
                d["acceptance_rate"] = accepted / drafted if drafted else 0.0
                d["mean_accepted_len"] = (accepted + rounds) / rounds if rounds else 0.0
                d["acceptance_by_position"] = [a / b if b else 0.0 for a, b in zip(acc_pos, reach_pos)]
        else:
            run = RunStats()
            for x in recs:
                run.add(x.stats)
            tot = run.totals()
            d["verifier_prefill_tokens"] = tot["verifier_prefill_tokens"]
            d["verifier_flops"] = tot["verifier_flops"]
            d["mean_compression_ratio"] = tot["mean_compression_ratio"]
            d["escalations"] = tot["escalations"]
            d.update(_speeds(sum(x.stats.prefill_s for x in recs), tot["verifier_prefill_tokens"],
                             sum(x.stats.decode_s for x in recs), tot["new_tokens"]))
            if parse_mode(split_dtype(m)[0])[0] in ("spec", "asym"):
                d["acceptance_rate"] = tot["acceptance_rate"]
                d["mean_accepted_len"] = tot["mean_accepted_len"]
                d["acceptance_by_position"] = run.acceptance_by_position()
                d["draft_source"] = tot["draft_source"]
                d["by_source"] = tot["by_source"]  # per draft source (StepStats.by_source)
        out[m] = d
    for m, d in out.items():
        d["speedup_vs_full"] = out["full"]["wall_s"] / d["wall_s"] if d["wall_s"] else 0.0
        d["speedup_vs_full_ci95"] = bootstrap_ratio(times["full"], times[m], n)
        d["flops_vs_full"] = d["verifier_flops"] / out["full"]["verifier_flops"] if out["full"]["verifier_flops"] else 0.0
    return out


def _speeds(prefill_s: float, prefill_tokens: int, decode_s: float, decode_tokens: int) -> dict:
    """prefill tok/s and decode ms per new token of a mode (first repeat; extra bench keys).

    Our modes: StepStats.prefill_s / decode_s (the decode time includes the drafter and the gate,
    so a speculative mode's ms/token is per emitted token). llama_cpp: time to its first token /
    the rest."""
    return {"prefill_tok_s": prefill_tokens / prefill_s if prefill_s > 0 else None,
            "decode_ms_per_token": 1e3 * decode_s / decode_tokens if decode_tokens else None}


def _pool(acc: list, reach: list) -> tuple[list, list]:
    a, b = [], []
    for xs, ys in zip(acc, reach):
        for i, (x, y) in enumerate(zip(xs, ys)):
            while len(a) <= i:
                a.append(0)
                b.append(0)
            a[i] += x
            b[i] += y
    return a, b


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"asymagent bench: {result['workload']['name']}, {result['workload']['steps']} steps "
                        f"(median of {result['settings']['repeats']} repeats, 95% bootstrap intervals)")
    for col in ("mode", "wall s", "min-max", "speedup", "95% CI", "s/step", "out tok", "ver prefill",
                "FLOPs vs full", "fidelity", "accept", "tok/fwd"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for m, d in result["modes"].items():
        spread, ci = d.get("wall_s_spread", {}), d.get("speedup_vs_full_ci95", [0.0, 0.0])
        table.add_row(m, f"{d['wall_s']:.2f}", f"{spread.get('min', 0):.1f}-{spread.get('max', 0):.1f}",
                      f"{d['speedup_vs_full']:.2f}x", f"{ci[0]:.2f}-{ci[1]:.2f}",
                      f"{d['wall_s'] / max(len(d['per_step_s']), 1):.2f}", str(d["output_tokens"]),
                      str(d["verifier_prefill_tokens"]), f"{d['flops_vs_full']:.2f}",
                      f"{d['fidelity_vs_full']:.2f}",
                      f"{d['acceptance_rate']:.2f}" if "acceptance_rate" in d else "-",
                      f"{d['mean_accepted_len']:.2f}" if "mean_accepted_len" in d else "-")
    console = Console()
    Console(width=max(console.width, 160)).print(table)  # wide enough that mode names never fold
    for pair, d in result.get("pairs", {}).items():
        print(f"{pair}: {d['speedup']:.2f}x (95% CI {d['ci95'][0]:.2f}-{d['ci95'][1]:.2f})")
    print(f"drafter: {result['drafter']}")


def main(args) -> int:
    from asymagent.evals.running.engine_setup import build_engine

    from asymagent.evals.running.runner import split_mode_labels

    modes = split_mode_labels(args.modes)
    work = workload(args.suite, args.seed, args.steps)
    t0 = time.perf_counter()
    compression = None
    if args.compression:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig.from_file(args.compression)
    from asymagent.modeling.cpu_dtype import resolve_dtype

    setup = build_engine(args.verifier, args.drafter, compression=compression, dtype=args.dtype,
                         compile=args.compile)
    setup.announce("bench")
    if getattr(args, "feature_head", None):
        setup.engine.use_feature_head(args.feature_head)
    engines = {}  # 'mode@dtype' labels: the same pair in another dtype
    for dtype in sorted({d for d in (split_dtype(m)[1] for m in modes) if d is not None}):
        engines[dtype] = build_engine(args.verifier, args.drafter, compression=compression,
                                      dtype=dtype, compile=args.compile).engine
    llama, llama_note = None, None
    if LLAMA_CPP in modes:
        llama, llama_note = _llama_peer(args.verifier, work, setup.engine)
        if llama is None:
            modes = [m for m in modes if m != LLAMA_CPP]
    from asymagent.evals.bench.machine_limits import machine_limits

    machine = machine_limits(setup.engine.verifier, getattr(args, "threads", None))

    def document(res: dict) -> dict:
        doc = {"verifier": setup.verifier, "drafter": setup.drafter, "drafter_fallback": setup.fallback,
               "workload": res["workload"], "modes": res["modes"], "pairs": res.get("pairs", {}),
               "settings": settings, "machine": machine, "runtime": setup.engine.runtime}
        if "partial" in res:
            doc["partial"] = res["partial"]
        return doc

    def save(res: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(document(res), f, indent=2)

    settings = {"repeats": args.repeats, "slow_peer_repeats": args.slow_peer_repeats,
                "max_new_tokens": args.max_new_tokens,
                "tool_choice": args.tool_choice, "prompt_lookup_num_tokens": args.prompt_lookup_tokens,
                "spec": setup.engine.spec.to_dict(),
                "compression": _compression_dict(setup.engine.compression),
                "total_wall_s": None,
                "dtype": str(resolve_dtype(args.dtype)[0]).removeprefix("torch.")
                if resolve_dtype(args.dtype)[1] is None else args.dtype, "compile": args.compile,
                "llama_cpp_note": llama_note,
                "hf_peers_note": "stock generate; hf_generate carries its DynamicCache across steps "
                                 "(prefills only the new tokens), hf_prompt_lookup and hf_assisted "
                                 "re-prefill the full prompt every step (transformers cannot give them "
                                 "a filled cache); hf_assisted uses transformers' default assistant schedule"}
    result = run_bench(setup.engine, work, modes, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                       tool_choice=args.tool_choice, prompt_lookup_tokens=args.prompt_lookup_tokens,
                       progress=not args.quiet, on_step=save, slow_peer_repeats=args.slow_peer_repeats,
                       engines=engines, llama=llama)
    settings["total_wall_s"] = time.perf_counter() - t0
    save(result)
    result = document(result)
    if not args.quiet:
        print_table(result)
    return 0


def _llama_peer(verifier: str, work: dict, engine) -> tuple:
    """(LlamaCppPeer or None, note): the llama.cpp peer on the verifier's GGUF file, or why not."""
    import torch

    from asymagent.evals.bench.llama_cpp_peer import LlamaCppPeer, available
    from asymagent.modeling.loading import find_embedded_gguf

    reason = available()
    if reason is not None:
        return None, f"skipped: {reason}"
    from asymagent.modeling.pairs import pair_name, verifier_path

    if verifier in ("default", "embedded", "smollm2"):
        gguf = find_embedded_gguf()
    elif pair_name(verifier) is not None:  # the pair's verifier GGUF (assembled already)
        gguf = verifier_path(verifier)
    elif str(verifier).endswith(".gguf"):
        gguf = verifier
    else:
        return None, f"skipped: the verifier {verifier} is not a GGUF file"
    peer = LlamaCppPeer(str(gguf), n_ctx=engine.max_positions or 8192, threads=torch.get_num_threads())
    return peer, f"llama-cpp-python {peer.version} on {gguf} (its own quantised kernels), greedy, prefix reuse"


def _compression_dict(compression) -> dict | None:
    if compression is None:
        return None
    dump = getattr(compression, "model_dump", None)
    return dump(mode="json") if dump else str(compression)
