"""Continuous batching (asymagent/scheduling/): requests decoding at once, their forwards batched,
and every request's tokens bit for bit those it gets alone (greedy and seeded; full, spec, asym).

The models are tiny random Llamas in bf16, so the engine packs their linears and attaches the lean
forward: the CPU path whose forwards batch (asymagent/kv/batched_forward.py). The same requests
run one by one on a one-at-a-time engine, then mixed on a batching engine (all together, in
pairs, in fours), and the token ids are compared; the batcher's observer shows that forwards of
several sequences did run.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from asymagent.engine import Engine
from asymagent.modeling.packed_linear import kernel_available
from asymagent.spec_config import SpecConfig
from asymagent.scheduling.scheduler import Scheduler
from asymagent.fair_lock import FairLock
from test_engine_models import make_model, noisy_copy

needs_packed = pytest.mark.skipif(kernel_available() is not None,
                                  reason=f"no packed bf16 linear kernel: {kernel_available()}")

MODES = ("full", "spec", "asym")


def _models():
    verifier = make_model(seed=5, hidden=128, head_scale=0.3).to(torch.bfloat16)
    drafter = noisy_copy(verifier, noise=0.05).to(torch.bfloat16)
    drafter.model.layers = drafter.model.layers[:1]
    drafter.config.num_hidden_layers = 1
    return verifier, drafter


def _engine(models, max_num_seqs: int) -> Engine:
    verifier, drafter = models
    return Engine(verifier=verifier, drafter=drafter, spec=SpecConfig(k=3),
                  max_num_seqs=max_num_seqs)


def _requests():
    """Eight requests: every mode, greedy and seeded, prompts of different lengths."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(8):
        prompt = torch.randint(3, 256, (20 + 37 * i,), generator=g).tolist()
        mode = MODES[i % 3]
        sampled = i % 2 == 1
        out.append(dict(prompt_ids=prompt, mode=mode, max_new_tokens=12 + i,
                        temperature=0.8 if sampled else 0.0, seed=100 + i if sampled else None,
                        compressed_prompt_ids=prompt[::2] + prompt[-3:] if mode == "asym" else None,
                        cache_key=f"conv-{i}"))
    return out


def _tokens(engine: Engine, req: dict) -> list:
    return engine.generate(**req).token_ids


def _all_at_once(engine, requests: list) -> list:
    """Each request's tokens, the requests started together (one thread each, past a barrier)."""
    barrier = threading.Barrier(len(requests))

    def run(req):
        barrier.wait()
        return _tokens(engine, req)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(run, requests))


@needs_packed
@pytest.mark.parametrize("cpu_kind", ["amx", "avx512_bf16", "per_head"], indirect=True)
def test_tokens_alone_equal_tokens_in_company(cpu_kind):
    models = _models()
    requests = _requests()
    alone_engine = _engine(models, 1)
    alone = [_tokens(alone_engine, r) for r in requests]
    assert all(len(t) for t in alone)

    engine = _engine(models, 8)
    seen: list = []
    lock = threading.Lock()

    def observe(sequences: int, rows: int) -> None:
        with lock:
            seen.append((sequences, rows))

    engine.scheduler.batcher.observers.append(observe)
    for width in (8, 2, 4):
        for start in range(0, len(requests), width):
            group = list(enumerate(requests))[start:start + width]
            with ThreadPoolExecutor(width) as pool:
                mixed = list(pool.map(lambda ir: (ir[0], _tokens(engine, ir[1])), group))
            for i, tokens in mixed:
                assert tokens == alone[i], f"request {i} ({requests[i]['mode']}, " \
                    f"T={requests[i]['temperature']}) beside {width - 1} others: tokens differ"
        engine.caches.clear()
    assert max(s for s, _ in seen) >= 4, "no forward batched several sequences"
    assert max(r for s, r in seen if s > 1) <= 32  # prefills (more rows) run alone
    assert engine.scheduler.running == 0 and engine.scheduler.waiting == 0


@needs_packed
def test_one_conversation_runs_one_request_at_a_time():
    """Two requests on one cache_key are not decoded at once: each sees the caches its
    predecessor left (the same tokens as run one after the other)."""
    models = _models()
    r = _requests()[0]
    one = _engine(models, 1)
    first, second = _tokens(one, r), _tokens(one, r)
    engine = _engine(models, 4)
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: _tokens(engine, r), range(2)))
    assert got == [first, second]


def test_admission_is_bounded_and_keys_are_exclusive():
    sched = Scheduler(FairLock(), max_num_seqs=2)
    inside, peak, lock = [], [0], threading.Lock()
    release = threading.Event()

    def request(key):
        with sched.slot(key):
            with lock:
                inside.append(key)
                peak[0] = max(peak[0], sched.running)
            sched.baton.release_all()  # let the others in, as a request waiting for a forward
            release.wait(5)
            sched.baton.reacquire(1)

    threads = [threading.Thread(target=request, args=(k,)) for k in ("a", "a", "b", "c")]
    for t in threads:
        t.start()
    for _ in range(200):
        if len(inside) >= 2:
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.1)
    assert sorted(inside) == ["a", "b"] and sched.waiting == 2
    release.set()
    for t in threads:
        t.join(5)
    assert sorted(inside) == ["a", "a", "b", "c"] and peak[0] == 2 and sched.running == 0
    with pytest.raises(ValueError):
        Scheduler(FairLock(), max_num_seqs=0)


@needs_packed
def test_eval_episodes_at_once_give_the_same_actions():
    """`asymagent eval --concurrency 3`: episodes at once on siblings of one engine (their
    forwards batched) act exactly as one at a time: every step's action and every free-running
    episode's outcome per mode."""
    from asymagent.evals.running.episodes import EpisodePlan, run_episodes_local
    from asymagent.modeling.drafter import build_drafter
    from asymagent.modeling.loading import load_default_verifier

    tok = load_default_verifier().tokenizer
    verifier = make_model(seed=6, vocab=len(tok), hidden=64, head_scale=0.3, max_positions=16384)
    verifier = verifier.to(torch.bfloat16)
    drafter = build_drafter(verifier, num_layers=1).to(torch.bfloat16)
    from asymagent.context.views import CompressionConfig

    sizes: list = []

    def run(concurrency: int) -> dict:
        engine = Engine(verifier, drafter, tok, compression=CompressionConfig(), max_sessions=8,
                        max_num_seqs=concurrency)
        engine.scheduler.batcher.observers.append(lambda seqs, rows: sizes.append(seqs))
        plan = EpisodePlan("records", ("full", "asym:adaptive_k=false", "spec"), max_steps=2,
                           max_new_tokens=8)
        records = run_episodes_local(engine, plan, [0, 1, 2], progress=False, concurrency=concurrency)
        assert all(part["steps"] and part["episodes"] for rec in records.values()
                   for part in rec["modes"].values())
        return {seed: {label: ([(s["output"], s["correct"], s["same_as_full"]) for s in part["steps"]],
                               [{k: v for k, v in e.items() if not k.endswith("_s") and "latency" not in k}
                                for e in part["episodes"]])
                       for label, part in rec["modes"].items()} for seed, rec in records.items()}

    assert run(3) == run(1)
    assert max(sizes) > 1  # the concurrent episodes' forwards were batched


def test_draft_share_is_each_requests_part_of_one_forward():
    """The cap on a round's drafts in company: a request alone has none; N requests decoding
    under the batcher each get max_rows // N rows (drafts + the verify's own row)."""
    import contextlib

    from asymagent.scheduling.batcher import ForwardBatcher

    batcher = ForwardBatcher(FairLock(), max_rows=32)
    assert batcher.draft_share() is None
    with contextlib.ExitStack() as stack:
        stack.enter_context(batcher.decoding())
        assert batcher.draft_share() is None  # alone: no cap
        stack.enter_context(batcher.decoding())
        assert batcher.draft_share() == 15
        for _ in range(6):
            stack.enter_context(batcher.decoding())
        assert batcher.draft_share() == 3  # 8 requests x 4 rows = one 32-row forward
    assert ForwardBatcher(FairLock(), max_rows=8).draft_share() is None


@needs_packed
def test_rounds_in_company_fit_one_forward_and_keep_the_tokens():
    """Eight tuned requests (greedy, asym and spec: a position-invariant rule) at once: every
    verify forward of the verifier stays within max_rows // 8 rows per sequence, so the round's
    verifies fit one forward, and the tokens are those each request gets alone (long copies
    capped to shorter rounds change no token)."""
    models = _models()
    g = torch.Generator().manual_seed(11)
    requests = []
    for i in range(8):
        prompt = torch.randint(3, 256, (30 + 11 * i,), generator=g).tolist()
        prompt = prompt + prompt[:24]  # repeats: copied drafts propose long continuations
        requests.append(dict(prompt_ids=prompt, mode=("asym", "spec")[i % 2], max_new_tokens=24,
                             compressed_prompt_ids=prompt[::2] + prompt[-3:] if i % 2 == 0 else None,
                             cache_key=f"conv-{i}"))
    alone_engine = _engine(models, 1)
    alone = [_tokens(alone_engine, r) for r in requests]
    engine = _engine(models, 8)
    verifier_rows: list = []
    from asymagent.scheduling import batcher as batcher_module

    real = batcher_module.forward_many

    def spy(calls):
        if calls[0].lean.model is models[0]:
            verifier_rows.extend(c.rows for c in calls)
        return real(calls)

    batcher_module.forward_many = spy
    try:
        mixed = _all_at_once(engine, requests)
    finally:
        batcher_module.forward_many = real
    assert mixed == alone
    assert verifier_rows, "no batched verifier forward"
    assert max(verifier_rows) <= 32 // 2  # at least two decoding: each at most its share


@needs_packed
def test_costs_in_company_change_no_token():
    """Tuned requests (asym and spec; greedy and seeded, position-invariant rules) at once, with
    the company costs on (adaptive K and the draft choice read each request's share of the
    forwards it joined, asymagent/scheduling/company_clock.py) and off (its wall time): the
    tokens are those each request gets alone either way, and the charges were taken (a share
    is never more than the wait it replaces)."""
    models = _models()
    g = torch.Generator().manual_seed(17)
    requests = []
    for i in range(8):
        prompt = torch.randint(3, 256, (24 + 13 * i,), generator=g).tolist()
        prompt = prompt + prompt[:16]  # repeats: copied drafts compete with the drafter model
        sampled = i % 4 == 3
        requests.append(dict(prompt_ids=prompt, mode=("asym", "spec")[i % 2], max_new_tokens=32,
                             temperature=0.7 if sampled else 0.0, seed=200 + i if sampled else None,
                             compressed_prompt_ids=prompt[::2] + prompt[-3:] if i % 2 == 0 else None,
                             cache_key=f"conv-{i}"))
    alone_engine = _engine(models, 1)
    alone = [_tokens(alone_engine, r) for r in requests]
    from asymagent.scheduling import company_clock

    charges: list = []
    real = company_clock.charge

    def spy(waited: float, share: float) -> None:
        charges.append((waited, share))
        real(waited, share)

    company_clock.charge = spy
    try:
        for sharing in (True, False):
            engine = _engine(models, 8)
            engine.scheduler.batcher.cost_sharing = sharing
            charges.clear()
            mixed = _all_at_once(engine, requests)
            assert mixed == alone, f"cost_sharing={sharing}: tokens differ from alone"
            if sharing:
                assert charges, "no forward was charged in company"
                assert all(0.0 <= share <= waited for waited, share in charges)
                assert any(share < waited for waited, share in charges)
                assert engine.scheduler.batcher.costs  # the forwards' fits
            else:
                assert not charges
    finally:
        company_clock.charge = real
