"""Same seed, same output? Reruns of one request, and speculation against the verifier alone, seed by seed.

    python -m asymagent.evals.probes.determinism [--seeds 30] [--prompts 16] [--json PATH]
    python -m asymagent.evals.probes.determinism --bench "asym:acceptance=cda,lookup_ngram=0,adaptive_k=false"

Tiny random models (a 2-layer Llama verifier over 256 tokens and a noisy copy of it as the
drafter), the Engine API, real wall-clock timings (adaptive K on, as by default):
- `rerun`: generate(prompt, mode="spec", temperature=1.0, seed=s) twice per seed, per rule;
  how many seeds gave different tokens;
- `vs_full`: mode spec against mode full with the same seed, prompts x seeds, per rule; how
  many runs gave different tokens (coupled: 0 by construction; exact: equal in distribution only).
`--bench LABEL` instead decodes the bench workload (records dev seed 0, 12 steps, greedy) twice
in one process with the given mode label and reports the steps whose tokens differ.
"""

from __future__ import annotations

import time

from asymagent.evals.probes.harness import finish, parser

RULES = ("exact", "coupled")


def tiny_pair(vocab: int = 256, seed: int = 0):
    """(verifier, drafter): a random 2-layer Llama with N(0, 0.7^2) head, and a noisy copy."""
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    verifier = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        verifier.model.embed_tokens.weight.copy_(torch.randn((vocab, 64), generator=gen))
        verifier.lm_head.weight.copy_(torch.randn((vocab, 64), generator=gen) * 0.7)
        drafter = copy.deepcopy(verifier)
        drafter.lm_head.weight.add_(torch.randn((vocab, 64), generator=gen) * 0.5)
    return verifier, drafter.eval()


def run_tiny(seeds: int, prompts: int, new_tokens: int) -> dict:
    import torch

    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig

    verifier, drafter = tiny_pair()
    gen = torch.Generator().manual_seed(0)
    texts = [torch.randint(3, 256, (12,), generator=gen).tolist() for _ in range(prompts)]
    full = Engine(verifier=verifier)
    out = {}
    for rule in RULES:
        engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(
            k=3, acceptance=rule, spec_acceptance=rule, beta=0.0))
        kw = dict(mode="spec", max_new_tokens=new_tokens, temperature=1.0)
        rerun = sum(engine.generate(texts[0], seed=s, **kw).token_ids
                    != engine.generate(texts[0], seed=s, **kw).token_ids for s in range(seeds))
        differ = sum(engine.generate(p, seed=s, **kw).token_ids
                     != full.generate(p, mode="full", max_new_tokens=new_tokens, temperature=1.0,
                                      seed=s).token_ids
                     for p in texts for s in range(seeds))
        out[rule] = {"rerun_differs": rerun, "reruns": seeds,
                     "vs_full_differs": differ, "vs_full_runs": prompts * seeds}
    return out


def run_bench_twice(label: str, steps: int = 12) -> dict:
    from asymagent.evals.bench.bench import workload
    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.evals.running.runner import parse_mode, spec_overrides

    work = workload("records", 0, steps)
    engine = build_engine("default", None).engine
    mode, overrides = parse_mode(label)
    runs = []
    for r in range(2):
        ids = []
        for h in work["histories"]:
            with spec_overrides(engine, overrides):
                ids.append(engine.chat(h, tools=work["tools"], mode=mode, max_new_tokens=32,
                                       temperature=0.0, cache_key=f"det-{r}").token_ids)
        runs.append(ids)
    differ = [i for i in range(steps) if runs[0][i] != runs[1][i]]
    return {"label": label, "overrides": overrides, "steps": steps, "differing_steps": differ}


def main(argv=None) -> int:
    p = parser(__doc__, "determinism")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=20)
    p.add_argument("--bench", metavar="LABEL", help="decode the bench workload twice with LABEL")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.bench:
        out = run_bench_twice(args.bench)
    else:
        out = run_tiny(args.seeds, args.prompts, args.new_tokens)
    out["total_s"] = round(time.perf_counter() - t0, 1)
    return finish(out, args.json, show=True)


if __name__ == "__main__":
    raise SystemExit(main())
