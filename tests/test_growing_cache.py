"""GrowingCache == transformers' DynamicCache: the same tensors, the same logits, the same tokens.

Every comparison is exact (torch.equal / token ids): the growing cache only changes where the
K/V live (a preallocated buffer read through a view), never a value. `tiny_buffers` sets
HEADROOM = ALIGN = 1 so a buffer regrows every few tokens and each test crosses many growth
boundaries, including a regrow right after a crop.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from asymagent.kv import cache as cache_mod
from asymagent.kv import growing_cache
from asymagent.kv.cache import ModelCache
from asymagent.engine import Engine
from asymagent.kv.growing_cache import GrowingCache, GrowingLayer
from asymagent.kv.sliding_layer import SlidingLayer
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts


@pytest.fixture(params=["default", "tiny"])
def buffers(request, monkeypatch):
    """Default growth constants, or HEADROOM = ALIGN = 1 (a regrow every few tokens)."""
    if request.param == "tiny":
        monkeypatch.setattr(growing_cache, "HEADROOM", 1)
        monkeypatch.setattr(growing_cache, "ALIGN", 1)
    return request.param


def _assert_same(stock, grown):
    assert grown.get_seq_length() == stock.get_seq_length()
    assert len(grown.layers) == len(stock.layers)
    for a, b in zip(stock.layers, grown.layers):
        assert a.get_seq_length() == b.get_seq_length()
        if a.get_seq_length():
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


# (op, arg): update with T new positions, or crop(n); n > 0 keeps the first n (stock: n - length)
SCRIPT = [("update", 7), ("update", 1), ("crop", -3), ("update", 1), ("update", 300),
          ("crop", 0), ("update", 2), ("crop", -1), ("crop", 150), ("update", 1),
          ("update", 400), ("crop", -500), ("update", 1), ("crop", 10_000), ("update", 3)]


def test_update_crop_equal_stock_across_growth(buffers):
    gen = torch.Generator().manual_seed(0)
    layers = 3
    stock, grown = DynamicCache(), GrowingCache()
    for op, n in SCRIPT:
        if op == "update":
            for i in range(layers):
                k = torch.randn(1, 2, n, 8, generator=gen)  # [B, H_kv, T, D]
                v = torch.randn(1, 2, n, 8, generator=gen)
                ks, vs = stock.update(k, v, i)
                kg, vg = grown.update(k, v, i)
                assert torch.equal(ks, kg) and torch.equal(vs, vg)  # what attention reads
        else:
            grown.crop(n)
            length = stock.get_seq_length()
            stock.crop(min(n - length, 0) if n > 0 else n)
        _assert_same(stock, grown)
    assert all(type(layer) is GrowingLayer for layer in grown.layers)
    capacity = grown.layers[0]._k.shape[-2]
    assert capacity >= 551  # the longest length reached; crops keep the buffer


def test_config_layers_and_reset():
    from transformers import LlamaConfig, Qwen2Config

    cache = GrowingCache(config=LlamaConfig(num_hidden_layers=3, hidden_size=32,
                                            num_attention_heads=4, num_key_value_heads=2))
    assert [type(layer) for layer in cache.layers] == [GrowingLayer] * 3
    mixed = Qwen2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                        num_key_value_heads=2, use_sliding_window=True, sliding_window=16,
                        max_window_layers=1)
    stock = DynamicCache(config=mixed)
    grown = GrowingCache(config=mixed)
    growing = {DynamicLayer: GrowingLayer, DynamicSlidingWindowLayer: SlidingLayer}
    want = [growing.get(type(layer), type(layer)) for layer in stock.layers]
    assert [type(layer) for layer in grown.layers] == want
    assert SlidingLayer in want  # the sliding layer keeps its window + a rollback tail
    assert grown.layers[want.index(SlidingLayer)].sliding_window == 16
    k = torch.randn(1, 2, 5, 8)
    cache.update(k, k, 0)
    cache.layers[0].reset()
    assert cache.get_seq_length() == 0 and cache.layers[0]._k is None
    cache.update(k[:, :, :2], k[:, :, :2], 0)
    assert torch.equal(cache.layers[0].keys, k[:, :, :2])


def test_inference_buffer_written_outside_inference_mode():
    k = torch.randn(1, 2, 4, 8)
    cache = GrowingCache()
    with torch.inference_mode():
        cache.update(k, k, 0)  # buffer is an inference tensor
    keys, _ = cache.update(k, k, 0)  # plain no-grad mode: regrows into a normal tensor
    assert torch.equal(keys, torch.cat([k, k], dim=-2))


def _forward(model, cache, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0]


def test_model_logits_equal_stock(buffers):
    model = make_model(seed=0)
    ids = random_prompts(1, length=200, seed=5)[0]
    stock, grown = DynamicCache(config=model.config), GrowingCache(config=model.config)
    steps = [ids[:90], ids[90:150], [ids[150]], [ids[151]], ids[152:155]]
    for chunk in steps:  # chunked prefill, single-token decode, a 3-token verify
        assert torch.equal(_forward(model, stock, chunk), _forward(model, grown, chunk))
    for cache in (stock, grown):
        cache.crop(-20)  # rejected drafts
    for chunk in (ids[135:138], [ids[138]], ids[139:200]):
        assert torch.equal(_forward(model, stock, chunk), _forward(model, grown, chunk))
    _assert_same(stock, grown)


def _run_engines(monkeypatch, mode, prompts, k, compressed=None):
    verifier = make_model(seed=0, max_positions=4096)
    drafter = noisy_copy(verifier, noise=0.6)
    runs = {}
    for growing in (False, True):
        monkeypatch.setattr(cache_mod, "GROWING_KV", growing)
        # fixed K: adaptive K picks K from wall-clock timings, so the two runs could differ in
        # their accepted counts (not in their tokens) for reasons that are not the cache's
        engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=k, adaptive_k=False))
        outs = []
        for p in prompts:  # one session: prefix reuse + crop between calls
            comp = None if compressed is None else p[compressed:]
            outs.append(engine.generate(p, mode=mode, max_new_tokens=24, cache_key="c",
                                        compressed_prompt_ids=comp))
        runs[growing] = engine, outs
    (e0, stock), (e1, grown) = runs[False], runs[True]
    assert [r.token_ids for r in stock] == [r.token_ids for r in grown]
    assert [r.stats.accepted for r in stock] == [r.stats.accepted for r in grown]
    s0, s1 = e0.caches.session("c"), e1.caches.session("c")
    assert set(s0.caches) == set(s1.caches)
    for role, mc in s0.caches.items():
        assert isinstance(s1.caches[role].cache, GrowingCache), role
        assert not isinstance(mc.cache, GrowingCache), role
        assert s1.caches[role].tokens == mc.tokens, role
        _assert_same(mc.cache, s1.caches[role].cache)


@pytest.mark.parametrize("mode,k", [("full", 1), ("spec", 3), ("asym", 4)])
def test_engine_greedy_equal_with_both_caches(monkeypatch, buffers, mode, k):
    base = random_prompts(1, length=40, seed=11)[0]
    # an agent loop: the second prompt extends the first's output, the third diverges early
    prompts = [base, base + [7, 8, 9] + base[:20], base[:10] + random_prompts(1, 30, seed=12)[0]]
    _run_engines(monkeypatch, mode, prompts, k, compressed=5 if mode == "asym" else None)


def test_engine_long_prompt_chunked_prefill(monkeypatch):
    prompt = random_prompts(1, length=cache_mod.PREFILL_CHUNK + 300, seed=13)[0]
    _run_engines(monkeypatch, "spec", [prompt], k=3)


def test_model_cache_uses_the_switch(monkeypatch):
    model = make_model(seed=0)
    for growing, kind in ((True, GrowingCache), (False, DynamicCache)):
        monkeypatch.setattr(cache_mod, "GROWING_KV", growing)
        mc = ModelCache(model)
        mc.forward_logits([5, 6, 7], keep=1)
        assert type(mc.cache) is kind


# --- aligned attention reads (bf16 on the CPU): a position scores the same in any forward ---

def _bf16_gqa_model(seed: int = 3):
    from asymagent.kv.attention import use_gqa_attention

    model = make_model(seed=seed, hidden=128).to(torch.bfloat16)  # 4 query heads over 2 KV heads
    model.config._attn_implementation = "sdpa"
    assert use_gqa_attention(model)
    return model


@pytest.mark.parametrize("context", [60, 63, 127, 300, 511])
def test_aligned_reads_score_a_position_the_same_whatever_the_forward_length(context):
    """The logits of the first fed position are bit-identical for forwards of 1..32 tokens (a
    decode step vs a K+1 verify) once attention reads a multiple of 64 positions past the cache
    and a one-row forward takes the multi-row path (bf16, CPU)."""
    model = _bf16_gqa_model()
    ids = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(context))
    cache = GrowingCache(config=model.config, attend_align=growing_cache.ATTEND_ALIGN)
    with torch.inference_mode():
        model(ids, past_key_values=cache, use_cache=True)
        rows = {}
        for t in (1, 2, 3, 5, 9, 16, 17, 32):
            feed = torch.arange(7, 7 + t)[None]
            rows[t] = model(feed, past_key_values=cache, use_cache=True).logits[0, 0]  # [V]
            cache.crop(-t)
    for t, row in rows.items():
        assert torch.equal(row, rows[1]), f"position scored differently in a {t}-token forward"


def test_aligned_reads_keep_the_cached_length_and_mask_the_tail():
    """The padded tail is never attended: logits match the stock cache's to bf16 rounding, and
    the layer's keys keep their exact length."""
    model = _bf16_gqa_model()
    ids = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(1))
    aligned = GrowingCache(config=model.config, attend_align=growing_cache.ATTEND_ALIGN)
    stock = DynamicCache(config=model.config)
    with torch.inference_mode():
        for cache in (aligned, stock):
            model(ids, past_key_values=cache, use_cache=True)
        for t in (1, 4, 1):
            feed = torch.arange(9, 9 + t)[None]
            a = model(feed, past_key_values=aligned, use_cache=True).logits.float()
            b = model(feed, past_key_values=stock, use_cache=True).logits.float()
            assert torch.allclose(a, b, atol=0.1, rtol=0.02), (a - b).abs().max()
            assert a.argmax(-1).tolist() == b.argmax(-1).tolist()
    for layer in aligned.layers:
        assert layer.keys.shape[-2] == 70 + 6 == layer.get_seq_length()
        assert layer._k.shape[-2] % growing_cache.ALIGN == 0


def test_room_for_buffers_advance_write_as_update_does():
    """A caller that writes new positions into `buffers()` itself (the lean forward's direct road)
    and calls `advance` leaves the layer as `update` would; `room_for` says when it may."""
    layer = GrowingLayer(attend_align=64)
    stock = GrowingLayer(attend_align=64)
    g = torch.Generator().manual_seed(0)
    assert layer.room_for(1, torch.bfloat16, 2, 8) is None  # no buffers yet: update initialises
    first = torch.randn(1, 2, 10, 8, generator=g).bfloat16()
    for lay in (layer, stock):
        lay.update(first, first + 1)
    with torch.inference_mode():
        for rows in (1, 3, 1):
            k = torch.randn(1, 2, rows, 8, generator=g).bfloat16()
            read = layer.room_for(rows, torch.bfloat16, 2, 8)
            assert read == layer.attended(layer.get_seq_length() + rows)
            k_buf, v_buf = layer.buffers()
            start = layer.get_seq_length()
            k_buf[:, :, start:start + rows].copy_(k)
            v_buf[:, :, start:start + rows].copy_(k + 1)
            layer.advance(rows)
            stock.update(k, k + 1)
            assert torch.equal(layer.keys, stock.keys) and torch.equal(layer.values, stock.values)
        capacity = layer.buffers()[0].shape[-2]
        assert layer.room_for(capacity, torch.bfloat16, 2, 8) is None  # past the buffer: update grows
        assert layer.room_for(1, torch.float32, 2, 8) is None and layer.room_for(1, torch.bfloat16, 3, 8) is None
