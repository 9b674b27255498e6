"""ToolCallConstraint driven by the real Engine: valid calls under speculation, lossless greedy."""

from __future__ import annotations

import pytest
from conftest import make_tiny_llama
from test_tool_constraint import PARAMS, TOOLS, V

from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from asymagent.chat.tool_constraint import ToolCallConstraint, parse_call
from asymagent.agents.tools import schema_errors


@pytest.fixture(scope="module")
def engine(smollm_tokenizer):
    verifier = make_tiny_llama(vocab_size=V, seed=1)
    drafter = make_tiny_llama(vocab_size=V, layers=1, seed=2)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=smollm_tokenizer,
                  spec=SpecConfig(k=3))


@pytest.fixture(scope="module")
def prompt(smollm_tokenizer):
    return smollm_tokenizer.encode(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def generate(engine, tok, prompt, mode, seed, temperature, choice="required"):
    c = ToolCallConstraint(tok, TOOLS, choice, vocab_size=V)
    compressed = prompt[-8:] if mode in ("asym", "compressed") else None  # a real view gap
    r = engine.generate(prompt, mode=mode, max_new_tokens=100, temperature=temperature,
                        seed=seed, constraint=c, compressed_prompt_ids=compressed,
                        cache_key=f"tc-{mode}")
    return c, r


@pytest.mark.parametrize("mode", ["full", "compressed", "spec", "asym"])
def test_engine_outputs_are_valid_calls(engine, smollm_tokenizer, prompt, mode):
    for seed in range(6):  # seeds 0-2 greedy, 3-5 sampled at temperature 1
        temperature = 0.0 if seed < 3 else 1.0
        c, r = generate(engine, smollm_tokenizer, prompt, mode, seed, temperature)
        assert c.is_terminated() and r.finish_reason == "stop", r.text
        obj = parse_call(r.text)
        assert not schema_errors(obj["arguments"], PARAMS[obj["name"]]), r.text
        assert r.stats.forced_tokens >= 3  # '{"' 'name' '":' at least are jump-forwarded
        if mode in ("spec", "asym"):
            assert r.stats.drafted > 0  # speculation really ran under the constraint
            assert r.stats.accepted <= r.stats.drafted


def test_greedy_spec_under_constraint_is_lossless(engine, smollm_tokenizer, prompt):
    """Mode spec (exact acceptance) masks drafter and verifier alike: greedy output must equal
    the verifier alone under the same constraint, token for token."""
    for seed in range(3):
        _, full = generate(engine, smollm_tokenizer, prompt, "full", seed, 0.0)
        _, spec = generate(engine, smollm_tokenizer, prompt, "spec", seed, 0.0)
        assert spec.token_ids == full.token_ids


def test_named_choice_through_engine(engine, smollm_tokenizer, prompt):
    c, r = generate(engine, smollm_tokenizer, prompt, "asym", 0, 1.0, choice="get_weather")
    obj = parse_call(r.text)
    assert obj["name"] == "get_weather"
    assert not schema_errors(obj["arguments"], PARAMS["get_weather"])


@pytest.mark.parametrize("mode", ["spec", "asym"])
def test_lookup_drafts_under_constraint(engine, smollm_tokenizer, prompt, mode):
    """Prompt-lookup drafts go through the constraint like drafter drafts: calls stay valid and
    greedy spec stays equal to the verifier alone. The prompt carries an earlier call, so its
    n-grams ('{"name": "get_weather", ...') recur while the new call is decoded."""
    history = smollm_tokenizer.encode(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call><|im_end|>\n")
    lookup_prompt = history + prompt
    saved = engine.spec
    engine.spec = SpecConfig(k=3, lookup_ngram=2, lookup_k=6)
    try:
        lookups = 0
        for seed in range(4):  # 0-1 greedy, 2-3 sampled
            temperature = 0.0 if seed < 2 else 1.0
            c, r = generate(engine, smollm_tokenizer, lookup_prompt, mode, seed, temperature)
            assert c.is_terminated() and r.finish_reason == "stop", r.text
            obj = parse_call(r.text)
            assert not schema_errors(obj["arguments"], PARAMS[obj["name"]]), r.text
            lookups += r.stats.lookup_rounds
            if mode == "spec" and temperature == 0.0:
                _, full = generate(engine, smollm_tokenizer, lookup_prompt, "full", seed, 0.0)
                assert r.token_ids == full.token_ids
        assert lookups > 0
    finally:
        engine.spec = saved


def test_spec_leaves_the_verifier_cache_a_one_token_decode_leaves(smollm_tokenizer, prompt):
    """After a call whose closing tokens the constraint forces, mode spec's verifier cache must
    hold what mode full's holds (the prompt and the output before the last token a model chose):
    a drafter equal to the verifier gets those forced tokens accepted as drafts, i.e. fed, where
    full jump-forwards them unfed; the next request would then prefill from another position."""
    verifier = make_tiny_llama(vocab_size=V, seed=1)
    engine = Engine(verifier=verifier, drafter=verifier, tokenizer=smollm_tokenizer, spec=SpecConfig(k=4))
    cached = {}
    for mode in ("full", "spec"):
        c, r = generate(engine, smollm_tokenizer, prompt, mode, 0, 0.0)
        assert c.is_terminated()
        cached[mode] = (r.token_ids, engine.caches.session(f"tc-{mode}").get("verifier_full").tokens)
    (out_full, cache_full), (out_spec, cache_spec) = cached["full"], cached["spec"]
    assert out_spec == out_full
    assert len(cache_full) < len(prompt) + len(out_full) - 1  # full left its forced tail unfed
    assert cache_spec == cache_full
