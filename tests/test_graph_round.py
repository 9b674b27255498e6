"""GraphRound (asymagent/decoding/graph_round.py): whole speculative rounds as one device call.

CPU: the graph-shaped round runs eagerly (the same code a CUDA graph records) and must give the
step-by-step round's tokens; tests/test_static_kv.py pins every mode (full, compressed, spec,
asym; greedy, coupled and exact sampling) against the dynamic cache with these rounds on. Here:
copied drafts (suffix matching: verify + gate calls), the switch, the fallbacks, and on CUDA
(`-m gpu`) the captured rounds: tokens equal eager decode's, and one device->host copy a round.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from asymagent.decoding import graph_round
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts
from test_static_kv import _spec, served  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def model():
    return make_model(seed=0)


@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_graph_round_copied_drafts_and_switch(model, monkeypatch, served, mode):
    # a prompt that repeats itself: suffix drafting proposes copies (verify + gate calls)
    monkeypatch.setenv("ASYMAGENT_GRAPH_ROUND", "0")
    drafter = make_model(seed=1, layers=1)
    half = random_prompts(1, length=24, seed=5)[0]
    prompt = half + half + half[:12]
    comp = prompt[20:] if mode == "asym" else None
    kw = dict(mode=mode, max_new_tokens=24, compressed_prompt_ids=comp)
    want = Engine(verifier=model, drafter=drafter, spec=_spec({})).generate(prompt, **kw)
    engine = Engine(verifier=model, drafter=drafter, spec=_spec({}), static_kv=True)
    assert all(not o.rounds for o in engine.static_roles.values())
    assert engine.generate(prompt, **kw).token_ids == want.token_ids  # step by step
    assert not served
    monkeypatch.delenv("ASYMAGENT_GRAPH_ROUND")
    engine = Engine(verifier=model, drafter=drafter, spec=_spec({}), static_kv=True)
    got = engine.generate(prompt, **kw)
    assert got.token_ids == want.token_ids
    assert (got.stats.accepted, got.stats.drafted) == (want.stats.accepted, want.stats.drafted)
    assert served.get("suffix", 0) > 0


@pytest.mark.parametrize("mode, overrides, temperature, agreeing", [
    ("asym", {}, 0.0, True), ("asym", {}, 0.0, False), ("asym", {"paper": True}, 0.0, True),
    ("spec", {}, 0.8, True), ("asym", {"acceptance": "exact", "beta": 1.0}, 0.8, False),
    # the divergence gate (tiny models' JSDs are ~1e-5..1e-4: some rows on, some off)
    ("asym", {"beta": 10.0, "jsd_min": 3e-5}, 0.0, False)])
def test_capture_side_effects_keep_the_tokens(model, monkeypatch, mode, overrides, temperature,
                                              agreeing):
    # CPU emulation of what recording a graph does to the caches (a warm-up run, the lengths
    # put back to the host mirrors) before each call's first run: the step-by-step tokens still
    # come out (asym's default has the copy delta: a drafting call, then a verify call)
    from asymagent.kv import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "EMULATE_CAPTURE", True)
    # an agreeing drafter (a copy of the verifier, no copied drafts) has rounds that accept
    # every draft on a call's first run; an unrelated one, rollbacks
    drafter = noisy_copy(model, 0.0) if agreeing else make_model(seed=1, layers=1)
    inner = graph_round.GraphRound._round
    checked = []

    def checking(self, *args, **kwargs):  # after every round: device lengths == host mirrors
        out = inner(self, *args, **kwargs)
        d = self.decoder
        for reader in (d.verifier, d.drafter, d.base):
            if reader is not None:
                kv = reader.cache.cache
                assert int(kv.length) == kv.seen == len(reader.cache.tokens)
        checked.append(out.accepted == out.drafted)
        return out

    monkeypatch.setattr(graph_round.GraphRound, "_round", checking)
    prompt = random_prompts(1, length=40, seed=3)[0]
    comp = prompt[10:] + prompt[2:8] if mode == "asym" else None
    kw = dict(mode=mode, max_new_tokens=20, compressed_prompt_ids=comp, temperature=temperature,
              seed=7)
    overrides = {**overrides, "lookup_ngram": 0} if agreeing else overrides
    want = Engine(verifier=model, drafter=drafter, spec=_spec(overrides)).generate(prompt, **kw)
    got = Engine(verifier=model, drafter=drafter, spec=_spec(overrides), static_kv=True).generate(
        prompt, **kw)
    assert got.token_ids == want.token_ids
    assert (got.stats.accepted, got.stats.drafted) == (want.stats.accepted, want.stats.drafted)
    assert checked and (any(checked) or not agreeing)  # some round accepted all its drafts


def test_rounds_it_does_not_serve_run_step_by_step(model, served):
    # log-probs and penalties read per-row host state: those rounds stay step by step (same tokens)
    drafter = make_model(seed=1, layers=1)
    prompt = random_prompts(1, length=40, seed=3)[0]
    kw = dict(mode="spec", max_new_tokens=12, frequency_penalty=0.5, logprobs=1)
    want = Engine(verifier=model, drafter=drafter, spec=_spec({})).generate(prompt, **kw)
    got = Engine(verifier=model, drafter=drafter, spec=_spec({}), static_kv=True).generate(
        prompt, **kw)
    assert got.token_ids == want.token_ids and not served
    assert graph_round.RULES == ("cda", "greedy", "exact", "coupled")


def test_capture_failure_falls_back_to_the_same_call_eagerly(model):
    # a capture that fails (here: no CUDA at all) warns once, puts the lengths back and runs the
    # same function eagerly from then on
    from asymagent.kv import cuda_graphs
    from asymagent.kv.cache import ModelCache
    from asymagent.kv.static_cache import StaticKVOptions

    cache = ModelCache(model, static=StaticKVOptions())
    cache.forward_logits(list(range(3, 20)), keep=1)
    kv = cache.cache
    calls = []

    def fn(ids):
        calls.append(1)
        return kv.step(ids, True)

    call = cuda_graphs.CapturedCall(fn, [kv], capture=True, device=torch.device("cpu"))
    ids = torch.tensor([[5, 6]])
    if torch.cuda.is_available():
        pytest.skip("capture can succeed here")
    with pytest.warns(UserWarning, match="capture failed"):
        out = call(ids=ids)
    assert not call.capture and call.graph is None and cuda_graphs.CAPTURE_ERRORS
    assert out.shape == (2, model.config.vocab_size) and calls
    assert int(kv.length) == kv.seen + 2  # the eager call's forward, from the restored length
    kv.length.fill_(kv.seen)
    torch.testing.assert_close(call(ids=ids), out)


# ---------------------------------------------------------------- CUDA (skipped without it)

@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_captured_copied_drafts_equal_eager(mode, served):
    cpu_verifier = make_model(seed=0)
    drafter = noisy_copy(cpu_verifier, 0.6).to("cuda")
    verifier = cpu_verifier.to("cuda")
    half = random_prompts(1, length=24, seed=5)[0]
    prompt = half + half + half[:12]
    comp = prompt[20:] if mode == "asym" else None
    kw = dict(mode=mode, max_new_tokens=24, compressed_prompt_ids=comp)
    want = Engine(verifier=verifier, drafter=drafter, spec=_spec({})).generate(prompt, **kw)
    got = Engine(verifier=verifier, drafter=drafter, spec=_spec({}), cuda_graphs=True).generate(
        prompt, **kw)
    assert got.token_ids == want.token_ids
    assert (got.stats.accepted, got.stats.drafted) == (want.stats.accepted, want.stats.drafted)
    assert served.get("suffix", 0) > 0 and served.get("captured", 0) > 0


@pytest.mark.gpu
def test_captured_round_syncs_once(monkeypatch):
    # asym on two views, one drafter view (beta 0) and no copy delta: the drafter's bonus row
    # keeps every cache's pending tokens at one, so a round is one replay and one copy back
    cpu_verifier = make_model(seed=0)
    drafter = noisy_copy(cpu_verifier, 0.6).to("cuda")
    verifier = cpu_verifier.to("cuda")
    prompt = random_prompts(1, length=64, seed=4)[0]
    comp = prompt[16:]
    spec = SpecConfig(k=3, adaptive_k=False, copy_weight=0.0, lookup_ngram=0)
    engine = Engine(verifier=verifier, drafter=drafter, spec=spec, cuda_graphs=True)
    kw = dict(mode="asym", max_new_tokens=24, compressed_prompt_ids=comp)
    first = engine.generate(prompt, **kw)  # records the graphs
    syncs: list = []
    inner = graph_round.GraphRound._round

    def counting(self, *args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = inner(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs.append(sum("synchroniz" in str(w.message).lower() for w in caught))
        return out

    monkeypatch.setattr(graph_round.GraphRound, "_round", counting)
    again = engine.generate(prompt, **kw)
    assert again.token_ids == first.token_ids
    assert syncs and all(n == 1 for n in syncs), syncs
