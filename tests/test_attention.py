"""GQA-aware sdpa (asymagent/kv/attention.py): same logits as transformers' sdpa, masks still built."""

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
