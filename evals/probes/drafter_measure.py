"""Measure a drafter against its verifier: agreement, engine acceptance, speed ratio, cost.

`python -m asymagent.evals.probes.drafter_measure [--drafter PATH] --json OUT [--plot PNG] [--update-card]`
runs, on transcripts of the held-out domain (`training_domains.HELD_OUT_DOMAIN`, never trained on):
- teacher-forced greedy top-1 agreement (full vocabulary and the reduced draft vocabulary);
- the engine in modes full and spec (K, temperature 0), interleaved per prompt in one process:
  mean accepted length (tokens per verifier forward), acceptance_by_position, spec/full
  wall-time ratio (medians), and whether greedy spec reproduced full exactly (lossless check);
- the engine in mode asym (default compression) on the same conversations: acceptance and JSD;
- drafter cost vs verifier at a 1k-token context: one decode step (reduced head) and a prefill.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from asymagent.evals.probes.harness import run_verb


def heldout_conversations(n: int, seed: int = 4242) -> list[list[dict]]:
    """Held-out-domain episodes cut just before an assistant turn that follows a tool output."""
    from asymagent.training.domains import HELD_OUT_DOMAIN, domain_by_name, episode

    d, rng, out = domain_by_name(HELD_OUT_DOMAIN), random.Random(seed), []
    while len(out) < n:
        msgs = episode(d, rng)
        cuts = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and msgs[i - 1]["role"] == "tool"]
        out.append(msgs[:rng.choice(cuts)])
    return out


def _weighted(calls: list, key: str) -> float:
    rounds = sum(c.rounds for c in calls)
    return sum(getattr(c, key) * c.rounds for c in calls) / max(rounds, 1)


def _by_position(calls: list, k: int) -> list[float]:
    """Per position i: accepted / rounds that reached i, pooled over calls (weights = rounds)."""
    num, den = [0.0] * k, [0.0] * k
    for c in calls:
        for i, rate in enumerate(c.acceptance_by_position[:k]):
            num[i] += rate * c.rounds
            den[i] += c.rounds
    return [round(a / b, 4) if b else 0.0 for a, b in zip(num, den)]


def engine_figures(engine, convs: list[list[dict]], k: int, max_new: int, asym: bool = True) -> dict:
    """Interleaved full/spec (and asym) runs; medians of per-prompt wall times."""
    from tqdm import tqdm

    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.training.data import render_messages

    full_s, spec_s, spec_calls, asym_calls, same, asym_same = [], [], [], [], 0, 0
    for i, conv in enumerate(tqdm(convs, desc="engine full/spec/asym")):
        ids = render_messages(engine.tokenizer, conv, add_generation_prompt=True)
        order = ["full", "spec"] if i % 2 == 0 else ["spec", "full"]  # interleave: no order bias
        res = {}
        for mode in order:
            use_suffix_store(engine, mode)
            t = time.perf_counter()
            res[mode] = engine.generate(ids, mode=mode, max_new_tokens=max_new, temperature=0.0,
                                        seed=0, cache_key=f"m{i}{mode}")
            (full_s if mode == "full" else spec_s).append(time.perf_counter() - t)
        spec_calls.append(res["spec"].stats)
        same += res["spec"].token_ids == res["full"].token_ids
        if asym:
            use_suffix_store(engine, "asym")
            r = engine.chat(conv, mode="asym", max_new_tokens=max_new, temperature=0.0, seed=0,
                            cache_key=f"a{i}")
            asym_calls.append(r.stats)
            asym_same += r.token_ids == res["full"].token_ids
    out = {
        "prompts": len(convs), "k": k, "max_new_tokens": max_new,
        "mean_prompt_tokens": round(statistics.mean(c.full_context_tokens for c in spec_calls), 1),
        "spec": {"mean_accepted_len": round(_weighted(spec_calls, "mean_accepted_len"), 3),
                 "acceptance_by_position": _by_position(spec_calls, k),
                 "acceptance_rate": round(sum(c.accepted for c in spec_calls) / max(1, sum(c.drafted for c in spec_calls)), 4),
                 "greedy_identical_to_full": f"{same}/{len(convs)}",
                 "per_prompt_mean_accepted_len": [round(c.mean_accepted_len, 3) for c in spec_calls],
                 "median_wall_s": round(statistics.median(spec_s), 3)},
        "full": {"median_wall_s": round(statistics.median(full_s), 3)},
    }
    out["spec_over_full_wall_ratio"] = round(out["spec"]["median_wall_s"] / out["full"]["median_wall_s"], 3)
    if asym_calls:
        out["asym"] = {"mean_accepted_len": round(_weighted(asym_calls, "mean_accepted_len"), 3),
                       "acceptance_by_position": _by_position(asym_calls, k),
                       "mean_jsd": round(_weighted(asym_calls, "mean_jsd"), 4),
                       "max_call_mean_jsd": round(max(c.mean_jsd for c in asym_calls), 4),
                       "mean_compression_ratio": round(statistics.mean(c.compression_ratio for c in asym_calls), 3),
                       "identical_to_full": f"{asym_same}/{len(convs)}",
                       "median_wall_s": round(statistics.median(c.wall_s for c in asym_calls), 3)}
    return out


def cost_figures(verifier, drafter, draft_vocab, ctx: int = 1024, reps: int = 7) -> dict:
    """Median seconds: prefill of `ctx` tokens and one decode step at `ctx` context, both models.

    The drafter's decode step is what drafting costs: its layers plus the reduced head
    (hidden @ W[draft_vocab].T); the verifier's is a full forward with its full head.
    """
    import torch
    from transformers import DynamicCache

    ids = torch.randint(0, verifier.config.vocab_size, (1, ctx + 1))  # [1, ctx+1]
    head_rows = drafter.lm_head.weight[draft_vocab]  # [N, H]

    def timed(fn):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    out = {"context_tokens": ctx, "draft_vocab": int(len(draft_vocab))}
    with torch.no_grad():
        for name, model in (("verifier", verifier), ("drafter", drafter)):
            out[f"{name}_prefill_s"] = round(timed(lambda: model.model(input_ids=ids[:, :ctx])), 4)
            cache = DynamicCache()
            model.model(input_ids=ids[:, :ctx], cache=cache, use_cache=True)

            def step():
                h = model.model(input_ids=ids[:, ctx:], cache=cache, use_cache=True).last_hidden_state
                cache.crop(-1)  # back to ctx tokens (transformers 5: crop takes minus tokens to drop)
                return h[:, -1] @ (head_rows.T if model is drafter else model.lm_head.weight.T)

            out[f"{name}_decode_step_s"] = round(timed(step), 5)
    with torch.no_grad():  # head cost alone by draft-vocabulary size (the FR-Spec trade-off)
        h = torch.randn(1, verifier.config.hidden_size)  # [1, H]
        W = drafter.lm_head.weight
        out["head_s_by_vocab"] = {str(n): round(timed(lambda: h @ W[:n].T), 6)
                                  for n in (2000, 4000, 6000, 8000, 12000, W.shape[0])}
    out["drafter_decode_over_verifier"] = round(out["drafter_decode_step_s"] / out["verifier_decode_step_s"], 4)
    out["drafter_prefill_over_verifier"] = round(out["drafter_prefill_s"] / out["verifier_prefill_s"], 4)
    return out


def plot_acceptance(figures: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for mode in ("spec", "asym"):
        if mode in figures:
            rates = figures[mode]["acceptance_by_position"]
            ax.plot(range(1, len(rates) + 1), rates, marker="o",
                    label=f"{mode} (mean accepted len {figures[mode]['mean_accepted_len']})")
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(accept d_i | reached i)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Default drafter, held-out domain, K={figures['k']}, T=0")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_training(history: list[dict], path: str | Path) -> None:
    """Training loss (running mean over 20 steps) and held-out agreement against wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [h["elapsed_s"] / 60 for h in history]
    loss = [h["loss"] for h in history]
    smooth = [statistics.mean(loss[max(0, i - 19):i + 1]) for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(minutes, smooth, label="train loss (KL + 0.1 CE, mean of 20 steps)")
    ax.set_xlabel("wall minutes (2 shared CPU cores)")
    ax.set_ylabel("loss (nats)")
    ev = [(h["elapsed_s"] / 60, h["heldout_agree"]) for h in history if "heldout_agree" in h]
    if ev:
        ax2 = ax.twinx()
        ax2.plot(*zip(*ev), "o-", color="tab:green", label="held-out top-1 agreement")
        ax2.set_ylabel("held-out agreement")
        ax2.set_ylim(0, 1)
        ax2.legend(loc="center right")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", default="default",
                   help="'default' (shipped asset), a .safetensors drafter, or a training checkpoint.pt")
    p.add_argument("--draft-vocab", type=int, default=6000, help="draft vocabulary size (checkpoints only)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--lookup-ngram", type=int, default=0,
                   help="0 (default): the drafter alone, as issue 5's target; >0 adds prompt-lookup drafts")
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--no-asym", action="store_true")
    p.add_argument("--agreement-episodes", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", required=True)
    p.add_argument("--plot", default=None)
    p.add_argument("--history", default=None, help="a run's history.json: plot it to --history-plot")
    p.add_argument("--history-plot", default=None)
    p.add_argument("--update-card", action="store_true", help="write the figures into the drafter's card")


def main(args) -> int:
    import torch

    from asymagent.modeling.drafter import DEFAULT_DRAFTER_FILE, card_path_for, load_drafter
    from asymagent.training.distill import drafter_from_checkpoint, heldout_metrics
    from asymagent.engine import Engine
    from asymagent.modeling.loading import load_default_verifier
    from asymagent.spec_config import SpecConfig
    from asymagent.training.data import heldout_episodes

    torch.set_num_threads(args.threads)
    if args.history and args.history_plot:
        plot_training(json.loads(Path(args.history).read_text()), args.history_plot)
    loaded = load_default_verifier()
    path = DEFAULT_DRAFTER_FILE if args.drafter == "default" else Path(args.drafter)
    if path.suffix == ".pt":  # a training checkpoint (e.g. of a run still going)
        drafter = drafter_from_checkpoint(path, loaded.model, args.draft_vocab)
    else:
        drafter = load_drafter(path, loaded.model)
    vocab = drafter.asymagent_draft_vocab
    figures: dict = {"drafter": str(path), "verifier_sha256": loaded.fingerprint,
                     "lookup_ngram": args.lookup_ngram}
    seqs = [s[:2048] for s in heldout_episodes(loaded.tokenizer, args.agreement_episodes, seed=777)]
    figures["teacher_forced"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in
                                 heldout_metrics(loaded.model, drafter, seqs, draft_vocab=vocab).items()}
    print(json.dumps(figures["teacher_forced"]), flush=True)
    figures["cost_1k"] = cost_figures(loaded.model, drafter, vocab)
    print(json.dumps(figures["cost_1k"]), flush=True)
    spec = SpecConfig(k=args.k, lookup_ngram=args.lookup_ngram, adaptive_k=False)  # fixed K (issue 5)
    engine = Engine(verifier=loaded.model, drafter=drafter, tokenizer=loaded.tokenizer, spec=spec)
    figures["engine"] = engine_figures(engine, heldout_conversations(args.prompts), args.k, args.max_new,
                                       asym=not args.no_asym)
    print(json.dumps(figures["engine"]), flush=True)
    Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    if args.plot:
        plot_acceptance(figures["engine"], args.plot)
    if args.update_card:
        card_file = card_path_for(path)
        card = json.loads(card_file.read_text()) if card_file.is_file() else {}
        card["measured"] = figures
        card_file.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_verb(__doc__, "drafter_measure", add_arguments, main))
