"""What the coupled acceptance rule costs against rejection sampling ("exact") at temperature > 0.

Two measurements on the bench workload (suite `records`, dev seed 0, teacher-forced steps):

1. End to end, interleaved: every step of every seed runs through each configuration with
   acceptance="exact" and with "coupled" back to back (the order alternates per step), one
   cold cache session per (configuration, rule, seed). Reported per rule: wall time, new
   tokens, time per token, drafts accepted / drafted, mean accepted length (tokens per
   verifier forward in speculative rounds) and prompt-lookup rounds.
2. Per draft, exactly (`--analytic`): on the verifier's own sampled continuations, the
   acceptance probability of one model draft under each rule at the same positions, from
   the distributions p (verifier, nucleus-free, / T) and q (drafter on its draft vocabulary,
   / T): exact accepts with sum_x min(p, q) (the optimal coupling), coupled with
   P(argmax(log p + g) = argmax(log q + g)) = sum_i 1 / sum_j max(p_j / p_i, q_j / q_i)
   (Gumbel-max coupling; the sum over i runs over the `--top` tokens of min(p, q), the rest
   bounded by their min(p, q) mass, which is reported).

    python -m asymagent.evals.probes.coupling_cost --steps 12 --seeds 2 --temperature 0.7 \
        --configs spec,asym --analytic --json coupling.json
"""

from __future__ import annotations

import argparse
import time

from asymagent.evals.probes.harness import finish, parser

RULES = ("exact", "coupled")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=12, help="teacher-forced steps of records:seed0")
    p.add_argument("--seeds", type=int, default=2, help="sampling seeds per step")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--configs", default="spec,asym",
                   help="comma list of mode labels with SpecConfig overrides (as the bench's)")
    p.add_argument("--analytic", action="store_true", help="also the exact per-draft acceptance")
    p.add_argument("--top", type=int, default=64, help="tokens i summed exactly (--analytic)")


def _summary(records: list) -> dict:
    wall = sum(r["wall_s"] for r in records)
    tokens = sum(r["new_tokens"] for r in records)
    drafted = sum(r["drafted"] for r in records)
    accepted = sum(r["accepted"] for r in records)
    rounds = sum(r["rounds"] for r in records)
    return {"wall_s": round(wall, 3), "new_tokens": tokens,
            "s_per_token": round(wall / tokens, 5) if tokens else None,
            "drafted": drafted, "accepted": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "mean_accepted_len": round((accepted + rounds) / rounds, 4) if rounds else None,
            "rounds": rounds, "lookup_rounds": sum(r["lookup_rounds"] for r in records)}


def end_to_end(engine, work: dict, labels: list, *, seeds: int, temperature: float,
               max_new_tokens: int) -> dict:
    """{label: {rule: summary}}: each step and seed decoded under both rules back to back."""
    from asymagent.evals.running.runner import parse_mode, spec_overrides

    records: dict = {label: {rule: [] for rule in RULES} for label in labels}
    flip = 0
    for seed in range(seeds):
        for i, history in enumerate(work["histories"]):
            for label in labels:
                mode, overrides = parse_mode(label)
                order = RULES if flip % 2 == 0 else RULES[::-1]  # A B, then B A
                flip += 1
                for rule in order:
                    rules = {"acceptance": rule, "spec_acceptance": rule}
                    with spec_overrides(engine, {**overrides, **rules}):
                        t0 = time.perf_counter()
                        r = engine.chat(history, tools=work["tools"], mode=mode,
                                        max_new_tokens=max_new_tokens, temperature=temperature,
                                        seed=1000 * seed + i, cache_key=f"cc-{label}-{rule}-{seed}")
                        wall = time.perf_counter() - t0
                    s = r.stats
                    records[label][rule].append({
                        "step": i, "seed": seed, "wall_s": wall, "new_tokens": s.new_tokens,
                        "drafted": s.drafted, "accepted": s.accepted, "rounds": s.rounds,
                        "lookup_rounds": s.lookup_rounds})
    return {label: {rule: {**_summary(recs), "per_call": recs} for rule, recs in by_rule.items()}
            for label, by_rule in records.items()}


def coupled_acceptance(p, q, top: int) -> tuple[float, float]:
    """(P(Gumbel-max coupling agrees), mass left out) for distributions p, q [V] (torch)."""
    import torch

    support = torch.minimum(p, q)  # P(X = Y = i) <= min(p_i, q_i)
    idx = support.topk(min(top, int((support > 0).sum()))).indices if bool((support > 0).any()) \
        else support[:0].long()
    total = 0.0
    for i in idx.tolist():
        ratio = torch.maximum(p / p[i], q / q[i])  # [V]; the j = i term is 1
        total += float(1.0 / ratio.sum())
    return total, float(support.sum() - support[idx].sum())


def analytic(engine, work: dict, *, temperature: float, max_new_tokens: int, top: int) -> dict:
    """Per-draft acceptance of exact vs coupled on the verifier's own continuations."""
    import torch

    from asymagent.context.views import ContextViews
    from asymagent.kv.cache import decoder_of

    exact, coupled, left_out, positions = [], [], [], 0
    for i, history in enumerate(work["histories"]):
        r = engine.chat(history, tools=work["tools"], mode="full", max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=i, cache_key="cc-analytic")
        full = ContextViews(tokenizer=engine.tokenizer, compression=engine.compression).build(
            history, work["tools"]).full_ids  # what mode full's verifier read
        ids = list(full) + list(r.token_ids)
        start = len(full) - 1  # the logits there predict the first new token
        x = torch.tensor([ids[:-1]], device=engine.device)
        with torch.inference_mode():
            v = engine.verifier(input_ids=x, logits_to_keep=len(ids) - 1 - start).logits[0].float()
            hidden = decoder_of(engine.drafter)(input_ids=x).last_hidden_state[0, start:]
            d = engine.head.to_full(engine.head.draft_logits(hidden)).to(v.device)
        p_rows = torch.softmax(v / temperature, -1)  # [n, V]
        q_rows = torch.softmax(d / temperature, -1)  # [n, V]
        for p, q in zip(p_rows, q_rows):
            exact.append(float(torch.minimum(p, q).sum()))
            c, rest = coupled_acceptance(p, q, top)
            coupled.append(c)
            left_out.append(rest)
            positions += 1
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    return {"positions": positions, "exact_accept": round(mean(exact), 4),
            "coupled_accept": round(mean(coupled), 4),
            "coupled_over_exact": round(mean(coupled) / mean(exact), 4) if exact else None,
            "coupled_mass_left_out": round(mean(left_out), 6)}


def main(argv=None) -> int:
    from asymagent.evals.bench.bench import workload
    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.evals.running.runner import split_mode_labels

    p = parser(__doc__, "coupling_cost")
    add_arguments(p)
    args = p.parse_args(argv)
    work = workload("records", 0, args.steps)
    setup = build_engine("default", None)
    labels = split_mode_labels(args.configs)
    t0 = time.perf_counter()
    out = {"verifier": setup.verifier, "drafter": setup.drafter, "workload": work["name"],
           "steps": args.steps, "seeds": args.seeds, "temperature": args.temperature,
           "max_new_tokens": args.max_new_tokens,
           "end_to_end": end_to_end(setup.engine, work, labels, seeds=args.seeds,
                                    temperature=args.temperature,
                                    max_new_tokens=args.max_new_tokens)}
    if args.analytic:
        out["per_draft"] = analytic(setup.engine, work, temperature=args.temperature,
                                    max_new_tokens=args.max_new_tokens, top=args.top)
    out["total_s"] = round(time.perf_counter() - t0, 1)
    for label, by_rule in out["end_to_end"].items():
        for rule, s in by_rule.items():
            print(f"{label:28s} {rule:8s} wall {s['wall_s']:8.2f} s  tokens {s['new_tokens']:5d}  "
                  f"s/token {s['s_per_token']}  accept {s['acceptance_rate']}  "
                  f"mean accepted len {s['mean_accepted_len']}  lookup rounds {s['lookup_rounds']}")
    if "per_draft" in out:
        print("per draft:", out["per_draft"])
    return finish(out, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
