"""Tiny random Llama pairs for the engine tests (non-degenerate: they do not just copy the input).

conftest's `make_tiny_llama` scales tied embeddings by 8, which makes every model predict "repeat
the last token" with ~98% probability: two such models always agree, so the reject path would
never run. Here the embeddings and an untied head are redrawn from N(0, 1): top-1 probability
is then ~0.66 on average (measured over random prompts), distributions differ between seeds, and
`noisy_copy` gives a drafter that agrees with its verifier often but not always.
"""

from __future__ import annotations

import copy

import torch

from conftest import make_tiny_llama


def make_model(seed: int = 0, vocab: int = 256, layers: int = 2, hidden: int = 64,
               head_scale: float = 1.0, max_positions: int = 2048):
    """A LlamaForCausalLM with N(0,1) embeddings and an untied N(0, head_scale^2) head."""
    model = make_tiny_llama(vocab_size=vocab, layers=layers, hidden=hidden, seed=seed,
                            max_positions=max_positions)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.copy_(torch.randn(emb.shape, generator=gen))
        model.lm_head.weight = torch.nn.Parameter(
            torch.randn(model.lm_head.weight.shape, generator=gen) * head_scale)
    return model.eval()


def noisy_copy(model, noise: float, seed: int = 7):
    """A copy of `model` with Gaussian noise (std `noise`) added to its head: a partial drafter."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = out.lm_head.weight
        w.add_(torch.randn(w.shape, generator=gen) * noise)
    return out.eval()


def random_prompts(n: int, length: int = 12, vocab: int = 256, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    # ids from 3 up: 0-2 are special in the tiny config (bos=1, eos=pad=2)
    return [torch.randint(3, vocab, (length,), generator=gen).tolist() for _ in range(n)]


def greedy_modes_agree(engine, prompts: int = 2, length: int = 30, seed: int = 5,
                       max_new_tokens: int = 20) -> int:
    """Asserts greedy full, spec and asym give the same tokens on random prompts; returns how many
    drafts spec rejected (> 0: the rollback path ran)."""
    rejected = 0
    for prompt in random_prompts(prompts, length=length, seed=seed):
        full = engine.generate(prompt, mode="full", max_new_tokens=max_new_tokens, cache_key="f")
        sp = engine.generate(prompt, mode="spec", max_new_tokens=max_new_tokens, cache_key="s")
        asym = engine.generate(prompt, mode="asym", max_new_tokens=max_new_tokens, cache_key="a")
        assert full.token_ids == sp.token_ids == asym.token_ids
        rejected += sp.stats.drafted - sp.stats.accepted
    return rejected


def test_models_are_not_degenerate():
    model = make_model(0)
    prompts = torch.tensor(random_prompts(16))
    with torch.no_grad():
        probs = model(prompts).logits[:, -1].softmax(-1)  # [16, V]
    top1 = probs.max(-1).values.mean().item()
    # ~0.66 measured; the band only checks we are far from uniform (1/256) and from the ~0.98 of
    # the copying conftest models, so both accept and reject paths occur.
    assert 0.3 < top1 < 0.9
    copies = (probs.argmax(-1) == prompts[:, -1]).float().mean().item()
    assert copies < 0.5  # it does not just repeat the last token
