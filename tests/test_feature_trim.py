"""The feature buffer follows the KV cache (asymagent/kv/feature_capture.py): crops drop the same
positions, resets free it, a sliding-window cache's dropped window lets its rows go; the memory
stays bounded by the positions held, and the feature head drafts exactly what it drafts with the
untrimmed buffer (`TRIM = False`), turn after turn (extend, branch back, a new conversation)."""

from __future__ import annotations

import random

import pytest
import torch

from asymagent.decoding import feature_drafter
from asymagent.decoding.feature_drafter import FeatureRuntime
from asymagent.engine import Engine
from asymagent.kv import feature_capture, sliding_layer
from asymagent.kv.feature_capture import FeatureCapture
from asymagent.kv.growing_cache import _capacity
from asymagent.spec_config import SpecConfig
from families import make_family
from test_feature_drafter import _drafter, _head, _verifier

F = 12  # feature width of the unit tests (3 layers x H=4)


def _bound(held: int) -> int:
    """The most rows a trimmed buffer may hold for `held` positions: a growth (x1.5 past what it
    held) or a crop (given back beyond twice the need) leaves at most twice the need."""
    return 2 * _capacity(held, 0)


def test_the_capture_holds_what_the_cache_holds_and_no_more():
    """Random feeds and crops (spec rounds, branches back, resets): every valid feature is the last
    one recorded at its position, and the rows stay within one growth of the positions held."""
    rng = random.Random(0)
    cap, ref = FeatureCapture((0, 1, 2)), {}
    held = 0
    peak = 0
    for step in range(400):
        op = rng.random()
        if op < 0.75:  # a forward of T positions after the held ones (a verify feeds K+1)
            t = rng.choice([1, 5, 9, 60, 300])
            rows = torch.randn(t, F)
            cap.record(held, [rows[:, :4], rows[:, 4:8], rows[:, 8:]])
            for i in range(t):
                ref[held + i] = rows[i]
            held += t
        elif op < 0.95:  # a crop: rejected drafts, or a new turn branching back
            keep = max(held - rng.choice([1, 3, 8]), 0) if rng.random() < 0.7 else rng.randrange(held + 1)
            held = keep
            cap.crop(keep) if keep else cap.reset()
        else:
            held = 0
            cap.reset()
        peak = max(peak, held)
        n = cap.valid(held)
        assert n == held
        if n:
            assert torch.equal(cap.features(0, n), torch.stack([ref[i] for i in range(n)]))
        assert cap.rows <= _bound(held), (step, held, cap.rows)
    assert peak > 1500  # the run reached long contexts and came back


def test_untrimmed_the_buffer_only_grows(monkeypatch):
    monkeypatch.setattr(feature_capture, "TRIM", False)
    cap = FeatureCapture((0,))
    cap.record(0, [torch.randn(2000, F)])
    big = cap.rows
    cap.crop(10)
    cap.reset()
    assert cap.rows == big  # what the issue measured: 9.2 KB a token on the pair, never given back


def test_release_moves_out_only_what_no_crop_reads():
    cap = FeatureCapture((0,))
    cap.record(0, [torch.arange(300.).repeat(F, 1).T])
    cap.release(200)  # no head state yet: it would read from position 0
    cap.record(300, [torch.full((900, F), 1.0)])
    assert cap.base == 0

    class Head:  # the head has read up to position 250
        n = 250

        def crop(self, keep):
            self.n = min(self.n, max(keep - 1, 0))

    cap.head_state = Head()
    cap.release(200)  # the cache can be cropped no lower than 200
    cap.record(1200, [torch.full((cap.rows, F), 2.0)])  # past the buffer: moves out, then grows
    assert cap.base == 199
    assert torch.equal(cap.features(199, 200)[0], torch.full((F,), 199.0))
    with pytest.raises(IndexError):
        cap.features(198, 200)
    cap.crop(150)  # below what was moved out: everything goes (the cache re-prefills)
    assert cap.buf is None and cap.head_state is None and cap.valid(150) == 0


def _log_drafts(monkeypatch) -> list:
    """Every proposal of the feature drafter, in order."""
    log = []
    propose = feature_drafter.FeatureDrafter.propose

    def logged(self, k):
        d = propose(self, k)
        log.append(tuple(d.tokens))
        return d

    monkeypatch.setattr(feature_drafter.FeatureDrafter, "propose", logged)
    return log


def _turns(engine, prompts: list, new: int) -> list:
    """One conversation (one cache key): each prompt after the last; the tokens of each turn."""
    return [engine.generate(p, mode="spec", max_new_tokens=new, cache_key="c").token_ids for p in prompts]


def _conversation(seed: int, vocab: int, length: int) -> list:
    """Turn prompts: a long prompt, its extension, a branch back to its middle, a new short one."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(3, vocab, (length,), generator=g).tolist()
    b = torch.randint(3, vocab, (40,), generator=g).tolist()
    c = torch.randint(3, vocab, (30,), generator=g).tolist()
    d = torch.randint(3, vocab, (20,), generator=g).tolist()
    return [a, a + b, a[: length // 3] + c, d]


def _capture(engine):
    return next(c for c in engine.caches.session("c").caches.values() if c.capture is not None).capture


def _run(monkeypatch, trim: bool, make, prompts: list, new: int) -> tuple:
    monkeypatch.setattr(feature_capture, "TRIM", trim)
    log = _log_drafts(monkeypatch)
    verifier = make()
    engine = Engine(verifier=verifier, drafter=_drafter(verifier),
                    spec=SpecConfig(k=4, lookup_ngram=0, draft_model=False, adaptive_k=False))
    engine.use_feature_head(FeatureRuntime(_head(verifier, seed=2), engine.verifier))
    sizes = []
    outs = []
    for p in prompts:
        outs.append(_turns(engine, [p], new)[0])
        cap = _capture(engine)
        head = cap.head_state
        sizes.append((cap.rows, 0 if head is None else head.k.shape[2], len(p) + new, cap.base))
    monkeypatch.undo()
    return outs, log, sizes


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_drafts_are_the_same_trimmed_and_untrimmed(family, monkeypatch):
    prompts = _conversation(1, 256, 900)
    make = lambda: _verifier(family)  # noqa: E731
    outs, log, sizes = _run(monkeypatch, True, make, prompts, 12)
    ref_outs, ref_log, ref_sizes = _run(monkeypatch, False, make, prompts, 12)
    full = Engine(verifier=make())
    assert outs == ref_outs == [full.generate(p, mode="full", max_new_tokens=12).token_ids for p in prompts]
    assert len(log) > 20 and log == ref_log  # every proposal, draft for draft
    assert sum(len(d) for d in log) > 0
    # memory: after the short last turn the trimmed buffers are sized to it, the untrimmed ones not
    rows, head_rows, held, _ = sizes[-1]
    assert rows <= _bound(held) and head_rows <= _bound(held)
    assert ref_sizes[-1][0] >= 900 and ref_sizes[-1][1] >= 900  # sized to the 900-token turn


def test_a_sliding_window_verifier_keeps_its_window_of_features(monkeypatch):
    """Mistral with an 8-token window and a 4-token tail, a long decode: the features before the
    window the cache dropped (and the head read) are moved out as the buffer fills; the drafts are
    the untrimmed buffer's, the rows stay bounded while the untrimmed buffer grows with the length."""
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 256, (100,), generator=g).tolist()
    make = lambda: make_family("mistral", vocab=256, window=8, seed=3)  # noqa: E731
    monkeypatch.setattr(sliding_layer, "TAIL", 4)
    outs, log, sizes = _run(monkeypatch, True, make, [prompt], 400)
    monkeypatch.setattr(sliding_layer, "TAIL", 4)
    ref_outs, ref_log, ref_sizes = _run(monkeypatch, False, make, [prompt], 400)
    assert outs == ref_outs and log == ref_log and len(log) > 100
    rows, _, held, base = sizes[0]
    assert held == 500 and base > 200 and rows < 400 and ref_sizes[0][0] >= 500, (sizes, ref_sizes)
