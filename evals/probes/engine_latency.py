"""Per-token latency of mode full vs spec on the embedded verifier (interleaved A/B, medians).

    python -m asymagent.evals.probes.engine_latency [--tokens 48] [--repeats 3] [--k 2] [--json out.json]

Drafters measured (all share the verifier's tokenizer, embeddings and head):
- `l2-full`: the verifier's first two layers + its final norm and full 49k-row head
  (asymagent.modeling.drafter.build_drafter, untrained);
- `l2-vocab8k`: the same with the reduced draft vocabulary = the 8192 lowest ids (BPE gives low
  ids to frequent merges; a trained drafter ships a measured one);
- `l2-vocab8k-adaptive`: the same with adaptive_k (speculation switched off when it loses);
- `default` when the trained drafter asset is present (asymagent.modeling.drafter.load_default_drafter);
- `file-drafter` (+ adaptive) for a drafter file given with `--drafter PATH`.
Every prompt runs every configuration back to back (cold caches each call), `repeats` times;
we report medians of decode seconds per new token, of wall seconds per call, and acceptance.
"""

from __future__ import annotations

import argparse
import json
import statistics

from asymagent.evals.probes.harness import finish, run_verb

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for writing clear technical documentation.",
    "You are an agent with a search tool. The user asks for the population of Lyon. "
    "Describe your next step.",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per call")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all prompts")
    parser.add_argument("--k", type=int, default=2, help="draft tokens per round")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--drafter", default=None,
                        help="also measure this asymagent drafter file (.safetensors)")
    parser.add_argument("--skip-untrained", action="store_true",
                        help="leave out the untrained 2-layer drafter configurations")


def main(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from asymagent.modeling.drafter import build_drafter
    from asymagent.engine import Engine
    from asymagent.modeling.loading import load_default_verifier
    from asymagent.spec_config import SpecConfig

    loaded = load_default_verifier()
    verifier, tok = loaded.model, loaded.tokenizer
    two = build_drafter(verifier, 2)
    vocab = torch.arange(8192)
    configs = {"full": (Engine(verifier=verifier, tokenizer=tok), "full")}
    untrained = {
        "spec l2-full": (Engine(verifier=verifier, drafter=two, tokenizer=tok,
                                spec=SpecConfig(k=args.k)), "spec"),
        "spec l2-vocab8k": (Engine(verifier=verifier, drafter=two, tokenizer=tok,
                                   spec=SpecConfig(k=args.k), draft_vocab=vocab), "spec"),
        "spec l2-vocab8k-adaptive": (Engine(verifier=verifier, drafter=two, tokenizer=tok,
                                            spec=SpecConfig(k=args.k, adaptive_k=True),
                                            draft_vocab=vocab), "spec"),
    }
    if not args.skip_untrained:
        configs.update(untrained)
    if args.drafter:
        from asymagent.modeling.drafter import load_drafter

        given = load_drafter(args.drafter, verifier)
        for name, spec in (("spec file-drafter", SpecConfig(k=args.k)),
                           ("spec file-drafter-adaptive", SpecConfig(k=args.k, adaptive_k=True))):
            configs[name] = (Engine(verifier=verifier, drafter=given, tokenizer=tok, spec=spec),
                             "spec")
    try:
        from asymagent.modeling.drafter import load_default_drafter

        trained = load_default_drafter(verifier, verifier_fingerprint=loaded.fingerprint)
        configs["spec default-drafter"] = (Engine(verifier=verifier, drafter=trained,
                                                  tokenizer=tok, spec=SpecConfig(k=args.k)),
                                           "spec")
    except (ImportError, FileNotFoundError, ValueError) as exc:
        print(f"(no trained default drafter: {exc})")
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True) for p in PROMPTS]
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    rows = {name: {"per_token_s": [], "wall_s": [], "accepted": 0, "drafted": 0, "same": 0,
                   "calls": 0} for name in configs}
    reference = {}
    work = [(r, i, name) for r in range(args.repeats) for i in range(len(prompt_ids))
            for name in configs]
    for rep, i, name in tqdm(work, desc="interleaved A/B", unit="call"):
        engine, mode = configs[name]
        engine.caches.clear()  # cold caches: every call prefills its prompt
        out = engine.generate(prompt_ids[i], mode=mode, max_new_tokens=args.tokens)
        s, row = out.stats, rows[name]
        row["per_token_s"].append(s.decode_s / max(s.new_tokens, 1))
        row["wall_s"].append(s.wall_s)
        row["accepted"] += s.accepted
        row["drafted"] += s.drafted
        row["calls"] += 1
        if name == "full":
            reference[i] = out.token_ids
        row["same"] += int(out.token_ids == reference.get(i))
    base = statistics.median(rows["full"]["per_token_s"])
    report = {}
    for name, row in rows.items():
        med = statistics.median(row["per_token_s"])
        report[name] = {
            "median_decode_ms_per_token": round(1000 * med, 2),
            "median_wall_s": round(statistics.median(row["wall_s"]), 3),
            "speedup_vs_full": round(base / med, 3),
            "acceptance_rate": round(row["accepted"] / row["drafted"], 3) if row["drafted"] else None,
            "identical_to_full": f"{row['same']}/{row['calls']}",
        }
    for name, r in report.items():
        print(f"{name:28s} {json.dumps(r)}")
    return finish({"tokens": args.tokens, "repeats": args.repeats, "k": args.k, "configs": report}, args.json)


if __name__ == "__main__":
    raise SystemExit(run_verb(__doc__, "engine_latency", add_arguments, main))
