"""Probes of the KV layer: growing cache vs stock DynamicCache, GQA-aware sdpa vs stock sdpa (A/B timings).

    python -m asymagent.evals.probes.kv_probes growing-cache [--prompt-tokens 4000 --new-tokens 32 --repeats 8]
    python -m asymagent.evals.probes.kv_probes attention [--context 2000 --queries 3 --repeats 12]

Both interleave A and B in one process and print medians and ratios; the growing-cache probe also
checks that both caches decode the same token ids.
"""

from __future__ import annotations

import sys

import torch

from asymagent.kv.attention import ATTN_NAME, register
from asymagent.evals.probes.harness import median_ms_of, parser, timed

def _probe_prompt(tokenizer, n_tokens: int) -> list:
    """~n_tokens of deterministic natural text: this package's own source, tokenized."""
    import pathlib

    text = "".join(p.read_text() for p in sorted(pathlib.Path(__file__).parents[1].rglob("*.py")))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < n_tokens:
        ids = (ids * (n_tokens // max(len(ids), 1) + 1))
    return ids[:n_tokens]


def growing_cache_probe(argv: list | None = None) -> None:
    """`python -m asymagent.evals.probes.kv_probes growing-cache`: full-context greedy decode, stock vs growing, A/B."""
    from asymagent.kv import cache as cache_mod
    from asymagent.engine import Engine

    p = parser(growing_cache_probe.__doc__, "kv_probes growing-cache", with_json=False, repeats=8)
    p.add_argument("--prompt-tokens", type=int, default=4000, help="prompt length (tokens)")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens decoded per run")
    args = p.parse_args(argv)
    try:
        engine = Engine.from_default()
    except Exception as exc:  # noqa: BLE001 - mode "full" needs no drafter
        from asymagent.modeling.loading import load_default_verifier

        print(f"(no default drafter: {exc}; verifier only, mode full needs none)")
        loaded = load_default_verifier()
        engine = Engine(verifier=loaded.model, tokenizer=loaded.tokenizer)
    prompt = _probe_prompt(engine.tokenizer, args.prompt_tokens)
    kinds = {"stock": False, "growing": True}  # cache_key -> cache.GROWING_KV
    saved = cache_mod.GROWING_KV
    times: dict = {k: [] for k in kinds}
    outputs: dict = {}
    print(f"torch threads {torch.get_num_threads()}, prompt {len(prompt)} tokens, "
          f"{args.new_tokens} new tokens, {args.repeats} A/B pairs")
    try:
        for name, growing in kinds.items():  # warm-up: the 4k prefill, once per session
            cache_mod.GROWING_KV = growing
            outputs[name] = engine.generate(prompt, mode="full", max_new_tokens=args.new_tokens,
                                            cache_key=name).token_ids
        for _ in range(args.repeats):
            for name in kinds:  # warm sessions: crop back to the prompt, decode again
                r, seconds = timed(engine.generate, prompt, mode="full", max_new_tokens=args.new_tokens,
                                   cache_key=name)
                times[name].append(seconds)
                if r.token_ids != outputs[name]:
                    raise SystemExit(f"{name}: the decode changed between runs")
    finally:
        cache_mod.GROWING_KV = saved
    kinds_used = {n: type(engine.caches.session(n).get("verifier_full").cache).__name__
                  for n in kinds}
    same = outputs["stock"] == outputs["growing"]
    print(f"caches: {kinds_used}; token ids identical: {same} ({len(outputs['stock'])} tokens)")
    base = median_ms_of(times["stock"])
    for name, ts in times.items():
        med = median_ms_of(ts)
        per_token = med / len(outputs[name])
        print(f"{name:8s} median {med:8.1f} ms  ({per_token:6.2f} ms/token,"
              f" {base / med:.3f}x vs stock)  runs: {' '.join(f'{t * 1e3:.0f}' for t in ts)}")
    if not same:
        raise SystemExit("stock and growing caches decoded different tokens")




def attention_probe(argv: list | None = None) -> None:
    """`python -m asymagent.evals.probes.kv_probes attention`: time one cached K+1-token forward, sdpa vs ours, A/B."""
    import copy

    from asymagent.modeling.loading import load_model

    p = parser(attention_probe.__doc__, "kv_probes attention", with_json=False, repeats=12)
    p.add_argument("--context", type=int, default=2000, help="cached positions")
    p.add_argument("--queries", type=int, default=3, help="tokens fed on top (K+1)")
    args = p.parse_args(argv)
    model = load_model("default").model
    register()
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.context), generator=gen)  # [1, C]
    new = torch.randint(0, vocab, (1, args.queries), generator=gen)  # [1, K+1]
    times: dict = {"sdpa": [], ATTN_NAME: []}
    with torch.inference_mode():
        cache = model(prompt, use_cache=True).past_key_values
        for _ in range(args.repeats):
            for name in times:
                model.set_attn_implementation(name)
                fresh = copy.deepcopy(cache)
                times[name].append(timed(model, new, cache=fresh, use_cache=True)[1])
    base = median_ms_of(times["sdpa"])
    for name, ts in times.items():
        med = median_ms_of(ts)
        print(f"{name:16s} {med:8.1f} ms  ({base / med:.2f}x vs sdpa)")



PROBES = {"growing-cache": growing_cache_probe, "attention": attention_probe}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROBES:
        raise SystemExit(f"usage: python -m asymagent.evals.probes.kv_probes {{{'|'.join(PROBES)}}} [options]")
    PROBES[sys.argv[1]](sys.argv[2:])
