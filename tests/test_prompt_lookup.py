"""Prompt-lookup drafts: the n-gram search, and that the engine stays lossless with them on."""

from __future__ import annotations

from collections import Counter

import pytest

from asymagent.engine import Engine
from asymagent.decoding.lookup_drafter import lookup_continuation
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts
from test_engine_sampling import two_sample_chi2


def test_longest_suffix_ngram_latest_occurrence_wins():
    ids = [5, 6, 7, 1, 2, 9, 6, 7, 3, 4, 8, 6, 7]
    # suffix 3-gram (8, 6, 7) never occurred; 2-gram (6, 7) occurred twice: the latest is used
    assert lookup_continuation(ids, max_ngram=3, k=2) == [3, 4]
    # a longer match beats a more recent shorter one
    ids = [1, 2, 3, 10, 11, 9, 2, 3, 20, 1, 2, 3]
    assert lookup_continuation(ids, max_ngram=3, k=4) == [10, 11, 9, 2]
    assert lookup_continuation(ids, max_ngram=3, k=100)[-1] == 3  # stops at the end of the view


def test_no_match_and_bad_arguments():
    assert lookup_continuation([1, 2, 3, 4], max_ngram=3, k=4) == []
    assert lookup_continuation([7], max_ngram=3, k=4) == []
    assert lookup_continuation([], max_ngram=2, k=4) == []
    # unigram matches only when asked for (min_ngram=1)
    assert lookup_continuation([4, 5, 6, 4], max_ngram=2, k=2) == []
    assert lookup_continuation([4, 5, 6, 4], max_ngram=2, k=2, min_ngram=1) == [5, 6]
    with pytest.raises(ValueError):
        lookup_continuation([1, 2], max_ngram=0, k=2)
    with pytest.raises(ValueError):
        SpecConfig(lookup_ngram=-1)
    with pytest.raises(ValueError):
        SpecConfig(lookup_k=0)


def _repetitive_prompts(n: int) -> list:
    # each prompt repeats its own first half, so suffix n-grams match earlier in the view
    return [p + p[:6] for p in random_prompts(n, length=14, seed=5)]


@pytest.fixture(scope="module")
def verifier():
    return make_model(seed=0)


@pytest.mark.parametrize("lookup_k", [1, 4, 8])
@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_greedy_with_lookup_equals_full(verifier, mode, lookup_k):
    full = Engine(verifier=verifier)
    # asym with beta=0, exact acceptance and no compression is lossless too
    spec = SpecConfig(k=2, lookup_ngram=3, lookup_k=lookup_k, beta=0.0, acceptance="exact")
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=spec)
    lookups = accepted = 0
    for prompt in _repetitive_prompts(10):
        expected = full.generate(prompt, mode="full", max_new_tokens=20).token_ids
        r = engine.generate(prompt, mode=mode, max_new_tokens=20)
        assert r.token_ids == expected
        lookups += r.stats.lookup_rounds
        accepted += r.stats.accepted
        assert r.stats.lookup_rounds <= r.stats.rounds
    assert lookups > 0  # the repeated halves do trigger lookup drafts
    assert accepted > 0


def test_lookup_on_by_default_off_in_the_paper_setting(verifier):
    prompt = _repetitive_prompts(1)[0]
    default = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=SpecConfig())
    paper = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=SpecConfig.paper())
    assert default.generate(prompt, mode="spec", max_new_tokens=12).stats.lookup_rounds > 0
    assert paper.generate(prompt, mode="spec", max_new_tokens=12).stats.lookup_rounds == 0
    assert SpecConfig.paper().acceptance == "cda" and SpecConfig.paper(k=4).k == 4


N = 600  # samples per mode (~15 s on a busy 2-core machine)
PROMPT = [17, 90, 200, 45, 3, 128, 77, 64, 17, 90, 200]  # suffix (17, 90, 200) recurs: drafts 45, 3, ..


@pytest.fixture(scope="module")
def samples():
    verifier = make_model(seed=0, vocab=256, head_scale=0.35)  # flat: many categories per position
    spec = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.5),
                  spec=SpecConfig(k=2, lookup_ngram=3, lookup_k=3))
    full = Engine(verifier=verifier)
    out = {"spec": [], "full": [], "lookups": 0}
    for i in range(N):
        r = spec.generate(PROMPT, mode="spec", max_new_tokens=3, temperature=1.0, seed=i)
        out["spec"].append(r.token_ids)
        out["lookups"] += r.stats.lookup_rounds
        out["full"].append(full.generate(PROMPT, mode="full", max_new_tokens=3, temperature=1.0,
                                         seed=N + i).token_ids)
    return out


@pytest.mark.parametrize("position", range(3))
def test_sampling_with_lookup_matches_the_verifier(samples, position):
    # same test and threshold as tests/test_engine_sampling.py: two-sample chi-square per
    # position, p > 1e-3 (a correct sampler fails for < 1 in 1000 seed choices per position)
    a = Counter(s[position] for s in samples["spec"] if len(s) > position)
    b = Counter(s[position] for s in samples["full"] if len(s) > position)
    p, df = two_sample_chi2(a, b)
    print(f"position {position}: p={p:.3g} df={df}")
    assert df >= 5
    assert p > 1e-3
    # every first round is a lookup round (the prompt's suffix always matches)
    assert samples["lookups"] >= N


def test_cpu_rounds_verify_at_most_31_drafts(verifier, monkeypatch):
    """A verify forward of more than 32 rows scores positions with other bits than a one-token
    forward on the CPU (asymagent/decoding/round.py CPU_MAX_DRAFTS), so copied drafts are capped
    at 31 whatever lookup_k asks, and spec still equals full."""
    import asymagent.decoding.round as round_mod
    from asymagent.decoding.round import CPU_MAX_DRAFTS

    prompt = list(range(5, 45)) * 3  # a long repeat: prompt lookup could copy 40+ tokens
    drafted = []
    real = round_mod.Decoder._round

    def spy(self, drafts, t0, rule):
        drafted.append(len(drafts))
        return real(self, drafts, t0, rule)

    monkeypatch.setattr(round_mod.Decoder, "_round", spy)
    spec = SpecConfig(k=2, lookup_ngram=3, lookup_k=48, suffix=False, adaptive_k=False)
    engine = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.5), spec=spec)
    full = engine.generate(prompt, mode="full", max_new_tokens=60).token_ids
    r = engine.generate(prompt, mode="spec", max_new_tokens=60)
    assert r.token_ids == full
    assert drafted and max(drafted) <= CPU_MAX_DRAFTS == 31
