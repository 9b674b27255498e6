"""`asymagent bench`: one long-horizon workload through every mode and the HF peers, in one process.

Workload: the first `--steps` assistant turns of one oracle episode (suite `records`, dev seed 0
by default), teacher-forced: each step's prompt is the oracle's history, so every mode and peer
decodes the same prompts. Our modes run through `engine.chat` with one cache session per mode
(agent loops append, so prefix reuse applies, as in a real run); the peers run stock
`generate` on the full rendered prompt (bench_peers.py; hf_generate carries its KV cache from step
to step, the speculative peers cannot). Repeats are interleaved (step-major,
mode order rotated per repeat) and the JSON reports medians. Default `--tool-choice auto`
(unconstrained) so that modes and peers compute the same thing and fidelity is comparable.

JSON (docs/architecture.md §6): {"verifier", "drafter", "workload": {...}, "settings": {...},
"modes": {name: {wall_s, per_step_s, output_tokens, verifier_prefill_tokens, verifier_flops,
fidelity_vs_full, speedup_vs_full, flops_vs_full, [acceptance_rate, mean_accepted_len,
acceptance_by_position]}}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

OUR_MODES = ("full", "compressed", "spec", "asym")
ALL_MODES = OUR_MODES + ("hf_generate", "hf_prompt_lookup", "hf_assisted")
SPECULATIVE = ("spec", "asym", "hf_prompt_lookup", "hf_assisted")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--modes", default=",".join(ALL_MODES),
                   help="comma list of modes and peers (mode labels may carry SpecConfig overrides, "
                        "e.g. asym:k=4)")
    p.add_argument("--suite", default="records", help="suite the workload comes from")
    p.add_argument("--seed", type=int, default=0, help="episode seed (a dev seed)")
    p.add_argument("--steps", type=int, default=12, help="teacher-forced steps (>= 12 for the contract run)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats; medians are reported")
    p.add_argument("--max-new-tokens", type=int, default=32, help="per step (the workload's calls take ~23)")
    p.add_argument("--tool-choice", default="auto", choices=("auto", "required"),
                   help="our modes' tool_choice (peers are unconstrained either way)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="hf_prompt_lookup's n-gram draft length")
    p.add_argument("--verifier", default="default", help="verifier (default: embedded SmolLM2)")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: the shipped one)")
    p.add_argument("--compression", metavar="FILE", default=None,
                   help="CompressionConfig YAML/JSON for the verifier's view (default: tool_output 64/32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")


def workload(suite: str, seed: int, steps: int) -> dict:
    """{"name", "steps", "histories": [messages], "tools", ...} from one oracle episode."""
    from asymagent.evals.environments import is_test_seed, make_env, oracle_episode

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


def check_modes(modes: list, repeats: int) -> None:
    """ValueError for a bad mode label, a missing 'full' or repeats < 1."""
    from asymagent.evals.bench_peers import PEERS
    from asymagent.evals.runner import parse_mode

    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    for m in modes:
        if m not in PEERS:
            parse_mode(m)
    if "full" not in modes:
        raise ValueError("the bench needs mode 'full' (speedup and fidelity are relative to it)")


def check_args(args) -> None:
    """Refuse mistakes before any model loads (`asymagent` prints them on one line, exit 2)."""
    from asymagent.evals.environments import SUITES
    from asymagent.evals.runner import split_mode_labels
    from asymagent.modeling.loading import check_drafter_source, check_model_source

    if args.suite not in SUITES:
        raise ValueError(f"unknown suite {args.suite!r}; use one of {', '.join(SUITES)}")
    check_modes(split_mode_labels(args.modes), args.repeats)
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
              on_step=None) -> dict:
    """Run the workload; returns {"modes": {name: summary}, "workload": {...}} (no model ids).

    `on_step(partial)` is called after every step of the first repeat with the same structure
    over the steps done so far (plus "partial": {"steps_done": k}); `main` uses it to keep a
    valid JSON on disk should a long run be cut short."""
    from tqdm.auto import tqdm

    from asymagent.evals.bench_peers import PEERS, PeerPrefix, run_peer
    from asymagent.evals.runner import parse_mode, spec_overrides
    from asymagent.stats import RunStats
    from asymagent.context.views import ContextViews

    check_modes(modes, repeats)
    histories, tools = work["histories"], work["tools"]
    views = ContextViews(tokenizer=engine.tokenizer, compression=engine.compression)
    prompts = [views.build(h, tools).full_ids for h in histories]  # [steps][P_i] full view ids
    eos = sorted(engine.eos_ids)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos[0]
    n = len(histories)
    info = {k: v for k, v in work.items() if k not in ("histories", "tools")}
    info["prompt_tokens"] = [len(p) for p in prompts]
    times = {m: [[0.0] * n for _ in range(repeats)] for m in modes}  # [repeat][step] seconds
    first: dict = {m: [None] * n for m in modes}  # first repeat's per-step record
    bar = tqdm(total=repeats * n * len(modes), desc="bench", disable=not progress)
    for r in range(repeats):
        order = modes[r % len(modes):] + modes[: r % len(modes)]  # rotate who goes first
        prefixes = {"hf_generate": PeerPrefix()}  # cold per repeat, like the modes' cache_key
        for i in range(n):
            for m in order:
                if m in PEERS:
                    rec = run_peer(m, engine.verifier, prompts[i], max_new_tokens=max_new_tokens,
                                   eos_ids=eos, pad_id=pad, flops=engine.flops, drafter=engine.drafter,
                                   prompt_lookup_tokens=prompt_lookup_tokens, prefix=prefixes.get(m))
                    times[m][r][i] = rec.wall_s
                else:
                    mode, overrides = parse_mode(m)
                    with spec_overrides(engine, overrides):
                        t0 = time.perf_counter()
                        rec = engine.chat(histories[i], tools=tools, mode=mode,
                                          max_new_tokens=max_new_tokens, temperature=0.0,
                                          tool_choice=tool_choice,
                                          cache_key=f"bench-{m}-{r}")  # cold session per repeat
                        times[m][r][i] = time.perf_counter() - t0
                if r == 0:
                    first[m][i] = rec
                bar.update(1)
            if r == 0 and on_step is not None and i + 1 < n:
                on_step({"workload": info, "modes": _summarize(modes, times, first, i + 1, 1),
                         "partial": {"steps_done": i + 1, "repeats_done": 0}})
    bar.close()
    return {"workload": info, "modes": _summarize(modes, times, first, n, repeats)}


def _summarize(modes: list, times: dict, first: dict, n: int, repeats: int) -> dict:
    """Per-mode summary over the first `n` steps and `repeats` repeats (medians over repeats)."""
    from asymagent.evals.bench_peers import PEERS
    from asymagent.evals.runner import parse_mode
    from asymagent.stats import RunStats

    out = {}
    full_ids = [list(rec.token_ids) for rec in first["full"][:n]]
    for m in modes:
        per_step = [statistics.median(times[m][r][i] for r in range(repeats)) for i in range(n)]
        recs = first[m][:n]
        d = {"wall_s": statistics.median(sum(times[m][r][:n]) for r in range(repeats)),
             "wall_s_repeats": [sum(times[m][r][:n]) for r in range(repeats)],
             "per_step_s": per_step,
             "output_tokens": sum(len(x.token_ids) for x in recs),
             "fidelity_vs_full": sum(list(x.token_ids) == f for x, f in zip(recs, full_ids)) / n}
        if m in PEERS:
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
            if parse_mode(m)[0] in ("spec", "asym"):
                d["acceptance_rate"] = tot["acceptance_rate"]
                d["mean_accepted_len"] = tot["mean_accepted_len"]
                d["acceptance_by_position"] = run.acceptance_by_position()
        out[m] = d
    for m, d in out.items():
        d["speedup_vs_full"] = out["full"]["wall_s"] / d["wall_s"] if d["wall_s"] else 0.0
        d["flops_vs_full"] = d["verifier_flops"] / out["full"]["verifier_flops"] if out["full"]["verifier_flops"] else 0.0
    return out


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
                        f"(median of {result['settings']['repeats']})")
    for col in ("mode", "wall s", "speedup", "s/step", "out tok", "ver prefill", "FLOPs vs full",
                "fidelity", "accept", "tok/fwd"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for m, d in result["modes"].items():
        table.add_row(m, f"{d['wall_s']:.2f}", f"{d['speedup_vs_full']:.2f}x",
                      f"{d['wall_s'] / max(len(d['per_step_s']), 1):.2f}", str(d["output_tokens"]),
                      str(d["verifier_prefill_tokens"]), f"{d['flops_vs_full']:.2f}",
                      f"{d['fidelity_vs_full']:.2f}",
                      f"{d['acceptance_rate']:.2f}" if "acceptance_rate" in d else "-",
                      f"{d['mean_accepted_len']:.2f}" if "mean_accepted_len" in d else "-")
    console = Console()
    Console(width=max(console.width, 140)).print(table)  # wide enough that mode names never fold
    print(f"drafter: {result['drafter']}")


def main(args) -> int:
    from asymagent.evals.engine_setup import build_engine

    from asymagent.evals.runner import split_mode_labels

    modes = split_mode_labels(args.modes)
    work = workload(args.suite, args.seed, args.steps)
    t0 = time.perf_counter()
    compression = None
    if args.compression:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig.from_file(args.compression)
    setup = build_engine(args.verifier, args.drafter, compression=compression)

    def document(res: dict) -> dict:
        doc = {"verifier": setup.verifier, "drafter": setup.drafter, "drafter_fallback": setup.fallback,
               "workload": res["workload"], "modes": res["modes"], "settings": settings}
        if "partial" in res:
            doc["partial"] = res["partial"]
        return doc

    def save(res: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(document(res), f, indent=2)

    settings = {"repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
                "tool_choice": args.tool_choice, "prompt_lookup_num_tokens": args.prompt_lookup_tokens,
                "spec": setup.engine.spec.to_dict(),
                "compression": _compression_dict(setup.engine.compression),
                "total_wall_s": None,
                "hf_peers_note": "stock generate; hf_generate carries its DynamicCache across steps "
                                 "(prefills only the new tokens), hf_prompt_lookup and hf_assisted "
                                 "re-prefill the full prompt every step (transformers cannot give them "
                                 "a filled cache); hf_assisted uses transformers' default assistant schedule"}
    result = run_bench(setup.engine, work, modes, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                       tool_choice=args.tool_choice, prompt_lookup_tokens=args.prompt_lookup_tokens,
                       progress=not args.quiet, on_step=save)
    settings["total_wall_s"] = time.perf_counter() - t0
    save(result)
    result = document(result)
    if not args.quiet:
        print_table(result)
    return 0


def _compression_dict(compression) -> dict | None:
    if compression is None:
        return None
    dump = getattr(compression, "model_dump", None)
    return dump(mode="json") if dump else str(compression)
