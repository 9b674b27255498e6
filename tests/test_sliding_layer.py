"""SlidingLayer: sliding-window caches that roll back past the window (asymagent/kv/sliding_layer.py).

The reference is the model's own forward over the whole sequence without a cache (transformers
builds the sliding-window mask itself): every logit the engine's cache gives after chunked
prefill, decodes, K+1 verifies, rollbacks within the tail and rollbacks past it (the cache is
dropped and re-prefilled) must match it.
"""

from __future__ import annotations

import random

import pytest
import torch

from asymagent.kv import sliding_layer
from asymagent.kv.cache import ModelCache
from asymagent.kv.growing_cache import GrowingLayer, croppable_to
from asymagent.kv.sliding_layer import SlidingLayer
from asymagent.kv.static_cache import StaticKVOptions
from families import make_family

WINDOW = 8


def _reference(model, ids: list) -> torch.Tensor:
    """Logits [T, V] of the whole sequence, no cache (transformers' own sliding mask)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_logits_match_full_forward_through_rollbacks(family, static, monkeypatch):
    monkeypatch.setattr(sliding_layer, "TAIL", 4)  # a short tail: shifts and refusals happen often
    model = make_family(family, vocab=256, window=WINDOW, seed=3)
    rng = random.Random(0)
    seq = [rng.randrange(3, 256) for _ in range(1000)]
    # static: the StaticKV (CUDA graphs' and the compiled CPU path's cache) with its band mask
    cache = ModelCache(model, static=StaticKVOptions() if static else None)
    fed: list = []  # the token ids whose K/V the cache should hold

    def feed(n: int) -> None:
        ids = seq[len(fed):len(fed) + n]
        pos = len(cache.tokens)
        assert cache.tokens == fed[:pos]
        todo = fed[pos:] + ids  # what a dropped cache must re-feed first
        got = cache.forward_logits(todo, keep=len(todo))
        fed.extend(ids)
        want = _reference(model, fed)[pos:]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))

    feed(20)  # prefill past the window
    kinds = {type(layer) for layer in cache.cache.layers}
    if not static:
        assert SlidingLayer in kinds and (family != "gemma3_text" or GrowingLayer in kinds)
    resets = 0
    for step in range(80):
        feed(rng.choice([1, 2, 4, 5, 8, 16]))  # a decode, a K+1 verify, a prefill chunk
        # rejected drafts (1-4: within the tail) or, every 20 steps, a new turn's longer cut (40:
        # past what the buffer still holds once its window has moved on: refused, re-prefilled)
        back = 40 if step % 20 == 19 else rng.choice([0, 0, 1, 3, 4])
        if 0 < back < len(fed):
            keep = len(fed) - back
            ok = static or croppable_to(cache.cache, keep)  # a StaticKV holds every position
            cache.crop(keep)
            del fed[keep:]
            assert ok == (len(cache.tokens) == keep)  # refused crops drop the cache
            resets += not ok
            assert ok or back > 4  # within the tail: always served without a re-prefill
    assert (resets > 0) != static  # the refusal path ran (and re-prefilled correctly)
    if static:
        return
    sliding = next(layer for layer in cache.cache.layers if isinstance(layer, SlidingLayer))
    assert sliding.keys.shape[-2] <= 2 * (WINDOW - 1 + 4) + 64  # bounded: window + tail, not the length


def test_window_held_and_crop_refusal():
    layer = SlidingLayer(sliding_window=4, tail=2)
    k = torch.arange(200, dtype=torch.float32).view(1, 1, 200, 1).expand(1, 2, 200, 3).contiguous()
    with torch.inference_mode():
        keys, _ = layer.update(k[:, :, :10], k[:, :, :10])
        assert keys.shape[-2] == 10  # a prefill from 0 reads all its own positions
        assert layer.get_mask_sizes(1) == (4, 7)  # a decode at 10 reads 7, 8, 9 and itself
        for i in range(10, 200):
            keys, _ = layer.update(k[:, :, i:i + 1], k[:, :, i:i + 1])
            assert keys[0, 0, :, 0].tolist() == [i - 3, i - 2, i - 1, i]  # the window, exactly
    assert layer.get_seq_length() == 200 and layer.keys.shape[-2] < 64  # old positions dropped
    assert layer.can_crop_to(195)  # window (3) + tail (2) kept before the length
    assert not layer.can_crop_to(100)
    with pytest.raises(RuntimeError, match="re-prefill"):
        layer.crop(100)
    layer.crop(-5)  # rejected drafts, as far as the tail reaches
    with torch.inference_mode():
        keys, _ = layer.update(k[:, :, 195:196], k[:, :, 195:196])
    assert keys[0, 0, :, 0].tolist() == [192, 193, 194, 195]


def test_aligned_reads_mask_the_tail():
    layer = SlidingLayer(sliding_window=100, attend_align=64)
    k = torch.randn(1, 2, 300, 8)
    with torch.inference_mode():
        layer.update(k[:, :, :250], k[:, :, :250])
        for rows in (1, 4):
            length, offset = layer.get_mask_sizes(rows)
            assert offset == 151 and length % 64 == 0 and length > 99 + rows
        keys, _ = layer.update(k[:, :, 250:254], k[:, :, 250:254])
    assert keys.shape[-2] == 128 and torch.equal(keys[:, :, :103], k[:, :, 151:254])


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_engine_static_and_dynamic_agree_past_the_window(family):
    """Greedy spec == full on the dynamic cache and on the StaticKV (the CUDA-graph path's cache
    and its one-call rounds, run eagerly here), over prompts of one session that extend each
    other far past the window."""
    from asymagent.engine import Engine
    from asymagent.modeling.drafter import build_drafter
    from asymagent.spec_config import SpecConfig

    model = make_family(family, vocab=256, window=WINDOW, seed=4)
    drafter = build_drafter(model, num_layers=1)
    rng = random.Random(1)
    first = [rng.randrange(3, 256) for _ in range(40)]
    extra = [[rng.randrange(3, 256) for _ in range(5)] for _ in range(3)]  # each turn's new text
    runs = {}
    for static in (False, True):
        engine = Engine(verifier=model, drafter=drafter, static_kv=static,
                        spec=SpecConfig(k=4, adaptive_k=False))
        assert bool(engine.static_roles) == static
        for mode in ("full", "spec"):
            out, prompt = [], list(first)
            for turn in range(3):  # each prompt extends the last with its answer and new text
                r = engine.generate(prompt, mode=mode, max_new_tokens=16, cache_key=mode)
                out.append(r.token_ids)
                prompt = prompt + r.token_ids + extra[turn]
            runs[static, mode] = out
    assert runs[False, "spec"] == runs[False, "full"] == runs[True, "full"] == runs[True, "spec"]
