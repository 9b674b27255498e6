"""The engine drives TokenConstraint (asymagent/constraint.py): masks, rollback, jump-forward;
plus stop strings, EOS and cancellation through the callback."""

from __future__ import annotations

import pytest
import torch

from asymagent.constraint import TokenConstraint
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts

V = 256


class AllowedSet:
    """Any number of tokens, each from a fixed set; never terminates."""

    def __init__(self, allowed):
        self.allowed = set(allowed)
        self.history: list = []
        self.rollbacks = 0

    def allowed_mask(self):
        mask = torch.zeros(V, dtype=torch.bool)
        mask[list(self.allowed)] = True
        return mask

    def advance(self, token_id):
        if token_id not in self.allowed:
            return False
        self.history.append(token_id)
        return True

    def rollback(self, num_tokens):
        self.rollbacks += 1
        if num_tokens:
            del self.history[-num_tokens:]

    def forced_tokens(self):
        return []

    def is_terminated(self):
        return False


class OneOfSequences(AllowedSet):
    """Exactly one of a few token sequences with distinct first tokens: after the model picks
    the first token, the rest is forced (jump-forward)."""

    def __init__(self, sequences):
        super().__init__(set())
        self.sequences = sequences

    def _live(self):
        n = len(self.history)
        return [s for s in self.sequences if s[:n] == self.history and len(s) > n]

    def allowed_mask(self):
        mask = torch.zeros(V, dtype=torch.bool)
        for s in self._live():
            mask[s[len(self.history)]] = True
        return mask

    def advance(self, token_id):
        if token_id not in {s[len(self.history)] for s in self._live()}:
            return False
        self.history.append(token_id)
        return True

    def forced_tokens(self):
        live = self._live()
        if len(live) != 1:
            return []
        return live[0][len(self.history):]

    def is_terminated(self):
        return any(s == self.history for s in self.sequences)


@pytest.fixture(scope="module")
def engine():
    verifier = make_model(seed=0)
    return Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.6), spec=SpecConfig(k=3))


def test_protocol_is_satisfied():
    assert isinstance(AllowedSet({1}), TokenConstraint)
    assert isinstance(OneOfSequences([[1]]), TokenConstraint)


def test_constrained_spec_and_asym_equal_constrained_full(engine):
    allowed = set(range(40, 60))
    for prompt in random_prompts(4):
        outs = {}
        for mode in ("full", "spec", "asym"):
            c = AllowedSet(allowed)
            r = engine.generate(prompt, mode=mode, max_new_tokens=16, constraint=c,
                                compressed_prompt_ids=prompt[4:] if mode == "asym" else None)
            assert set(r.token_ids) <= allowed
            assert c.history == r.token_ids  # the constraint saw exactly the emitted tokens
            outs[mode] = (r.token_ids, c.rollbacks)
        assert outs["spec"][0] == outs["full"][0]  # greedy spec is lossless under a mask too
        assert outs["spec"][1] > 0  # drafting rolled the constraint back every round


@pytest.mark.parametrize("mode", ["full", "spec", "asym"])
def test_jump_forward_tokens_are_forced(engine, mode):
    sequences = [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    c = OneOfSequences(sequences)
    r = engine.generate(random_prompts(1)[0], mode=mode, max_new_tokens=32, constraint=c)
    assert r.token_ids in sequences
    if mode == "full":
        assert r.stats.forced_tokens == 4  # the model picks the first token, the rest is forced
    else:
        # speculating, the singleton masks make the drafter propose the forced continuation,
        # the verifier accepts it in the same round and only what is left after that round is
        # jump-forwarded: one verifier forward for all 5 tokens
        assert 1 <= r.stats.forced_tokens <= 4 and r.stats.rounds == 1
    assert r.finish_reason == "stop"  # a terminated constraint ends generation


def test_stop_string_and_eos(smollm_tokenizer):
    verifier = make_model(seed=0)
    engine = Engine(verifier=verifier, tokenizer=smollm_tokenizer)
    prompt = random_prompts(1, seed=2)[0]
    base = engine.generate(prompt, mode="full", max_new_tokens=12)
    text = base.text
    assert text == smollm_tokenizer.decode(base.token_ids)
    stop = text[4:7]  # a string that occurs in the output
    r = engine.generate(prompt, mode="full", max_new_tokens=12, stop=[stop])
    assert r.finish_reason == "stop"
    assert r.text == text[: text.find(stop)]
    assert r.token_ids == base.token_ids[: len(r.token_ids)]
    assert stop in smollm_tokenizer.decode(r.token_ids)  # cut right after the stop completes
    assert stop not in smollm_tokenizer.decode(r.token_ids[:-1])
    eos = base.token_ids[3]  # pretend the 4th token is EOS
    engine.eos_ids = {eos}
    r = engine.generate(prompt, mode="full", max_new_tokens=12)
    assert r.token_ids == base.token_ids[: base.token_ids.index(eos) + 1]  # EOS kept in ids
    assert r.finish_reason == "stop"


def test_callback_streams_and_cancels(engine):
    prompt = random_prompts(1)[0]
    full = engine.generate(prompt, mode="spec", max_new_tokens=20)
    chunks = []
    r = engine.generate(prompt, mode="spec", max_new_tokens=20, callback=chunks.append)
    assert sum(chunks, []) == r.token_ids == full.token_ids  # chunks concatenate to the output
    seen = []

    def stop_after_5(ids):
        seen.extend(ids)
        return len(seen) < 5 and None

    r = engine.generate(prompt, mode="spec", max_new_tokens=20, callback=stop_after_5)
    assert r.finish_reason == "cancelled"
    assert r.token_ids == seen and len(seen) >= 5 and len(seen) <= 5 + 3  # at most one round late


@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_constraint_completed_by_drafts_ends_the_round(mode):
    """K=6 > the 5-token object: drafting stops when the constraint completes, and the token the
    gate emits after the completing draft is dropped (never advanced into the constraint)."""
    verifier = make_model(seed=0)
    engine = Engine(verifier=verifier, drafter=verifier, spec=SpecConfig(k=6))
    sequences = [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    c = OneOfSequences(sequences)
    r = engine.generate(random_prompts(1)[0], mode=mode, max_new_tokens=32, constraint=c)
    assert r.token_ids in sequences and c.history == r.token_ids
    assert r.stats.rounds == 1 and r.stats.drafted == 5  # drafting stopped at completion
