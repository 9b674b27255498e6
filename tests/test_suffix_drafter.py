"""Suffix drafting: the matching's numbers, the bounded store, losslessness, and the per-step choice."""

from __future__ import annotations

import numpy as np
import pytest

from asymagent.decoding.adaptive_k import AdaptiveK, DraftChoice
from asymagent.decoding.suffix_match import SEP, speculate
from asymagent.decoding.suffix_store import SuffixStore
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts


def _spec(ids, **kw):
    arr = np.asarray(ids, dtype=np.int32)
    opts = dict(max_tokens=8, factor=4.0, min_prob=0.0, max_depth=32, min_match=1)
    opts.update(kw)
    return speculate(arr, arr, **opts)


def test_frequency_beats_recency_and_probabilities_are_count_ratios():
    # after (1, 2): 7 followed twice, 9 once (the latest); the query's own final occurrence
    # has no continuation and is not counted, so p(7) = 2 / 3 at match (1, 2)
    ids = [1, 2, 7, 5, 1, 2, 7, 6, 1, 2, 9, 8, 1, 2]
    d = _spec(ids, max_tokens=1)
    assert d.tokens == [7] and d.match_len == 2
    assert d.probs == [pytest.approx(2 / 3)]
    # equally frequent children: the most recent occurrence wins (prompt lookup's choice)
    d = _spec([1, 2, 7, 5, 1, 2, 9, 6, 1, 2], max_tokens=1)
    assert d.tokens == [9]


def test_draft_length_adapts_to_the_match_and_min_prob_prunes():
    ids = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 5]
    # only a 1-token match (5): factor 2 allows 2 tokens
    assert _spec(ids, factor=2.0, max_tokens=8).tokens == [6, 7]
    ids = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 3, 4, 5]
    d = _spec(ids, factor=2.0, max_tokens=5)  # 3-token match, capped at 5
    assert d.tokens == [6, 7, 8, 9, 10] and d.match_len == 3
    # a path splits 50/50 after (20, 21): min_prob 0.6 stops before the split
    ids = [20, 21, 22, 30, 1, 20, 21, 22, 31, 2, 20, 21, 22]
    assert _spec(ids, min_prob=0.0, max_tokens=2).tokens[:1] in ([30], [31])
    assert _spec(ids, min_prob=0.6, max_tokens=4).tokens == []


def test_no_match_or_continuation_crosses_a_separator():
    arr = np.asarray([1, 2, 3, SEP, 4, 5, SEP], dtype=np.int32)
    ctx = np.asarray([9, 2, 3], dtype=np.int32)
    assert speculate(arr, ctx, max_tokens=4, factor=4.0, min_prob=0.0).tokens == []
    ctx = np.asarray([9, 1, 2], dtype=np.int32)
    assert speculate(arr, ctx, max_tokens=4, factor=4.0, min_prob=0.0).tokens == [3]
    ctx = np.asarray([3, 4], dtype=np.int32)  # 3 | SEP | 4 is not a match for (3, 4)
    assert speculate(arr, ctx, max_tokens=4, factor=4.0, min_prob=0.0, min_match=2).tokens == []


def test_store_is_bounded_lru_and_persists(tmp_path):
    store = SuffixStore(max_requests=5, max_tokens=100)
    rng = np.random.default_rng(0)
    for i in range(200):
        store.add(rng.integers(0, 50, size=int(rng.integers(1, 40))).tolist())
        assert len(store) <= 5 and store.num_tokens <= 100
    # a response a draft was copied from becomes most recent and survives the next evictions
    store = SuffixStore(max_requests=3, max_tokens=1000)
    store.add([100, 101, 102, 103], request_id="a")
    store.add([200, 201], request_id="b")
    store.add([300, 301], request_id="c")
    d = store.speculate(np.asarray([7, 100, 101], dtype=np.int32), max_tokens=2, factor=2.0,
                        min_prob=0.0, min_match=2)
    assert d.tokens == [102, 103]
    store.add([400], request_id="d")  # evicts b, the least recently used, not a
    assert store.speculate(np.asarray([100, 101], dtype=np.int32), max_tokens=2, factor=2.0,
                           min_prob=0.0, min_match=2).tokens == [102, 103]
    assert store.speculate(np.asarray([7, 200], dtype=np.int32), max_tokens=1, factor=2.0,
                           min_prob=0.0).tokens == []
    # persistence: written on add, read back by a new store on the same path
    path = tmp_path / "suffix.npz"
    saved = SuffixStore(max_requests=4, path=path)
    saved.add([1, 2, 3, 4, 5])
    saved.add([6, 7, 8])
    loaded = SuffixStore(max_requests=4, path=path)
    assert len(loaded) == 2 and loaded.num_tokens == 8
    assert loaded.speculate(np.asarray([1, 2], dtype=np.int32), max_tokens=3, factor=2.0,
                            min_prob=0.0, min_match=2).tokens == [3, 4, 5]


def _repetitive_prompts(n: int) -> list:
    return [p + p[:6] for p in random_prompts(n, length=14, seed=5)]


@pytest.fixture(scope="module")
def verifier():
    return make_model(seed=0)


@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_greedy_with_suffix_drafts_equals_full(verifier, mode):
    full = Engine(verifier=verifier)
    # asym with beta=0, exact acceptance and no compression is lossless too
    spec = SpecConfig(k=2, lookup_k=8, beta=0.0, acceptance="exact", suffix=True,
                      suffix_min_prob=0.0)
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=spec)
    suffix_rounds = 0
    for prompt in _repetitive_prompts(8) * 2:  # the second pass also copies from the store
        expected = full.generate(prompt, mode="full", max_new_tokens=20).token_ids
        r = engine.generate(prompt, mode=mode, max_new_tokens=20)
        assert r.token_ids == expected
        suffix_rounds += r.stats.draft_source.get("suffix", 0)
        assert sum(r.stats.draft_source.values()) >= r.stats.rounds
    assert suffix_rounds > 0
    assert len(engine.suffix_store) > 0


def test_draft_choice_switches_off_a_losing_source():
    choice = DraftChoice(AdaptiveK(k=2))
    assert choice.budgets(2, {"suffix": 8}) == {"suffix": 8, "model": 2}
    assert not choice.want_probe()
    for _ in range(choice.min_rounds - 1):  # 1 token per 0.2 s
        assert not choice.want_probe()  # t_plain decides nothing before a source can be judged
        choice.record_round("suffix", 8, 0, 1, 0.0, 0.2)
    assert choice.want_probe()  # one round from the copied drafts' judgment
    choice.record_plain(0.05)  # plain: 20 tokens/s
    assert not choice.want_probe()
    choice.record_round("suffix", 8, 0, 1, 0.0, 0.2)
    assert not choice.copy_enabled and choice.budgets(2, {"suffix": 8})["suffix"] == 0
    assert choice.enabled  # the model has not lost yet
    winner = DraftChoice(AdaptiveK(k=2))
    winner.record_round("suffix", 8, 7, 8, 0.0, 0.1)
    winner.record_plain(0.05)
    for _ in range(4):
        winner.record_round("suffix", 8, 7, 8, 0.0, 0.1)  # 80 tokens/s
    assert winner.copy_enabled


def test_plain_probe_waits_for_a_judgment_of_the_model():
    """Model rounds alone: the first probe comes when the drafter model is one round from being
    judged against plain decoding, then every probe_every rounds."""
    choice = DraftChoice(AdaptiveK(k=2))
    for _ in range(choice.model.min_rounds - 1):
        assert not choice.want_probe()
        choice.record_round("model", 2, 2, 3, 0.01, 0.05)
    assert choice.want_probe()
    choice.record_plain(0.04)
    for _ in range(choice.model.probe_every - 1):
        choice.record_round("model", 2, 2, 3, 0.01, 0.05)
        assert not choice.want_probe()
    choice.record_round("model", 2, 2, 3, 0.01, 0.05)
    assert choice.want_probe()

