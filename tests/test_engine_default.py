"""The engine on the embedded SmolLM2-135M-Instruct verifier (slow: loads the real model).

The drafter is a 2-layer LlamaForCausalLM made from the verifier's first two layers sharing its
embeddings and head (asymagent.modeling.drafter.build_drafter), with the 8192 lowest token ids as the
draft vocabulary (BPE assigns low ids to frequent merges).
"""

from __future__ import annotations

import pytest
import torch

from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def engine(default_verifier):
    from asymagent.modeling.drafter import build_drafter

    verifier = default_verifier.model
    return Engine(verifier=verifier, drafter=build_drafter(verifier, 2),
                  tokenizer=default_verifier.tokenizer, spec=SpecConfig(k=2),
                  draft_vocab=torch.arange(8192))


def test_chat_modes_on_the_embedded_verifier(engine):
    messages = [{"role": "user", "content": "What is the capital of France? One word."}]
    results = {m: engine.chat(messages, mode=m, max_new_tokens=12, cache_key=m)
               for m in ("full", "spec", "asym")}
    full = results["full"]
    assert "Paris" in full.text  # the instruct model knows this one
    assert results["spec"].token_ids == full.token_ids  # greedy spec is lossless
    for mode, r in results.items():
        s = r.stats
        assert s.new_tokens == len(r.token_ids) >= 1
        assert s.verifier_prefill_tokens == s.verifier_context_tokens  # cold session: all of it
        assert 0 < s.compression_ratio <= 1.0 and s.verifier_flops > 0
        assert s.wall_s >= s.prefill_s > 0 and s.ttft_s <= s.wall_s
        if mode != "full":
            assert s.drafted >= s.accepted and s.rounds >= 1
            # a round emits at most its drafts + 1 bonus: K=2 model drafts, or up to
            # lookup_k copied ones (suffix drafting)
            assert 1.0 <= s.mean_accepted_len <= max(2, engine.spec.lookup_k) + 1
    # an agent step: the history grows; only the new suffix is prefilled
    history = messages + [{"role": "assistant", "content": full.text},
                          {"role": "user", "content": "And of Italy?"}]
    again = engine.chat(history, mode="spec", max_new_tokens=8, cache_key="spec")
    assert again.stats.verifier_prefill_tokens < again.stats.verifier_context_tokens / 2
    assert again.stats.drafter_prefill_tokens < again.stats.full_context_tokens / 2


def test_required_tool_call_is_schema_valid(engine):
    r = engine.chat([{"role": "user", "content": "What's the weather in Paris?"}], tools=TOOLS,
                    tool_choice="required", mode="asym", max_new_tokens=40, cache_key="tools")
    assert r.finish_reason == "tool_calls"
    assert r.tool_calls and r.tool_calls[0]["function"]["name"] == "get_weather"
    assert r.stats.forced_tokens > 0  # the schema's fixed parts are jump-forwarded


def test_from_default_explains_a_missing_drafter():
    from asymagent.modeling.drafter import DEFAULT_DRAFTER_FILE

    if DEFAULT_DRAFTER_FILE.is_file():
        assert Engine.from_default().drafter is not None
    else:
        with pytest.raises(FileNotFoundError, match="train-drafter"):
            Engine.from_default()
