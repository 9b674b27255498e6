"""The EAGLE-3 feature drafter (asymagent/decoding/feature_drafter.py, feature_head.py, kv/feature_capture.py):
capture leaves the verifier's logits bit for bit, its features are transformers' hidden states,
greedy spec with the head is the verifier alone (untrained and trained heads, tiny Llama and
Qwen2 verifiers), alone and in company, and a trained head drafts what the verifier says."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from asymagent.decoding.feature_drafter import FeatureRuntime
from asymagent.decoding.feature_head import FeatureHead, FeatureHeadConfig, load_head, save_head
from asymagent.engine import Engine
from asymagent.kv.attention import use_gqa_attention
from asymagent.kv.cache import ModelCache
from asymagent.kv.feature_capture import FeatureCapture, default_layers
from asymagent.kv.lean_forward import ATTR, attach
from asymagent.modeling.packed_linear import kernel_available, pack_linears
from asymagent.spec_config import SpecConfig
from asymagent.training.config import TrainConfig
from asymagent.training.feature_data import collect
from asymagent.training.feature_train import train_loop
from conftest import TINY_FAMILIES

needs_packed = pytest.mark.skipif(kernel_available() is not None,
                                  reason=f"no packed bf16 linear kernel: {kernel_available()}")
FAMILIES = pytest.mark.parametrize("family", sorted(TINY_FAMILIES))


def _verifier(family: str, dtype=torch.float32, seed: int = 0):
    """A 4-layer tiny verifier with N(0, 1) embeddings and head (varied greedy text)."""
    model = TINY_FAMILIES[family](hidden=64, heads=4, kv_heads=2, layers=4, seed=seed)
    gen = torch.Generator().manual_seed(50 + seed)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.copy_(torch.randn(emb.shape, generator=gen))
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=gen) * 0.5)
    return model.to(dtype).eval()


def _prompts(n: int, length: int = 24, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (length,), generator=g).tolist() for _ in range(n)]


def _head(verifier, seed: int = 0) -> FeatureHead:
    torch.manual_seed(seed)
    layers = default_layers(verifier.config.num_hidden_layers)
    return FeatureHead(FeatureHeadConfig.for_verifier(verifier, layers)).float()


def test_default_layers_are_low_mid_high_never_the_last():
    assert default_layers(28) == (2, 14, 25)  # the pair's 1.5B
    assert default_layers(4) == (1, 2)
    for n in range(1, 40):
        assert all(0 <= i <= max(n - 2, 0) for i in default_layers(n))


@FAMILIES
@pytest.mark.parametrize("lean", [False, True])
def test_capture_keeps_every_logit_and_reads_the_hidden_states(family, lean):
    """Logits with capture == without, bit for bit (prefill, decode, verify, crop + re-feed);
    the captured rows are transformers' hidden states of those layers at those positions."""
    model = _verifier(family)
    if lean:
        assert attach(model).attached
    else:
        setattr(model, ATTR, None)
    layers = default_layers(4)
    plain, captured = ModelCache(model), ModelCache(model, capture=FeatureCapture(layers))
    g = torch.Generator().manual_seed(1)
    ids_all: list = []
    for n in (40, 1, 5, 3, 1, 17):
        ids = torch.randint(3, 256, (n,), generator=g).tolist()
        a, b = plain.forward_logits(ids, keep=n), captured.forward_logits(ids, keep=n)
        assert torch.equal(a, b)
        ids_all += ids
        if n == 5:  # a rejected verify: crop back two positions, re-feed others
            plain.crop(len(plain) - 2)
            captured.crop(len(captured) - 2)
            del ids_all[-2:]
    cap = captured.capture
    assert cap.valid(len(captured.tokens)) == len(ids_all)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids_all]), output_hidden_states=True)
    want = torch.cat([out.hidden_states[i + 1][0] for i in layers], dim=-1)
    assert torch.allclose(cap.features(0, len(ids_all)).float(), want.float(), atol=1e-4, rtol=1e-4)


@needs_packed
@FAMILIES
def test_capture_on_the_packed_direct_road_keeps_every_logit(family):
    """bf16, packed linears and the lean forward's direct road (the pair's CPU path)."""
    model = _verifier(family, torch.bfloat16)
    use_gqa_attention(model)
    pack_linears(model)
    assert attach(model).fused
    plain, captured = ModelCache(model), ModelCache(model, capture=FeatureCapture((1, 2)))
    g = torch.Generator().manual_seed(2)
    for n in (70, 1, 4, 1, 9):
        ids = torch.randint(3, 256, (n,), generator=g).tolist()
        assert torch.equal(plain.forward_logits(ids, keep=n), captured.forward_logits(ids, keep=n))
    assert captured.capture.valid(len(captured.tokens)) == len(captured.tokens)


def _spec() -> SpecConfig:
    # the feature head alone (no copies) at a fixed K, and with copies (the per-round choice)
    return SpecConfig(k=4, lookup_ngram=0, draft_model=False, adaptive_k=False)


def _drafter(verifier):
    """A one-layer drafter model the engine holds for mode spec; draft_model=False never asks it."""
    import copy

    d = copy.deepcopy(verifier)
    d.model.layers = d.model.layers[:1]
    d.config.num_hidden_layers = 1
    return d.eval()


def _engine(verifier, head, spec=None, **kw) -> Engine:
    engine = Engine(verifier=verifier, drafter=_drafter(verifier), spec=spec or _spec(), **kw)
    engine.use_feature_head(FeatureRuntime(head, engine.verifier))
    return engine


def _trained(verifier, steps: int = 60) -> FeatureHead:
    """A head trained (TTT, 3 steps) on the verifier's own greedy continuations."""
    ids = torch.tensor(_prompts(24, length=16, seed=9))
    with torch.inference_mode():
        seqs = verifier.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=48,
                                 do_sample=False, pad_token_id=2, eos_token_id=None).tolist()
    head = _head(verifier, seed=1)
    data = collect(verifier, seqs, head.cfg.layers, 4, 10 ** 9, float("inf"))
    to_draft = torch.arange(verifier.config.vocab_size)
    cfg = TrainConfig(out="unused", lr=3e-3, batch_size=2, seq_len=48, ttt_steps=3,
                      max_steps=steps, no_progress=True)
    weight = verifier.get_output_embeddings().weight.detach().float()
    train_loop(head, verifier, data.seqs, weight, to_draft, cfg, deadline=float("inf"))
    return head.eval()


@pytest.fixture(scope="module", params=sorted(TINY_FAMILIES))
def trained_pair(request):
    verifier = _verifier(request.param)
    return verifier, _trained(verifier)


def _greedy_identity(verifier, head) -> float:
    """Greedy spec with `head` == the verifier alone (two turns of each conversation: the second
    reuses the head's cache by prefix); returns the drafts' acceptance rate."""
    full_engine = Engine(verifier=verifier)
    engine = _engine(verifier, head)
    drafted = accepted = 0
    for i, p in enumerate(_prompts(6, seed=3)):
        want = full_engine.generate(p, mode="full", max_new_tokens=24, cache_key=f"f{i}").token_ids
        r = engine.generate(p, mode="spec", max_new_tokens=24, cache_key=f"s{i}")
        assert r.token_ids == want
        assert set(r.stats.draft_source) <= {"feature", "plain"}
        assert r.stats.draft_source.get("feature", 0) > 0
        drafted, accepted = drafted + r.stats.drafted, accepted + r.stats.accepted
        r2 = engine.generate(p + want, mode="spec", max_new_tokens=8, cache_key=f"s{i}")
        assert r2.token_ids == full_engine.generate(p + want, mode="full", max_new_tokens=8,
                                                    cache_key=f"f{i}").token_ids
    return accepted / drafted


def test_greedy_spec_with_the_head_is_the_verifier_alone(trained_pair):
    """Untrained and trained heads: the verifier's tokens; the trained one drafts them far more
    often (it learnt the verifier's continuations on other prompts)."""
    verifier, trained_head = trained_pair
    untrained = _greedy_identity(verifier, _head(verifier))
    trained = _greedy_identity(verifier, trained_head)
    assert untrained < 0.3, untrained  # a random head rarely agrees: the reject path runs
    assert trained > max(2 * untrained, 0.35), (trained, untrained)


def test_trained_head_roundtrips_and_sampling_keeps_its_rule(trained_pair, tmp_path):
    """save/load gives the same drafts; at T > 0 (coupled rule) the same seed gives the same
    tokens with the head as without it (the sampling rule unchanged, position-keyed)."""
    verifier, head = trained_pair
    path = tmp_path / "head.safetensors"
    save_head(head, str(path), None)
    loaded, vocab, _ = load_head(str(path))
    assert vocab is None
    engine = Engine(verifier=verifier, drafter=_drafter(verifier), spec=_spec())
    engine.use_feature_head(str(path))
    again = _engine(verifier, head)
    plain = Engine(verifier=verifier)
    for i, p in enumerate(_prompts(3, seed=4)):
        a = engine.generate(p, mode="spec", max_new_tokens=16, cache_key=f"a{i}")
        b = again.generate(p, mode="spec", max_new_tokens=16, cache_key=f"b{i}")
        assert a.token_ids == b.token_ids
        kw = dict(mode="spec", max_new_tokens=16, temperature=0.8, seed=11 + i)
        with_head = engine.generate(p, cache_key=f"t{i}", **kw).token_ids
        without = plain.generate(p, cache_key=f"u{i}", **{**kw, "mode": "full"}).token_ids
        assert with_head == without


def test_copies_first_then_the_head(trained_pair):
    """With copied drafts on, rounds that find a copy use it and the others the head; the
    output is still the verifier's."""
    verifier, head = trained_pair
    spec = SpecConfig(k=4, lookup_ngram=3, draft_model=False, adaptive_k=False)
    engine = _engine(verifier, head, spec=spec)
    full = Engine(verifier=verifier)
    sources: dict = {}
    for i, p in enumerate(_prompts(4, seed=6)):
        p = p + p[:12]  # a repeat to copy from
        r = engine.generate(p, mode="spec", max_new_tokens=24, cache_key=f"c{i}")
        assert r.token_ids == full.generate(p, mode="full", max_new_tokens=24, cache_key=f"d{i}").token_ids
        for k, v in r.stats.draft_source.items():
            sources[k] = sources.get(k, 0) + v
    assert sources.get("feature", 0) > 0 and sources.get("suffix", 0) > 0, sources


@needs_packed
def test_tokens_alone_equal_tokens_in_company():
    verifier = _verifier("qwen2", torch.bfloat16, seed=3)
    head = _head(verifier, seed=2)
    reqs = [dict(prompt_ids=p, mode="spec", max_new_tokens=14, cache_key=f"k{i}")
            for i, p in enumerate(_prompts(6, length=20 + 0, seed=8))]
    alone_engine = _engine(verifier, head)

    def outcome(r) -> tuple:  # the tokens and what the head drafted (its features in company:
        s = r.stats           # batched forwards capture them, kv/batched_forward.py)
        return r.token_ids, s.by_source.get("feature", {}).get("drafted"), s.by_source.get("feature", {}).get("accepted")

    alone = [outcome(alone_engine.generate(**r)) for r in reqs]
    engine = _engine(verifier, head, max_num_seqs=6)
    seen: list = []
    engine.scheduler.batcher.observers.append(lambda sequences, rows: seen.append(sequences))
    barrier = threading.Barrier(len(reqs))

    def run(r):
        barrier.wait()
        return outcome(engine.generate(**r))

    with ThreadPoolExecutor(len(reqs)) as pool:
        together = list(pool.map(run, reqs))
    assert together == alone
    assert max(seen) > 1, "no forward batched several sequences"


def test_acceptance_is_reported_per_draft_source(trained_pair):
    """StepStats.by_source, RunStats totals and /metrics (vLLM's counters with a source label)."""
    from asymagent.stats import RunStats
    from asymagent.integrations.server.metrics import ServerMetrics

    verifier, head = trained_pair
    spec = SpecConfig(k=4, lookup_ngram=3, draft_model=False, adaptive_k=False)
    engine = _engine(verifier, head, spec=spec)
    run, metrics = RunStats(), ServerMetrics("tiny")
    for i, p in enumerate(_prompts(3, seed=6)):
        r = engine.generate(p + p[:12], mode="spec", max_new_tokens=24, cache_key=f"m{i}")
        s = r.stats
        assert sum(d["rounds"] for d in s.by_source.values()) == s.rounds
        assert sum(d["accepted"] for d in s.by_source.values()) == s.accepted
        for name, d in s.by_source.items():
            assert d["rounds"] == s.draft_source[name]
            k = spec.k if name == "feature" else spec.lookup_k
            assert 1.0 <= d["mean_accepted_len"] <= k + 1
            assert len(d["acceptance_by_position"]) <= k
            assert d["accepted_by_position"][0] <= d["reached_by_position"][0] == d["rounds"]
            assert sum(d["accepted_by_position"]) == d["accepted"]
        run.add(s)
        metrics.observe(s, e2e_s=1.0, ttft_s=0.1, queue_s=0.0, finish_reason="length")
    pooled = run.totals()["by_source"]
    assert pooled["feature"]["rounds"] == sum(st.by_source.get("feature", {}).get("rounds", 0) for st in run.steps)
    text = metrics.exposition().decode()
    accepted = pooled["feature"]["accepted_by_position"][0]
    assert (f'spec_decode_num_accepted_tokens_per_pos_by_source_total{{model_name="tiny",position="0",'
            f'source="feature"}} {float(accepted)}') in text
    # the feature head off per request (a mode label's override): copies only
    engine.spec.feature_head = False
    r = engine.generate(_prompts(1, seed=7)[0], mode="spec", max_new_tokens=12, cache_key="off")
    assert "feature" not in r.stats.draft_source


def test_asym_with_the_head_says_what_asym_says_without_it(trained_pair):
    """Mode asym: the head reads the verifier's features over the compressed view (its cache);
    greedy tokens are the same with the head as with copies only."""
    verifier, head = trained_pair
    spec = SpecConfig(k=4, lookup_ngram=3, draft_model=False, adaptive_k=False)
    engine = _engine(verifier, head, spec=spec)
    plain = _engine(verifier, head, spec=SpecConfig(k=4, lookup_ngram=3, draft_model=False,
                                                    adaptive_k=False, feature_head=False))
    used = 0
    for i, p in enumerate(_prompts(3, length=40, seed=12)):
        compressed = p[:10] + p[-12:]
        kw = dict(mode="asym", max_new_tokens=20, compressed_prompt_ids=compressed)
        a = engine.generate(p, cache_key=f"a{i}", **kw)
        b = plain.generate(p, cache_key=f"b{i}", **kw)
        assert a.token_ids == b.token_ids
        assert "feature" not in b.stats.draft_source
        used += a.stats.draft_source.get("feature", 0)
    assert used > 0


def test_a_head_switched_on_later_drafts_in_an_old_session(trained_pair):
    verifier, head = trained_pair
    engine = Engine(verifier=verifier, drafter=_drafter(verifier), spec=_spec())
    p = _prompts(1, seed=13)[0]
    first = engine.generate(p, mode="spec", max_new_tokens=8, cache_key="old").token_ids
    engine.use_feature_head(FeatureRuntime(head, engine.verifier))
    r = engine.generate(p + first, mode="spec", max_new_tokens=12, cache_key="old")
    assert r.stats.draft_source.get("feature", 0) > 0
    assert r.token_ids == Engine(verifier=verifier).generate(p + first, mode="full", max_new_tokens=12).token_ids


class _ForcedRuns:
    """`free` positions of any token that is a multiple of `every`, then `forced` tokens the
    constraint alone determines (jump-forward: emitted without a forward, fed by the next one),
    repeating; never ends."""

    def __init__(self, free: int = 4, forced: int = 3, vocab: int = 256, every: int = 1) -> None:
        self.free, self.forced, self.vocab, self.n, self.every = free, forced, vocab, 0, every

    def _token(self, n: int) -> int:  # the forced token at output position n (varied: few copies)
        return (n * 37) % 240 + 10

    def _slot(self, n: int) -> int:
        return n % (self.free + self.forced)

    def allowed_mask(self):
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        if self._slot(self.n) < self.free:
            mask[::self.every] = True
        else:
            mask[self._token(self.n)] = True
        return mask

    def advance(self, token_id: int) -> bool:
        if not bool(self.allowed_mask()[token_id]):
            return False
        self.n += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        self.n -= num_tokens

    def forced_tokens(self) -> list:
        slot = self._slot(self.n)
        left = self.free + self.forced - slot
        return [] if slot < self.free else [self._token(self.n + i) for i in range(left)]

    def is_terminated(self) -> bool:
        return False


@pytest.mark.parametrize("family,every", [("llama", 1), ("qwen2", 1), ("qwen2", 3)])
def test_the_head_drafts_after_a_jump_forward_and_under_a_constraint(family, every, monkeypatch):
    """Defects (issue 56, the pair's no-draft forwards): after a jump-forward the view ends with
    tokens no verifier forward has read (no features yet), and the head returned no drafts, so
    every forward after forced tokens without a copy was a plain step; it now runs over them on
    its own outputs and drafts. And the head drafted its plain argmax, cut by the constraint
    afterwards (no draft where the constraint forbids its first token, `every` = 3: two of three
    tokens forbidden); it now drafts its best allowed token, as the drafter model does. Greedy
    tokens stay the verifier's."""
    from asymagent.decoding.feature_drafter import FeatureDrafter

    verifier = _verifier(family)
    engine = _engine(verifier, _head(verifier))
    full = Engine(verifier=verifier)
    asked: list = []
    propose = FeatureDrafter.propose

    def logged(self, k):
        drafts = propose(self, k)
        asked.append((k, len(drafts)))
        return drafts

    monkeypatch.setattr(FeatureDrafter, "propose", logged)
    forced = 0
    for i, p in enumerate(_prompts(3, seed=14)):
        for turn in range(2):  # the second turn reuses the verifier's and the head's caches
            kw = dict(max_new_tokens=20, cache_key=f"j{i}")
            r = engine.generate(p, mode="spec", constraint=_ForcedRuns(every=every), **kw)
            want = full.generate(p, mode="full", constraint=_ForcedRuns(every=every), **kw).token_ids
            assert r.token_ids == want
            forced += r.stats.forced_tokens
            p = p + r.token_ids + p[:5]
    assert forced > 0
    empty = [k for k, n in asked if k >= 1 and n == 0]
    assert asked and not empty, f"{len(empty)} of {len(asked)} proposals drafted nothing"
