"""Penalties, logit bias, top-k, min-p and log-probs through the engine (every mode, speculation on).

Penalised greedy speculation must equal penalised greedy decoding by the verifier alone: that only
holds if every row of a round counts the drafts before it (asymagent/decoding/logit_processors.py).
Log-probs must be the verifier's own rows, checked against a plain forward of the same tokens.
"""

from __future__ import annotations

import pytest
import torch

from asymagent.decoding.logit_processors import LogitProcessors
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_constraint import TREE, PrefixTree
from test_engine_models import make_model, noisy_copy, random_prompts

V = 256
MODES = ("full", "spec", "asym")


@pytest.fixture(scope="module")
def engine():
    verifier = make_model(0)
    return Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.5), spec=SpecConfig(k=3))


def run(engine, prompt, mode, **kw):
    kw.setdefault("max_new_tokens", 16)
    return engine.generate(prompt, mode=mode, cache_key=f"sf-{mode}", **kw)


def direct_logprobs(model, prompt, new):
    """log p(new[i] | prompt + new[:i]) from one plain forward: [len(new)]."""
    ids = torch.tensor([prompt + new])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)  # [T, V]
    rows = logp[len(prompt) - 1: len(prompt) - 1 + len(new)]
    return rows.gather(1, torch.tensor(new)[:, None])[:, 0], rows


def test_penalties_count_generated_tokens_and_the_drafts_before_each_row():
    p = LogitProcessors(frequency_penalty=1.0, presence_penalty=0.5, logit_bias={7: 3.0})
    rows = p.penalise(torch.zeros(3, 10), generated=[1, 1, 2], drafts=[2, 5])  # [3, 10]
    expected = torch.zeros(3, 10)
    expected[:, 7] = 3.0
    expected[:, 1] = -(2 * 1.0 + 0.5)  # twice in the generated tokens, in every row
    expected[0, 2] = -(1 + 0.5)  # row 0: generated only
    expected[1:, 2] = -(2 + 0.5)  # rows 1, 2: + draft d1 = 2
    expected[2, 5] = -(1 + 0.5)  # row 2: + draft d2 = 5
    assert torch.equal(rows, expected)


def test_top_k_and_min_p_truncate_only_when_sampling():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top2 = LogitProcessors(top_k=2).truncate(logits, temperature=1.0)
    assert torch.isinf(top2[2:]).all() and torch.isfinite(top2[:2]).all()
    minp = LogitProcessors(min_p=0.5).truncate(logits, temperature=1.0)  # keep p >= 0.25
    assert torch.isfinite(minp[:2]).all() and torch.isinf(minp[2:]).all()
    assert torch.equal(LogitProcessors(top_k=1).truncate(logits, 0.0), logits)  # greedy: as is


@pytest.mark.parametrize("bad", [dict(frequency_penalty=3.0), dict(presence_penalty=-2.5),
                                 dict(top_k=-1), dict(min_p=1.5), dict(logit_bias={V: 1.0}),
                                 dict(logit_bias={3: 101.0}), dict(logprobs=21),
                                 dict(logprobs=True)])
def test_bad_values_are_refused_by_name(engine, bad):
    name = next(iter(bad)).split("_")[0]
    with pytest.raises(ValueError, match=name if name != "logprobs" else "logprobs"):
        run(engine, random_prompts(1)[0], "full", **bad)


def test_penalised_speculation_equals_penalised_verifier(engine):
    penalties = dict(frequency_penalty=1.5, presence_penalty=0.5, logit_bias={5: 2.0, 9: -4.0})
    changed = 0
    for prompt in random_prompts(4, seed=11):
        plain = run(engine, prompt, "full").token_ids
        reference = run(engine, prompt, "full", **penalties).token_ids
        changed += reference != plain
        for mode in ("spec", "asym"):  # asym without a compressed view: target = verifier
            out = run(engine, prompt, mode, **penalties)
            assert out.token_ids == reference, mode
            assert out.stats.drafted > 0  # speculation really ran
    assert changed  # the penalties changed what the verifier says


def test_logit_bias_forces_and_forbids(engine):
    prompt = random_prompts(1, seed=3)[0]
    for mode in MODES:
        assert set(run(engine, prompt, mode, logit_bias={42: 100.0}).token_ids) == {42}
    first = run(engine, prompt, "full").token_ids[0]
    for mode in MODES:
        assert first not in run(engine, prompt, mode, logit_bias={first: -100.0}).token_ids


def test_top_k_one_and_min_p_one_sample_the_argmax(engine):
    prompt = random_prompts(1, seed=5)[0]
    greedy = run(engine, prompt, "full").token_ids
    for mode in MODES:
        for seed in range(3):
            assert run(engine, prompt, mode, temperature=1.0, seed=seed, top_k=1).token_ids == greedy
            assert run(engine, prompt, mode, temperature=1.0, seed=seed, min_p=1.0).token_ids == greedy


@pytest.mark.parametrize("mode", MODES)
def test_logprobs_are_the_verifiers_rows(engine, mode):
    for prompt in random_prompts(2, seed=21):
        r = run(engine, prompt, mode, logprobs=3)
        assert [e.token_id for e in r.logprobs] == r.token_ids
        want, rows = direct_logprobs(engine.verifier, prompt, r.token_ids)
        got = torch.tensor([e.logprob for e in r.logprobs])
        assert torch.allclose(got, want, atol=1e-4)
        for e, row in zip(r.logprobs, rows):  # the top alternatives, most likely first
            ids, lps = zip(*e.top)
            assert list(ids) == row.topk(3).indices.tolist()
            assert torch.allclose(torch.tensor(lps), row.topk(3).values, atol=1e-4)


def test_asym_reports_the_verifier_on_its_compressed_view(engine):
    prompt = random_prompts(1, length=24, seed=8)[0]
    view = prompt[-10:]  # what the verifier reads
    r = run(engine, prompt, "asym", compressed_prompt_ids=view, logprobs=0)
    want, _ = direct_logprobs(engine.verifier, view, r.token_ids)
    assert torch.allclose(torch.tensor([e.logprob for e in r.logprobs]), want, atol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_jump_forward_tokens_get_their_rows_too(engine, mode):
    """Tokens the constraint forced (no forward of their own, some at the very end) are scored
    by the forwards that feed them, or by one more forward at the end."""
    prompt = random_prompts(1, seed=4)[0]
    r = engine.generate(prompt, mode=mode, max_new_tokens=10, cache_key=f"jf-{mode}",
                        constraint=PrefixTree(TREE), logprobs=1)
    assert r.stats.forced_tokens >= 6 and r.token_ids in TREE  # forced at the start and the end
    want, _ = direct_logprobs(engine.verifier, prompt, r.token_ids)
    assert torch.allclose(torch.tensor([e.logprob for e in r.logprobs]), want, atol=1e-4)


def test_stop_string_cut_leaves_one_entry_per_kept_token(smollm_tokenizer):
    from conftest import make_tiny_llama

    verifier = make_tiny_llama(vocab_size=49152, seed=4)
    engine = Engine(verifier=verifier, drafter=make_tiny_llama(vocab_size=49152, layers=1, seed=5),
                    tokenizer=smollm_tokenizer)
    prompt = smollm_tokenizer.encode("Hello there, how are you")
    full = engine.generate(prompt, mode="spec", max_new_tokens=12)
    text = full.text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("the random model's text has no usable stop string here")
    r = engine.generate(prompt, mode="spec", max_new_tokens=12, stop=[stop], logprobs=0)
    assert len(r.logprobs) == len(r.token_ids) and r.finish_reason == "stop"
