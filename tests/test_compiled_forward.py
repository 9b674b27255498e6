"""Compiled static-KV forwards (asymagent/kv/compiled_forward.py): same tokens, eager fallback.

The fallback test runs everywhere in a second (torch.compile replaced by one that fails). The
real compilation (inductor generates and builds C++ for the tiny model: minutes on a shared 2-core
machine) is a `slow` test.
"""

from __future__ import annotations

import pytest
import torch

from asymagent.engine import Engine
from asymagent.kv import compiled_forward
from asymagent.kv.cache import ModelCache
from asymagent.kv.static_cache import StaticKVOptions
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, random_prompts


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(compiled_forward, "_state", {"fn": None, "failed": None})
    monkeypatch.setattr(compiled_forward, "WARMUP", {})


def test_failed_compilation_falls_back_to_eager(fresh_state, monkeypatch):
    def broken(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("no C++ compiler\nsecond line")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    model = make_model(seed=0)
    eager = ModelCache(model, static=StaticKVOptions())
    comp = ModelCache(model, static=StaticKVOptions(compile=True))
    ids = random_prompts(1, length=12, seed=4)[0]
    want_first = eager.forward_logits(ids[:10], keep=1)  # [1, V]
    want_rest = eager.forward_logits(ids[10:], keep=2)  # [2, V]
    with pytest.warns(UserWarning, match="decoding eagerly .*no C\\+\\+ compiler"):
        got_first = comp.forward_logits(ids[:10], keep=1)  # <= 16 tokens: the compiled path
    got_rest = comp.forward_logits(ids[10:], keep=2)  # after the failure: eager, no new warning
    torch.testing.assert_close(got_first, want_first, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_rest, want_rest, atol=1e-5, rtol=0)
    assert compiled_forward.compile_failed().startswith("RuntimeError: no C++ compiler")
    assert int(comp.cache.length) == comp.cache.seen == len(ids)  # the failed try left no trace


@pytest.mark.slow
def test_compiled_engine_emits_the_eager_tokens(fresh_state):
    verifier = make_model(seed=0, head_scale=2.0)
    drafter = make_model(seed=1, layers=1)
    spec = SpecConfig(k=3, adaptive_k=False, beta=0.0, acceptance="greedy")
    prompt = random_prompts(1, length=30, seed=5)[0]
    out = {}
    for compile_ in (False, True):
        engine = Engine(verifier=verifier, drafter=drafter, spec=spec, static_kv=True, compile=compile_)
        out[compile_] = [engine.generate(prompt, mode=m, max_new_tokens=12).token_ids
                         for m in ("full", "spec")]
    assert out[True] == out[False] and out[True][0] == out[True][1]
    assert compiled_forward.compile_failed() is None
    assert any(t == 1 for t, *_ in compiled_forward.WARMUP)  # the decode shape was compiled


def test_row_floors_are_constants_to_dynamo():
    """attention_floor / grouped_rows_exact probe the kernel (random draws, a generator, small
    attention calls) behind functools.cache, which dynamo ignores: unless marked constant it traced
    the probe into every compiled forward (measured: 55-60 ms instead of 36.5 for one token).
    Marked, a compiled caller sees a plain constant: one graph, no break, no attention op."""
    from asymagent.kv.attention import attention_floor, grouped_rows_exact

    def caller(x):
        return x * attention_floor(torch.bfloat16) + int(grouped_rows_exact())

    torch._dynamo.reset()
    explained = torch._dynamo.explain(caller)(torch.ones(3))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert not any("attention" in op for op in ops) and len(ops) <= 3


def test_compiled_step_compiles_with_frozen_weights(fresh_state, monkeypatch):
    """Inductor reads `freezing` while it compiles; torch.compile(options={"freezing": True}) did
    not apply it (measured: the same 36.5 ms as without), so compiled_step sets it around the
    call. Pinned here on what the compiled function sees (no compiler needed); on by default."""
    import os

    assert compiled_forward.FREEZING or "ASYMAGENT_COMPILE_FREEZING" in os.environ
    import torch._inductor.config as inductor_config

    seen = []

    def fake_compiled():
        def run(kv, input_ids, head):
            seen.append(inductor_config.freezing)
            return kv.step(input_ids, head)
        return run

    monkeypatch.setattr(compiled_forward, "_compiled", fake_compiled)
    model = make_model(seed=0)
    ids = random_prompts(1, length=6, seed=2)[0]
    before = inductor_config.freezing
    for freezing in (True, False):  # the default, and ASYMAGENT_COMPILE_FREEZING=0
        monkeypatch.setattr(compiled_forward, "FREEZING", freezing)
        cache = ModelCache(model, static=StaticKVOptions(compile=True))
        cache.forward_logits(ids, keep=1)
        assert seen[-1] is freezing
        assert inductor_config.freezing is before  # restored after the call
    assert len(seen) == 2
