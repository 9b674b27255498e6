"""KV caches: rollback after rejections equals a fresh prefill; prefix reuse across calls."""

from __future__ import annotations

import pytest
import torch

from asymagent.kv.cache import ModelCache, View, common_prefix_len
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts

ATOL = 1e-4  # fp32 logits of a 2-layer model: cached vs fresh differ by ~1e-6 (reduction order)


@pytest.fixture(scope="module")
def pair():
    verifier = make_model(seed=0)
    return verifier, make_model(seed=1, layers=1)  # unrelated drafter: many rejections


def _fresh_next_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]  # [V]


def test_crop_then_extend_equals_fresh_prefill(pair):
    model = pair[0]
    ids = random_prompts(1, length=20)[0]
    cache = ModelCache(model)
    cache.forward_logits(ids, keep=1)
    cache.crop(12)  # remove 8 tokens
    assert cache.tokens == ids[:12] and cache.cache.get_seq_length() == 12
    other = [5, 6, 7]
    got = cache.forward_logits(other, keep=1)[0]
    torch.testing.assert_close(got, _fresh_next_logits(model, ids[:12] + other), atol=ATOL, rtol=0)


@pytest.mark.parametrize("k", [1, 4])
def test_caches_after_rejections_equal_fresh_prefill(pair, k):
    verifier, drafter = pair
    # beta > 0: the drafter's compressed-view cache (the base pass) is built and checked too
    engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=k, beta=1.0))
    prompt = random_prompts(1, length=24, seed=3)[0]
    comp = prompt[8:]
    r = engine.generate(prompt, mode="asym", max_new_tokens=20, compressed_prompt_ids=comp)
    assert r.stats.drafted > r.stats.accepted  # rejections happened
    session = engine.caches.session("default")
    views = {"verifier_compressed": comp + r.token_ids, "drafter_full": prompt + r.token_ids,
             "drafter_compressed": comp + r.token_ids}
    for role, ids in views.items():
        cache = session.get(role)
        assert cache.tokens == ids[: len(cache.tokens)], role  # a prefix of its view
        assert len(cache.tokens) < len(ids), role  # the last token stays pending
        assert cache.cache.get_seq_length() == len(cache.tokens), role
        model = verifier if role.startswith("verifier") else drafter
        got = cache.forward_logits(ids[len(cache.tokens):], keep=1)[0]
        torch.testing.assert_close(got, _fresh_next_logits(model, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["full", "spec", "asym"])
def test_prefix_reuse_extended_prompt(pair, mode):
    verifier = pair[0]
    drafter = noisy_copy(verifier, 0.6)
    # fixed K: with adaptive K, a request that switched speculation off leaves the drafter's
    # caches behind the plain-decoded tokens, and the next request's drafter prefill (correctly)
    # includes them, so the suffix bound below would not be this test's subject any more
    spec = SpecConfig(k=3, adaptive_k=False)
    warm = Engine(verifier=verifier, drafter=drafter, spec=spec)
    cold = Engine(verifier=verifier, drafter=drafter, spec=spec)
    p1 = random_prompts(1, length=30, seed=5)[0]
    comp1 = p1[10:] if mode == "asym" else None
    first = warm.generate(p1, mode=mode, max_new_tokens=10, compressed_prompt_ids=comp1)
    # an agent step: history + the model's answer + a new message
    p2 = p1 + first.token_ids + [40, 41, 42, 43, 44]
    comp2 = p2[10:] if mode == "asym" else None
    session = warm.caches.session("default")
    ver_role = "verifier_compressed" if mode == "asym" else "verifier_full"
    held = len(session.get(ver_role).tokens)
    second = warm.generate(p2, mode=mode, max_new_tokens=10, compressed_prompt_ids=comp2)
    reference = cold.generate(p2, mode=mode, max_new_tokens=10, compressed_prompt_ids=comp2)
    assert second.token_ids == reference.token_ids
    ver_len = len(comp2) if mode == "asym" else len(p2)
    assert reference.stats.verifier_prefill_tokens == ver_len  # cold: everything
    assert second.stats.verifier_prefill_tokens == ver_len - held  # warm: only the suffix
    assert second.stats.verifier_prefill_tokens <= 5 + 1 + 1  # new message + pending tokens
    if mode != "full":
        # drafter full cache (+ base cache in asym) also prefill only their new suffixes
        assert second.stats.drafter_prefill_tokens < reference.stats.drafter_prefill_tokens
        assert second.stats.drafter_prefill_tokens <= (2 if mode == "asym" else 1) * 7


def test_rewritten_prompt_reuses_common_prefix_only(pair):
    verifier = pair[0]
    engine = Engine(verifier=verifier)
    p1 = random_prompts(1, length=30, seed=6)[0]
    engine.generate(p1, mode="full", max_new_tokens=4)
    p2 = p1[:20] + [9, 9, 9]  # diverges at position 20
    r = engine.generate(p2, mode="full", max_new_tokens=4)
    assert r.stats.verifier_prefill_tokens == 3  # positions 20..22
    assert r.token_ids == Engine(verifier=verifier).generate(p2, mode="full",
                                                             max_new_tokens=4).token_ids


def test_sessions_are_separate_and_bounded(pair):
    verifier = pair[0]
    engine = Engine(verifier=verifier, max_sessions=2)
    prompts = random_prompts(3, length=16, seed=7)
    for key, p in zip("abc", prompts):
        engine.generate(p, mode="full", max_new_tokens=2, cache_key=key)
    assert len(engine.caches) == 2  # "a" was evicted (least recently used)
    again_c = engine.generate(prompts[2], mode="full", max_new_tokens=2, cache_key="c")
    again_a = engine.generate(prompts[0], mode="full", max_new_tokens=2, cache_key="a")
    assert again_c.stats.verifier_prefill_tokens == 1  # warm: only the re-fed last token
    assert again_a.stats.verifier_prefill_tokens == 16  # cold again after eviction


def test_view_and_prefix_helpers():
    gen = [7, 8]
    view = View([1, 2, 3], gen)
    assert len(view) == 5 and view.tail(1) == [2, 3, 7, 8] and view.tail(4) == [8]
    gen.append(9)  # views share the generated list
    assert view.ids() == [1, 2, 3, 7, 8, 9]
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2 and common_prefix_len([], [1]) == 0


@pytest.mark.parametrize("mode", ["full", "spec", "asym"])
def test_the_verifier_cache_ends_a_request_as_a_one_token_decode_does(pair, mode):
    """After any request the verifier's cache holds the view's prompt and every emitted token but
    the last, whichever mode decoded it. Here an end token is emitted inside a speculative round
    (a perfect drafter's accepted draft, fed to the verifier with the round's other drafts): the
    next request's prefill must still start where mode full's does, so that it cuts the same
    rows into the same chunks (bf16 F.linear rounds a row by the chunk's size)."""
    verifier = pair[0]
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.0), spec=SpecConfig(k=4))
    prompt = random_prompts(1, length=24, seed=5)[0]
    plain = engine.generate(prompt, mode="full", max_new_tokens=16).token_ids
    stop_at = next(i for i in range(5, len(plain)) if plain[i] not in plain[:i])  # mid-output
    engine.caches.clear()
    engine.eos_ids = [plain[stop_at]]  # that token now ends the response (EOS kept)
    r = engine.generate(prompt, mode=mode, max_new_tokens=16)
    assert r.token_ids == plain[: stop_at + 1]
    role = "verifier_compressed" if mode == "asym" else "verifier_full"  # asym reads its view's cache
    cache = engine.caches.session("default").get(role)
    assert cache.tokens == (prompt + r.token_ids)[: len(prompt) + len(r.token_ids) - 1]
    assert cache.cache.get_seq_length() == len(cache.tokens)


@pytest.mark.slow
def test_full_and_spec_leave_the_verifier_cache_at_the_same_length_on_the_bench():
    """On the embedded default in its default dtype (bf16 on a CPU with bf16 matrix units), the
    bench's first steps leave mode full's and mode spec's verifier caches at the same length
    after every step (before, spec's held the constrained call's last token: its next prefill
    started one position later)."""
    from asymagent.evals.running.frontier import bench_conversation

    engine = Engine.from_default()
    steps = bench_conversation(4).steps
    lengths = {}
    for mode in ("full", "spec"):
        for step in steps:
            engine.chat(step.history, tools=step.tools, mode=mode, max_new_tokens=32,
                        temperature=0.0, tool_choice=step.tool_choice, cache_key=mode)
            lengths.setdefault(mode, []).append(len(engine.caches.session(mode).get("verifier_full")))
    assert lengths["full"] == lengths["spec"]
