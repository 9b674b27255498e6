"""Same seed, same output: randomness keyed by position, and outputs that ignore K and timings.

Adaptive K picks K (and switches speculation off) from wall-clock timings. These tests replace
its decisions with a seeded random schedule (`chaotic_k`), so two runs of one request see
different K per round, different probe steps and a different switch-off point, as two runs on
a loaded machine would, without relying on machine load. Where `SpecConfig.position_invariant`
holds (greedy at T = 0, coupled at T > 0: every token is the target's argmax / Gumbel-max at its
position) the tokens must not change; cda and exact decide per round, so the loop keeps their
K fixed and the schedules must not matter either. Coupled speculation must equal mode full per seed (docs/engine.md, "Sampling").
"""

from __future__ import annotations

import random

import pytest
import torch

import asymagent.decoding.loop as loop_mod
from asymagent.decoding.adaptive_k import AdaptiveK, DraftChoice
from asymagent.decoding.noise import KeyedNoise, key_seed
from asymagent.engine import Engine
from asymagent.spec_config import MODE_TABLE, SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts

NEW = 18


@pytest.fixture(scope="module")
def pair():
    verifier = make_model(seed=0, head_scale=0.7)
    return verifier, noisy_copy(verifier, 0.5)


def repetitive_prompts(n: int, seed: int = 3) -> list:
    # each prompt repeats its first half, so prompt lookup finds drafts to copy
    return [p + p[:8] for p in random_prompts(n, length=16, seed=seed)]


def chaotic_k(monkeypatch, chaos: int) -> None:
    """Replace adaptive K's timing-driven choices with a random schedule seeded by `chaos`."""
    rng = random.Random(chaos)

    class ChaoticK(AdaptiveK):
        def _choose(self) -> None:
            self.k = rng.randint(self.k_min, self.k_max)
            if self.rounds >= 2 and rng.random() < 0.1:
                self.enabled = False  # "speculation loses": plain steps from here on

    class ChaoticChoice(DraftChoice):  # the loop asks the draft choice for probe steps
        def want_probe(self) -> bool:
            return self.enabled and self.spec_rounds > 0 and rng.random() < 0.2

    monkeypatch.setattr(loop_mod, "AdaptiveK", ChaoticK)
    monkeypatch.setattr(loop_mod, "DraftChoice", ChaoticChoice)


def test_keyed_noise_depends_on_the_key_only():
    a, b = KeyedNoise(7, 50), KeyedNoise(7, 50)
    b.gumbel(3), b.uniform(0), b.gate_noise(1, 4)  # other draws first: no effect on later ones
    assert torch.equal(a.gumbel(5), b.gumbel(5))
    assert torch.equal(a.uniform(2), b.uniform(2))
    assert torch.equal(a.gate_noise(2, 3).exponential, b.gate_noise(2, 3).exponential)
    assert not torch.equal(a.gumbel(5), a.gumbel(6))  # positions differ
    assert not torch.equal(a.gumbel(5), KeyedNoise(8, 50).gumbel(5))  # seeds differ
    assert len({key_seed(7, 5, p) for p in ("gumbel", "accept", "residual")}) == 3
    with pytest.raises(ValueError):
        key_seed(7, 5, "other")
    # Gumbel(0, 1): mean = Euler's constant 0.5772, sd = pi / sqrt(6) = 1.28; over 64 x 50
    # draws the mean's sd is 0.023, so +-0.1 is a 4-sigma band
    g = KeyedNoise(1, 50).gumbel_rows(0, 64)
    assert abs(float(g.mean()) - 0.5772) < 0.1


def test_position_invariance_of_the_rules():
    spec, asym = MODE_TABLE["spec"], MODE_TABLE["asym"]
    for t in (0.0, 0.7):
        assert SpecConfig().position_invariant(asym, t)
        assert SpecConfig().position_invariant(spec, t)
        assert not SpecConfig(acceptance="cda").position_invariant(asym, t)
        assert not SpecConfig(fuse_bonus=False).position_invariant(asym, t)
    assert SpecConfig(acceptance="exact").position_invariant(asym, 0.0)  # exact at T=0 is greedy
    assert not SpecConfig(acceptance="exact").position_invariant(asym, 0.7)
    assert not SpecConfig(spec_acceptance="exact").position_invariant(spec, 0.7)
    assert SpecConfig(acceptance="cda").rule_for(asym, 0, 0.7) == "cda"
    assert SpecConfig(acceptance="cda", strict_prefix=4).rule_for(asym, 0, 0.7) == "coupled"
    assert SpecConfig().rule_for(spec, 0, 0.0) == "greedy"
    with pytest.raises(ValueError):
        SpecConfig(spec_acceptance="cda")
    with pytest.raises(ValueError):
        SpecConfig(adaptive_k="False")  # a truthy string must not leave adaptive K on


def _run(engine, prompt, mode, temperature, seed):
    compressed = prompt[6:] if MODE_TABLE[mode].compressed else None
    return engine.generate(prompt, mode=mode, max_new_tokens=NEW, temperature=temperature,
                           seed=seed, top_p=0.95, compressed_prompt_ids=compressed).token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("mode", ["full", "compressed", "spec", "asym"])
def test_same_seed_same_tokens_whatever_adaptive_k_does(pair, monkeypatch, mode, k, temperature):
    verifier, drafter = pair
    spec = SpecConfig(k=k, k_max=5, adaptive_k=True)
    assert spec.position_invariant(MODE_TABLE[mode], temperature)
    engine = Engine(verifier=verifier, drafter=drafter, spec=spec)
    fixed = Engine(verifier=verifier, drafter=drafter,
                   spec=SpecConfig(k=k, k_max=5, adaptive_k=False))
    changed = 0
    for i, prompt in enumerate(repetitive_prompts(2)):
        runs = []
        for chaos in (1, 2):  # two different K schedules, probes and switch-off points
            chaotic_k(monkeypatch, chaos)
            runs.append(_run(engine, prompt, mode, temperature, seed=i))
        assert runs[0] == runs[1]
        assert _run(fixed, prompt, mode, temperature, seed=i) == runs[0]  # and fixed K agrees
        changed += _run(engine, prompt, mode, temperature, seed=i + 100) != runs[0]
    if temperature > 0:
        assert changed  # the seed does matter


@pytest.mark.parametrize("acceptance,temperature", [("cda", 0.0), ("cda", 0.8), ("exact", 0.8)])
def test_round_rules_keep_k_fixed_and_reproduce(pair, monkeypatch, acceptance, temperature):
    """cda and exact decide per round, so the loop keeps K fixed for them even with adaptive K
    on: two different adaptive-K schedules change nothing, and the same seed gives the same
    tokens with cold and warm caches."""
    verifier, drafter = pair
    spec = SpecConfig(k=3, acceptance=acceptance, spec_acceptance="exact" if acceptance == "exact"
                      else "greedy", adaptive_k=True)
    modes = ("spec", "asym") if acceptance == "exact" else ("asym",)  # spec never runs cda
    for mode in modes:
        assert not spec.position_invariant(MODE_TABLE[mode], temperature)
        engine = Engine(verifier=verifier, drafter=drafter, spec=spec)
        for i, prompt in enumerate(repetitive_prompts(2)):
            chaotic_k(monkeypatch, 1)
            first = _run(engine, prompt, mode, temperature, seed=i)
            chaotic_k(monkeypatch, 2)
            other = Engine(verifier=verifier, drafter=drafter, spec=spec)  # cold caches
            assert _run(other, prompt, mode, temperature, seed=i) == first
            assert _run(engine, prompt, mode, temperature, seed=i) == first  # warm caches


@pytest.mark.parametrize("lookup", [0, 3])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_coupled_speculation_equals_full_per_seed(pair, monkeypatch, k, lookup):
    """spec (coupled) and asym (beta=0, no compression) emit mode full's tokens, seed by seed."""
    verifier, drafter = pair
    full = Engine(verifier=verifier)
    spec = SpecConfig(k=k, lookup_ngram=lookup, beta=0.0, acceptance="coupled", adaptive_k=False)
    engine = Engine(verifier=verifier, drafter=drafter, spec=spec)
    adaptive = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(
        k=k, lookup_ngram=lookup, beta=0.0, acceptance="coupled", k_max=6))
    chaotic_k(monkeypatch, k + lookup)
    accepted = drafted = lookups = 0
    for i, prompt in enumerate(repetitive_prompts(3)):
        for temperature, top_p in ((0.7, 1.0), (1.0, 0.9))[i % 2:][:1]:
            want = full.generate(prompt, mode="full", max_new_tokens=NEW, temperature=temperature,
                                 top_p=top_p, seed=i).token_ids
            for eng in (engine, adaptive):
                for mode in ("spec", "asym"):
                    r = eng.generate(prompt, mode=mode, max_new_tokens=NEW,
                                     temperature=temperature, top_p=top_p, seed=i)
                    assert r.token_ids == want, (mode, i, temperature)
                    accepted, drafted = accepted + r.stats.accepted, drafted + r.stats.drafted
                    lookups += r.stats.lookup_rounds
    assert 0 < accepted < drafted  # both accept and reject paths ran
    assert (lookups > 0) == (lookup > 0)


SAMPLING_FIELDS = dict(frequency_penalty=1.5, presence_penalty=0.5, logit_bias={5: 1.5, 9: -3.0},
                       top_k=40, min_p=0.02)


@pytest.mark.parametrize("k", [1, 4])
def test_sampling_fields_keep_same_seed_same_output(pair, monkeypatch, k):
    """Penalties, logit bias, top-k, min-p and log-probs at T > 0 (the OpenAI fields): coupled
    spec and asym (beta=0, no compression) still emit mode full's tokens seed by seed, whatever
    adaptive K does; recording log-probs changes no token; another seed changes them."""
    verifier, drafter = pair
    full = Engine(verifier=verifier)
    engine = Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(
        k=k, k_max=5, beta=0.0, acceptance="coupled"))
    chaotic_k(monkeypatch, 10 + k)
    changed = drafted = acted = 0
    for i, prompt in enumerate(repetitive_prompts(3)):
        kw = dict(max_new_tokens=NEW, temperature=0.9, **SAMPLING_FIELDS)
        want = full.generate(prompt, mode="full", seed=i, **kw).token_ids
        acted += want != full.generate(prompt, mode="full", seed=i, max_new_tokens=NEW,
                                       temperature=0.9).token_ids
        for mode in ("spec", "asym"):
            r = engine.generate(prompt, mode=mode, seed=i, logprobs=2, **kw)
            assert r.token_ids == want, (mode, i)
            assert len(r.logprobs) == len(want)
            drafted += r.stats.drafted
        changed += full.generate(prompt, mode="full", seed=i + 100, **kw).token_ids != want
    assert drafted > 0 and changed and acted  # speculation ran; the seed and the fields matter
