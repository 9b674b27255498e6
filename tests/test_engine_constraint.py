"""The engine drives TokenConstraint (asymagent/decoding/constraint.py): masks, rollback, jump-forward;
plus stop strings, EOS and cancellation through the callback."""

from __future__ import annotations

import pytest
import torch

from asymagent.decoding.constraint import TokenConstraint
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


class PrefixTree(OneOfSequences):
    """One of a few sequences; the common continuation of the live ones is forced."""

    def forced_tokens(self):
        n = len(self.history)
        rests = [s[n:] for s in self._live()]
        common = []
        for column in zip(*rests):
            if any(t != column[0] for t in column):
                break
            common.append(column[0])
        return common if rests else []


# forced: 5 6 7 (start), then the model picks 10 or 20; after 10: 11 12 forced, the model picks
# 30 or 40, the last token is forced (6 of 8 forced); after 20 everything is forced (7 of 8)
TREE = [[5, 6, 7, 10, 11, 12, 30, 31], [5, 6, 7, 10, 11, 12, 40, 41], [5, 6, 7, 20, 21, 22, 30, 31]]


def count_forced(sequences, tokens) -> int:
    """Tokens that were the constraint's first forced token at their position (a fresh walk)."""
    c, n = PrefixTree(sequences), 0
    for t in tokens:
        forced = c.forced_tokens()
        n += int(bool(forced) and forced[0] == t)
        assert c.advance(t)
    return n


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
    # the model picks the first token, the other 4 are determined by the constraint. In full mode
    # they are jump-forwarded; speculating, the singleton masks make the drafter propose them and
    # the verifier accept them in the same round (no model decision either), and the rest is
    # jump-forwarded: every mode counts the same 4
    assert r.stats.forced_tokens == 4
    if mode != "full":
        assert r.stats.rounds == 1  # one verifier forward for all 5 tokens
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
    seen, sizes = [], []

    def stop_after_5(ids):
        seen.extend(ids)
        sizes.append(len(ids))
        return len(seen) < 5 and None

    r = engine.generate(prompt, mode="spec", max_new_tokens=20, callback=stop_after_5)
    assert r.finish_reason == "cancelled"
    # the run stops at the round that reached 5 tokens: never called again after a False
    assert r.token_ids == seen and sum(sizes[:-1]) < 5 <= sum(sizes)


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


def verifier_inputs(model) -> tuple[list, object]:
    """Record the input ids of every verifier forward that produces logits (decode forwards:
    the prefill runs the decoder body only, the drafter never calls the verifier's head)."""
    calls: list = []

    def hook(module, args, kwargs):
        calls.append(kwargs["input_ids"][0].tolist())

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("mode", ["full", "spec", "asym"])
def test_forced_prefix_is_jumped_before_the_first_forward(engine, mode):
    """Defect: forced_tokens() was not asked before the first round, so the model decoded the
    forced opening under the mask. Now it is emitted before any decode forward and the first
    verifier forward feeds it as pending tokens."""
    prompt = random_prompts(1, seed=3)[0]
    compressed = prompt[4:] if mode == "asym" else None
    calls, handle = verifier_inputs(engine.verifier)
    forwards_at_chunk: list = []
    chunks: list = []

    def callback(ids):
        chunks.append(list(ids))
        forwards_at_chunk.append(len(calls))

    try:
        r = engine.generate(prompt, mode=mode, max_new_tokens=32, constraint=PrefixTree(TREE),
                            compressed_prompt_ids=compressed, callback=callback)
    finally:
        handle.remove()
    assert r.token_ids in TREE and r.finish_reason == "stop"
    assert chunks[0] == [5, 6, 7] and forwards_at_chunk[0] == 0  # no forward for the opening
    assert calls[0][:4] == [prompt[-1], 5, 6, 7]  # last prompt token + the 3 forced, then drafts
    assert r.stats.forced_tokens == count_forced(TREE, r.token_ids)  # 6 or 7 (see TREE)


def test_forced_tokens_counted_alike_in_every_mode():
    """forced_tokens counts tokens emitted without a model decision: jump-forwarded ones, and
    forced ones a round drafted and accepted under the singleton mask. Same output, same count."""
    verifier = make_model(seed=0)
    # the model drafter only (no copied drafts): the chunk shapes below are its rounds
    engine = Engine(verifier=verifier, drafter=verifier, spec=SpecConfig(k=3, lookup_ngram=0))
    for prompt in random_prompts(3, seed=4):
        outs = {}
        for mode in ("full", "spec", "asym"):
            chunks: list = []
            r = engine.generate(prompt, mode=mode, max_new_tokens=32, constraint=PrefixTree(TREE),
                                callback=chunks.append)
            assert r.stats.forced_tokens == count_forced(TREE, r.token_ids)
            outs[mode] = r.token_ids
            if mode != "full":
                # the drafter (= the verifier) picks 10 or 20 and drafts the 2 forced tokens
                # after it; all 3 accepted + the bonus: one round chunk of 4 that holds forced
                # tokens, which were not counted before
                assert [len(c) for c in chunks] == [3, 4, 1] and r.stats.rounds == 1
        assert outs["spec"] == outs["full"]  # jump-forward keeps greedy spec lossless
        assert outs["asym"] == outs["full"]  # no compressed view: the same target here


@pytest.mark.parametrize("mode", ["spec", "asym"])
@pytest.mark.parametrize("cut", ["eos", "stop"])
def test_constraint_advanced_only_with_kept_tokens(smollm_tokenizer, mode, cut):
    """Defect: a round that emitted EOS (or completed a stop string) mid-round advanced the
    constraint with the tokens after it too. Now the round is cut first and the constraint sees
    exactly the emitted tokens."""
    verifier = make_model(seed=0)
    # drafter = verifier: every greedy draft is accepted, so one round emits K+1 = 7 tokens
    engine = Engine(verifier=verifier, drafter=verifier, tokenizer=smollm_tokenizer,
                    spec=SpecConfig(k=6))
    allowed = set(range(40, 80))
    prompt = random_prompts(1, seed=5)[0]
    base = engine.generate(prompt, mode="full", max_new_tokens=7, constraint=AllowedSet(allowed))
    ids = base.token_ids
    stop = None
    # the first position from the 3rd token on whose token can serve as EOS / completes a stop
    for i in range(2, len(ids) - 1):
        if cut == "eos" and ids[i] not in ids[:i]:
            engine.eos_ids = {ids[i]}
            break
        done, before = smollm_tokenizer.decode(ids[: i + 1]), smollm_tokenizer.decode(ids[:i])
        if cut == "stop" and done[-2:].strip() and done[-2:] not in before:
            stop = done[-2:]
            break
    else:
        pytest.fail("no usable cut position in the reference output")
    c = AllowedSet(allowed)
    r = engine.generate(prompt, mode=mode, max_new_tokens=7, constraint=c, stop=stop)
    assert r.stats.rounds == 1  # the cut happened inside the single round (i + 1 < 7 tokens)
    assert r.token_ids == ids[: i + 1] and r.finish_reason == "stop"
    assert c.history == r.token_ids  # nothing after the EOS / stop was advanced
