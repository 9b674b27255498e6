"""GQA-aware sdpa (asymagent/kv/attention.py): same logits as transformers' sdpa, masks still built."""

import contextlib

import torch

from asymagent.kv.attention import ATTN_NAME, use_gqa_attention
from conftest import make_tiny_llama


def _cached_then_verify(model, prompt, drafts):
    """Logits of a K+1-token forward on top of a cache of `prompt` [1, K+1, V]."""
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
        return model(drafts, cache=cache, use_cache=True).logits


def test_multi_token_forward_on_a_cache_is_bit_identical_to_sdpa():
    torch.manual_seed(3)
    prompt = torch.randint(0, 256, (1, 40))
    drafts = torch.randint(0, 256, (1, 4))  # a verify forward: several queries, causal among them
    model = make_tiny_llama(heads=4, kv_heads=2)
    assert model.config._attn_implementation == "sdpa"
    ref = _cached_then_verify(model, prompt, drafts)
    assert use_gqa_attention(model) and model.config._attn_implementation == ATTN_NAME
    got = _cached_then_verify(model, prompt, drafts)
    assert torch.equal(got, ref)
    # and both equal the uncached forward over the whole sequence (so the causal mask was built:
    # without it the drafts would see each other's future)
    with torch.no_grad():
        whole = model(torch.cat([prompt, drafts], dim=1)).logits[:, -4:]
    assert torch.allclose(got, whole, atol=1e-4)


def test_single_token_and_prefill_paths_unchanged():
    torch.manual_seed(4)
    ids = torch.randint(0, 256, (1, 33))
    model = make_tiny_llama(heads=4, kv_heads=1)
    ref_prefill = model(ids).logits
    ref_step = _cached_then_verify(model, ids[:, :-1], ids[:, -1:])
    use_gqa_attention(model)
    assert torch.equal(model(ids).logits, ref_prefill)
    assert torch.equal(_cached_then_verify(model, ids[:, :-1], ids[:, -1:]), ref_step)


def test_other_implementations_are_left_alone():
    model = make_tiny_llama()
    model.set_attn_implementation("eager")
    assert not use_gqa_attention(model)
    assert model.config._attn_implementation == "eager"


def test_grouped_rows_same_bits_as_per_head_attention(monkeypatch, cpu_kind):
    """bf16 decode/verify attention with a group's query heads as rows of one head equals the
    per-head call bit for bit (1..32 tokens over aligned key counts), one token included (which
    the per-head path runs as two rows): where this CPU's kernel gives the same bits (the probe
    `grouped_rows_exact`, which draws other data), the grouped path is taken and must agree on
    these draws too; where it does not, the per-head call is kept."""
    from types import SimpleNamespace

    from asymagent.kv import attention

    g = torch.Generator().manual_seed(7)  # not the probe's seed (0): fresh data for its verdict
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    for keys in (128, 704, 1536, 2048):
        k = torch.randn(1, 3, keys, 64, generator=g).to(torch.bfloat16)  # [1, Hkv, L, D]
        v = torch.randn(1, 3, keys, 64, generator=g).to(torch.bfloat16)
        for rows in (1, 2, 3, 5, 8, 16, 17, 31, 32):
            q = torch.randn(1, 9, rows, 64, generator=g).to(torch.bfloat16)  # [1, Hq, T, D]
            past = keys - 64
            mask = (torch.arange(keys)[None, :] <= (torch.arange(rows) + past)[:, None])[None, None]
            got, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
            monkeypatch.setattr(attention, "GROUP_ROWS", 0)
            want, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
            monkeypatch.undo()
            assert got.shape == want.shape == (1, rows, 9, 64)
            assert torch.equal(got, want), (keys, rows)


def test_grouped_rows_probe_decides_the_path(monkeypatch):
    """The grouped path runs exactly when the probe says this CPU gives the per-head bits, and
    on a CPU with AMX (where it was measured bit-identical and 2.2x faster) the probe says so."""
    from types import SimpleNamespace

    from asymagent.kv import attention
    from asymagent.modeling.cpu_dtype import cpu_bf16_support

    if cpu_bf16_support() == "amx_bf16":
        assert attention.grouped_rows_exact()
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    q = torch.randn(1, 9, 3, 64).to(torch.bfloat16)  # [1, Hq, T, D]
    k = torch.randn(1, 3, 128, 64).to(torch.bfloat16)  # [1, Hkv, L, D]
    mask = (torch.arange(128)[None, :] <= (torch.arange(3) + 64)[:, None])[None, None]
    calls = []
    real = attention._grouped_rows
    monkeypatch.setattr(attention, "_grouped_rows", lambda *a: calls.append(1) or real(*a))
    for exact in (True, False):
        monkeypatch.setattr(attention, "grouped_rows_exact", lambda threads=None, e=exact: e)
        calls.clear()
        attention.gqa_sdpa_forward(module, q, k, k, mask, scaling=0.125)
        assert len(calls) == (1 if exact else 0)


def _prefill_draw(dtype, keys=704, rows=70, seed=3):
    """A prefill-shaped call: `rows` new positions at the end of `keys` (aligned tail masked)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 9, rows, 64, generator=g).to(dtype)
    k = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
    v = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
    past = keys - rows - 5  # 5 masked positions past the last query (an aligned read)
    mask = (torch.arange(keys)[None, :] <= (torch.arange(rows) + past)[:, None])[None, None]
    return q, k, v, mask


def test_additive_mask_gives_sdpa_the_bits_of_its_bool_mask():
    """The per-head (prefill) path hands SDPA the additive form of the bool mask, built once a
    forward: what SDPA itself converts it to, so the output bits are those of the bool mask."""
    from asymagent.kv.attention import _additive

    sdpa = torch.nn.functional.scaled_dot_product_attention
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v, mask = _prefill_draw(dtype)
        want = sdpa(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)
        got = sdpa(q, k, v, attn_mask=_additive(mask, dtype), scale=0.125, enable_gqa=True)
        assert torch.equal(got, want), dtype


def test_prefill_path_builds_its_mask_once_per_forward(monkeypatch):
    """Every layer of a forward passes the same mask object: the additive mask is built for the
    first layer and reused by the rest (and rebuilt under per_layer_masks(), the A/B switch);
    each layer's output equals SDPA's on the bool mask."""
    import asymagent.kv.attention as attention

    built = []
    real = attention._additive
    monkeypatch.setattr(attention, "_additive", lambda m, d: built.append(1) or real(m, d))
    module = torch.nn.Module()
    module.num_key_value_groups = 3
    q, k, v, mask = _prefill_draw(torch.bfloat16)  # 70 rows: over GROUP_ROWS, the per-head path
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125,
                                                            enable_gqa=True).transpose(1, 2)
    for _ in range(3):  # three layers of one forward
        out, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
        assert torch.equal(out, want)
    assert len(built) == 1
    with attention.per_layer_masks():
        for _ in range(2):
            attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
    assert len(built) == 3
    _, _, _, other = _prefill_draw(torch.bfloat16, seed=4)  # the next forward: a new mask object
    attention.gqa_sdpa_forward(module, q, k, v, other, scaling=0.125)
    assert len(built) == 4
    with attention.sdpa_converts_masks():  # the probe's "before": the bool mask, SDPA converts it
        out, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
    assert len(built) == 4 and torch.equal(out, want)


def test_additive_mask_is_made_on_the_masks_device():
    """The per-head path also runs on CUDA: the additive mask must live where the bool mask does
    (checked with the meta device, which every machine has)."""
    from asymagent.kv.attention import _additive

    mask = torch.ones(1, 1, 3, 8, dtype=torch.bool, device="meta")
    out = _additive(mask, torch.bfloat16)
    assert out.device.type == "meta" and out.dtype == torch.bfloat16 and out.shape == mask.shape


def test_fresh_prefill_runs_causal_with_the_masks_bits(monkeypatch):
    """A prefill on an empty cache (the mask exactly causal from position 0, an aligned read's
    masked tail included) runs as `is_causal` (the kernel skips the blocks above the diagonal):
    the same bits as the masked call, in bf16 and float32, at sizes under and over the kernel's
    512-key blocks; with a position before the first row (a cache) it stays masked."""
    import asymagent.kv.attention as attention

    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal_calls = []

    def recording(*args, **kwargs):
        causal_calls.append(bool(kwargs.get("is_causal", False)))
        return sdpa(*args, **kwargs)

    module = torch.nn.Module()
    module.num_key_value_groups = 3
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (64, 100, 490, 1000):
            keys = -(-rows // 64) * 64 + (64 if rows == 64 else 0)  # aligned; one with a longer tail
            g = torch.Generator().manual_seed(rows)
            q = torch.randn(1, 9, rows, 64, generator=g).to(dtype)
            k = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
            v = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
            mask = (torch.arange(keys)[None, :] <= torch.arange(rows)[:, None])[None, None]
            want = sdpa(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True).transpose(1, 2)
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
            causal_calls.clear()
            got, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
            with attention.masked_fresh_prefill():  # the path before, for the A/B
                before, _ = attention.gqa_sdpa_forward(module, q, k, v, mask.clone(), scaling=0.125)
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
            assert causal_calls == [True, False], (dtype, rows)
            assert torch.equal(got, want) and torch.equal(before, want), (dtype, rows)
    q, k, v, mask = _prefill_draw(torch.bfloat16)  # 70 rows after 629 cached positions
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    causal_calls.clear()
    attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)
    assert causal_calls == [False]


def test_fresh_prefill_of_a_model_is_unchanged_by_the_causal_path(monkeypatch):
    """The engine's path (ModelCache: a GrowingCache with aligned reads in bf16, the lean forward
    where it attaches): a prefill from an empty cache takes the causal call in every layer and
    gives the logits it gives under its mask; a later chunk on the cache stays masked."""
    import asymagent.kv.attention as attention
    from asymagent.kv.cache import ModelCache

    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal_calls = []

    def recording(*args, **kwargs):
        causal_calls.append(bool(kwargs.get("is_causal", False)))
        return sdpa(*args, **kwargs)

    torch.manual_seed(5)
    ids = torch.randint(0, 256, (300,)).tolist()
    model = make_tiny_llama(heads=4, kv_heads=2).to(torch.bfloat16)
    assert use_gqa_attention(model)
    out = {}
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    for path in ("causal", "masked"):
        switch = attention.masked_fresh_prefill() if path == "masked" else contextlib.nullcontext()
        cache = ModelCache(model)
        causal_calls.clear()
        with switch:
            first = cache.forward_logits(ids[:200], keep=200)  # [200, V] from an empty cache
            later = cache.forward_logits(ids[200:], keep=100)  # [100, V] on 200 cached
        out[path] = (first, later, list(causal_calls))
    layers = model.config.num_hidden_layers
    assert out["causal"][2] == [True] * layers + [False] * layers
    assert out["masked"][2] == [False] * (2 * layers)
    assert torch.equal(out["causal"][0], out["masked"][0])
    assert torch.equal(out["causal"][1], out["masked"][1])


def test_fresh_prefill_stays_masked_off_the_cpu(monkeypatch):
    """The causal call is taken on the CPU only (what was measured; a CUDA kernel may align a
    non-square causal mask to the bottom right): on another device the fresh mask is used."""
    import asymagent.kv.attention as attention

    calls = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(bool(k.get("is_causal"))) or a[0])
    module = torch.nn.Module()
    module.num_key_value_groups = 3
    rows, keys = 100, 128
    q = torch.empty(1, 9, rows, 64, device="meta")
    k = torch.empty(1, 3, keys, 64, device="meta")
    mask = (torch.arange(keys)[None, :] <= torch.arange(rows)[:, None])[None, None].to("meta")
    monkeypatch.setattr(attention, "_fresh_causal", lambda m, n: True)  # as if it were fresh
    attention.gqa_sdpa_forward(module, q, k, k, mask, scaling=0.125)
    assert calls == [False]


def test_decode_attention_is_the_calls_mask_padded_or_none(cpu_kind):
    """The decode attention decision made once per forward (asymagent/kv/lean_forward.py's direct
    road, batched_forward.py): the additive mask `_grouped_rows` (or the per-head call) uses, its
    rows padded to the attention floor; None only where the call goes to another branch, never
    for rows under the floor (issue 53: a floor of 4 sent every decode off the road)."""
    from asymagent.kv import attention

    cpu = torch.device("cpu")
    floor = attention.attention_floor(torch.bfloat16)
    for rows in (1, 2, 3, 5):
        mask = (torch.arange(128)[None, :] <= (torch.arange(rows) + 100)[:, None])[None, None]  # [1, 1, T, 128]
        got = attention.decode_attention(rows, 9, 3, mask, torch.bfloat16, cpu)
        assert got is not None, rows
        if attention.grouped_rows_exact():
            padded = rows if 3 * rows >= floor else -(-floor // 3)
            assert got.grouped and got.rows == padded
            assert got.mask is attention._group_mask(mask, 3, padded, torch.bfloat16)  # the same memo entry
            assert got.mask.shape == (1, 1, 3 * padded, 128) and got.mask.dtype == torch.bfloat16
        else:
            assert not got.grouped and got.rows == max(rows, floor)
            assert got.mask.shape == (1, 1, max(rows, floor), 128)
    mask = (torch.arange(128)[None, :] <= (torch.arange(3) + 100)[:, None])[None, None]  # [1, 1, 3, 128]
    assert attention.decode_attention(3, 9, 3, mask, torch.float32, cpu) is None  # not bf16
    assert attention.decode_attention(3, 3, 3, mask, torch.bfloat16, cpu) is None  # no groups
    assert attention.decode_attention(3, 9, 3, None, torch.bfloat16, cpu) is None
    assert attention.decode_attention(2, 9, 3, mask, torch.bfloat16, cpu) is None  # rows != mask rows
    big = (torch.arange(128)[None, :] <= torch.arange(40)[:, None])[None, None]
    assert attention.decode_attention(40, 9, 3, big, torch.bfloat16, cpu) is None  # > GROUP_ROWS


def test_decode_attention_gives_the_general_calls_bits(cpu_kind):
    """`DecodeAttention` (run by the direct road and the batched forward) gives every row the bits
    `gqa_sdpa_forward` gives it, 1..32 rows, under every kind's floors and paths."""
    from types import SimpleNamespace

    from asymagent.kv import attention

    g = torch.Generator().manual_seed(11)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    for keys in (128, 704):
        k = torch.randn(1, 3, keys, 64, generator=g).to(torch.bfloat16)  # [1, Hkv, L, D]
        v = torch.randn(1, 3, keys, 64, generator=g).to(torch.bfloat16)
        for rows in (1, 2, 3, 4, 5, 8, 17, 32):
            q = torch.randn(1, 9, rows, 64, generator=g).to(torch.bfloat16)  # [1, Hq, T, D]
            mask = (torch.arange(keys)[None, :] <= (torch.arange(rows) + keys - 64)[:, None])[None, None]
            want, _ = attention.gqa_sdpa_forward(module, q, k, v, mask, scaling=0.125)  # [1, T, Hq, D]
            call = attention.decode_attention(rows, 9, 3, mask, torch.bfloat16, torch.device("cpu"))
            got = call(q, k, v, 0.125)
            assert got.shape == want.shape == (1, rows, 9, 64)
            assert torch.equal(got, want), (cpu_kind, keys, rows)
