"""StaticKV (the CUDA-graph decode path's cache) == the dynamic cache; graphs on CUDA only.

CPU runs the static-shape forwards eagerly (`Engine(static_kv=True)`): the same code a CUDA graph
records. Logits are compared with tolerance (attention sums over C masked positions instead of
the cached length: same values up to float reduction order, ~1e-6 here), tokens exactly. The
capture itself needs CUDA: a dynamo trace with fullgraph=True stands in for it on CPU (no host
sync, no data-dependent Python branch in the recorded forward), and the `gpu` tests capture.
"""

from __future__ import annotations

import pytest
import torch

from asymagent.engine import Engine
from asymagent.kv import static_cache
from asymagent.kv.cache import ModelCache
from asymagent.kv.static_cache import StaticKV, StaticKVOptions, static_kv_unsupported, static_roles
from asymagent.spec_config import SpecConfig, mode_of
from test_engine_models import make_model, noisy_copy, random_prompts

ATOL = 1e-4  # fp32 logits of a 2-layer model: static vs dynamic differ by ~1e-6


@pytest.fixture(scope="module")
def model():
    return make_model(seed=0)


@pytest.fixture
def small_buffers(monkeypatch):
    """Capacities of a few positions: the buffers regrow every few tokens."""
    monkeypatch.setattr(static_cache, "HEADROOM", 2)
    monkeypatch.setattr(static_cache, "ALIGN", 1)


# (op, n): feed n tokens (logits of all n compared), or crop to keep n (rollback, prefix reuse)
SCRIPT = [("feed", 9), ("feed", 1), ("feed", 4), ("crop", 11), ("feed", 1), ("feed", 3),
          ("crop", 0), ("feed", 5), ("feed", 17), ("crop", 20), ("feed", 1), ("feed", 2)]


@pytest.mark.parametrize("buffers", ["default", "small"])
def test_static_equals_dynamic_through_crops_and_growth(model, buffers, request):
    if buffers == "small":
        request.getfixturevalue("small_buffers")
    dynamic, static = ModelCache(model), ModelCache(model, static=StaticKVOptions())
    gen = torch.Generator().manual_seed(1)
    capacities = set()
    for op, n in SCRIPT:
        if op == "crop":
            dynamic.crop(n)
            static.crop(n)
        else:
            ids = torch.randint(3, 256, (n,), generator=gen).tolist()
            want = dynamic.forward_logits(ids, keep=n)  # [n, V]
            got = static.forward_logits(ids, keep=n)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
            hidden_d = dynamic.forward_hidden([5])  # the body-only forward (drafter steps)
            hidden_s = static.forward_hidden([5])
            torch.testing.assert_close(hidden_s, hidden_d, atol=ATOL, rtol=0)
            dynamic.crop(len(dynamic.tokens) - 1)
            static.crop(len(static.tokens) - 1)
        assert static.tokens == dynamic.tokens
        kv = static.cache
        assert isinstance(kv, StaticKV) and kv.seen == len(static.tokens)
        assert int(kv.length) == kv.seen  # the device length follows the host mirror
        capacities.add(kv.capacity)
    if buffers == "small":
        assert len(capacities) >= 3  # the first allocation and two regrowths (with copies)


def test_crop_to_zero_keeps_buffers_and_reserve_grows_once(model):
    cache = ModelCache(model, static=StaticKVOptions())
    cache.reserve(100)
    kv = cache.cache
    first = kv.capacity
    assert first >= 100 and first % static_cache.ALIGN == 0
    cache.forward_logits(list(range(3, 40)), keep=1)
    cache.crop(0)  # a StaticKV keeps its buffers (and its graphs on CUDA)
    assert cache.cache is kv and kv.seen == 0 and int(kv.length) == 0
    cache.reserve(first)  # fits: nothing moves
    assert kv.capacity == first
    keys = kv.layers[0].keys
    cache.reserve(first + 1)
    assert kv.capacity > first and kv.layers[0].keys is not keys


def _agent_steps(engine, prompt, comp, mode, new, keep, temperature=0.0):
    """Two calls as an agent loop makes them: the second prompt extends the first (prefix reuse).
    Returns (first result, second result, the second's verifier view with its new tokens)."""
    kw = dict(mode=mode, temperature=temperature, seed=7)
    first = engine.generate(prompt, max_new_tokens=new, compressed_prompt_ids=comp, **kw)
    p2 = prompt + first.token_ids[:keep] + [40, 41]
    c2 = None if comp is None else comp + first.token_ids[:keep] + [40, 41]
    second = engine.generate(p2, max_new_tokens=new // 2, compressed_prompt_ids=c2, **kw)
    return first, second, (c2 if comp is not None else p2) + second.token_ids


def _verifier_role(mode):
    return "verifier_compressed" if mode_of(mode).compressed else "verifier_full"


# Every mode, and the paths main's engine takes on top of the default (suffix drafting, the copy
# delta, beta 0): the paper's gate (cda, beta 1: the drafter's compressed-view cache, fused
# plain steps with no drafts), and sampling (coupled = the default greedy at T > 0; exact).
# (mode, SpecConfig overrides, temperature)
ENGINE_CASES = [
    ("full", {}, 0.0), ("compressed", {}, 0.0), ("spec", {}, 0.0), ("asym", {}, 0.0),
    ("asym", {"paper": True}, 0.0), ("spec", {}, 0.8), ("asym", {"beta": 1.0}, 0.8),
    ("asym", {"acceptance": "exact", "beta": 1.0}, 0.8),
]


def _spec(overrides):
    overrides = dict(overrides)
    if overrides.pop("paper", False):
        return SpecConfig.paper(k=3, **overrides)
    return SpecConfig(k=3, adaptive_k=False, **overrides)  # adaptive K decides from timings


def _fresh_next_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]  # [V]


@pytest.fixture
def served(monkeypatch):
    """Counts the rounds GraphRound served, by draft source ("model", "suffix", "lookup")."""
    from asymagent.decoding import graph_round

    counts: dict = {}
    inner = graph_round.GraphRound._round

    def counting(self, k, copied, drafter, **kw):
        out = inner(self, k, copied, drafter, **kw)
        counts[out.source] = counts.get(out.source, 0) + 1
        graphs = sum(call.graph is not None for call, _ in self.calls.values())
        if self.capture and graphs:  # replayed from recorded CUDA graphs
            counts["captured"] = counts.get("captured", 0) + 1
        return out

    monkeypatch.setattr(graph_round.GraphRound, "_round", counting)
    return counts


@pytest.mark.parametrize("mode, overrides, temperature", ENGINE_CASES)
def test_engine_static_kv_same_tokens_and_rollback(model, mode, overrides, temperature, served):
    drafter = make_model(seed=1, layers=1)  # unrelated: many rejections, so many rollbacks
    prompt = random_prompts(1, length=40, seed=3)[0]
    # a compressed view that drops a span the suffix repeats (the copy delta has counts to use)
    comp = prompt[10:] + prompt[2:8] if mode_of(mode).compressed else None
    results = []
    for static in (False, True):
        engine = Engine(verifier=model, drafter=drafter, spec=_spec(overrides), static_kv=static)
        # the second step reuses the caches' common prefix (crop, then extend)
        first, second, view = _agent_steps(engine, prompt, comp, mode, new=24, keep=6,
                                           temperature=temperature)
        results.append((first.token_ids, second.token_ids, first.stats.accepted,
                        first.stats.drafted, first.stats.drafter_prefill_tokens))
        if static:
            session = engine.caches.session("default")
            cache = session.get(_verifier_role(mode))
            assert isinstance(cache.cache, StaticKV)
            assert cache.tokens == view[: len(cache.tokens)]
            got = cache.forward_logits(view[len(cache.tokens):], keep=1)[0]
            torch.testing.assert_close(got, _fresh_next_logits(model, view), atol=ATOL, rtol=0)
    assert results[0] == results[1]
    if mode_of(mode).speculative:
        assert results[1][3] > results[1][2]  # drafts were rejected: the rollback path ran
        # the static engine's rounds ran as graph-shaped calls (graph_round.py)
        assert served.get("model", 0) > 0
    else:
        assert not served


def test_switch_off_on_cpu_and_fallbacks(model, monkeypatch):
    roles = {"verifier_full": model}
    monkeypatch.setenv("ASYMAGENT_CUDA_GRAPHS", "1")  # read on CUDA only: CPU stays off
    assert static_roles(roles, torch.device("cpu")) == {}
    assert Engine(verifier=model).static_roles == {}
    with pytest.raises(ValueError, match="CUDA"):
        Engine(verifier=model, cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA"):
        StaticKV(model, StaticKVOptions(graphs=True))
    assert static_roles(roles, torch.device("cpu"), static_kv=True)["verifier_full"].graphs is False
    eager = make_model(seed=2)
    eager.set_attn_implementation("eager")
    assert "eager" in static_kv_unsupported(eager)
    with pytest.warns(UserWarning, match="dynamic KV cache"):
        assert static_roles({"verifier_full": eager}, torch.device("cpu"), static_kv=True) == {}
    chunked = make_model(seed=2)  # sliding layers are supported (tests/test_sliding_layer.py)
    chunked.config.layer_types = ["chunked_attention"] * chunked.config.num_hidden_layers
    assert "layer types" in static_kv_unsupported(chunked)


def test_static_forward_traces_without_graph_breaks(model):
    # What a CUDA graph records must be device work only: dynamo with fullgraph=True fails on a
    # host sync (.item(), a tensor in a Python `if`) or any other graph break in the forward.
    import torch._dynamo

    cache = ModelCache(model, static=StaticKVOptions())
    cache.forward_logits(list(range(3, 30)), keep=1)
    kv = cache.cache
    ids = torch.tensor([[7, 8, 9]])  # [1, T]
    start = kv.seen
    want = kv.step(ids, True)  # eager static forward
    kv.length.fill_(start)
    torch._dynamo.reset()
    try:
        traced = torch.compile(kv.step, backend="eager", fullgraph=True)
        with torch.inference_mode():
            got = traced(ids, True)
    finally:
        torch._dynamo.reset()
    assert int(kv.length) == start + 3  # the length moved on inside the traced forward
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- CUDA (skipped without it)

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager_static_forward(dtype):
    model = make_model(seed=0).to("cuda", dtype)
    eager = ModelCache(model, static=StaticKVOptions())
    graphed = ModelCache(model, static=StaticKVOptions(graphs=True))
    gen = torch.Generator().manual_seed(2)
    for op, n in SCRIPT:
        if op == "crop":
            eager.crop(n)
            graphed.crop(n)
            continue
        ids = torch.randint(3, 256, (n,), generator=gen).tolist()
        # the same kernels on the same shapes: bit-identical
        assert torch.equal(graphed.forward_logits(ids, keep=n), eager.forward_logits(ids, keep=n))
        assert torch.equal(graphed.forward_hidden([5]), eager.forward_hidden([5]))
        eager.crop(len(eager.tokens) - 1)
        graphed.crop(len(graphed.tokens) - 1)
    assert len(graphed.cache.graphs) >= 4  # T in {1, 3, 4, 5, ...} x (head, body)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, overrides, temperature", ENGINE_CASES)
def test_engine_cuda_graphs_same_tokens_and_rollback(mode, overrides, temperature, served):
    cpu_verifier = make_model(seed=0)
    drafter = noisy_copy(cpu_verifier, 0.6).to("cuda")  # the noise is drawn on the CPU generator
    verifier = cpu_verifier.to("cuda")
    prompt = random_prompts(1, length=64, seed=4)[0]
    comp = prompt[16:] + prompt[2:8] if mode_of(mode).compressed else None
    runs = {}
    for graphs in (False, True):
        engine = Engine(verifier=verifier, drafter=drafter, spec=_spec(overrides),
                        cuda_graphs=graphs)
        first, second, view = _agent_steps(engine, prompt, comp, mode, new=40, keep=8,
                                           temperature=temperature)
        runs[graphs] = (first.token_ids, second.token_ids)
        if graphs:
            assert engine.static_roles and all(o.graphs for o in engine.static_roles.values())
            cache = engine.caches.session("default").get(_verifier_role(mode))
            got = cache.forward_logits(view[len(cache.tokens):], keep=1)[0]
            with torch.no_grad():
                want = verifier(input_ids=torch.tensor([view], device="cuda")).logits[0, -1]
            torch.testing.assert_close(got, want.float(), atol=ATOL, rtol=0)
    assert runs[True] == runs[False]
    if mode_of(mode).speculative:  # the rounds were captured graphs (graph_round.py)
        assert served.get("model", 0) > 0 and served.get("captured", 0) > 0
    if mode == "spec":  # lossless (greedy, or coupled under the seed): the verifier alone
        full = Engine(verifier=verifier, cuda_graphs=True).generate(
            prompt, mode="full", max_new_tokens=40, temperature=temperature, seed=7)
        assert full.token_ids == runs[True][0]


@pytest.mark.parametrize("mode, overrides", [("spec", {}), ("asym", {"paper": True})])
def test_qwen2_static_kv_same_tokens(mode, overrides, served):
    """The reference pair's family (q/k/v biases, rope theta 1e6, tied head) on the static-shape
    path, with a drafter of its own width (a real LM drafter, not a cut of the verifier): the
    same tokens as the dynamic cache, through rollbacks and prefix reuse."""
    from conftest import make_tiny_qwen2

    model = make_tiny_qwen2(seed=0, hidden=64)
    drafter = make_tiny_qwen2(seed=1, layers=1, hidden=32)  # its own embeddings and head
    prompt = random_prompts(1, length=40, seed=3)[0]
    comp = prompt[10:] + prompt[2:8] if mode_of(mode).compressed else None
    results = []
    for static in (False, True):
        engine = Engine(verifier=model, drafter=drafter, spec=_spec(overrides), static_kv=static)
        first, second, _ = _agent_steps(engine, prompt, comp, mode, new=24, keep=6, temperature=0.0)
        results.append((first.token_ids, second.token_ids, first.stats.accepted))
    assert results[0] == results[1]
    assert served.get("model", 0) > 0  # the static engine's rounds ran as graph-shaped calls
