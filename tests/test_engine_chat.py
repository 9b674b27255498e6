"""chat(): views, the drafter's log-prob function for surprisal compression, prefix reuse."""

from __future__ import annotations

import pytest
import torch

from asymagent.chat.session import drafter_logprob_fn
from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts


def _reference_logprobs(model, ids):
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    # log p(token_t | tokens_<t) for t >= 1; the first token has no context: 0.0
    return [0.0] + logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_logprob_fn_is_exact_and_incremental():
    verifier = make_model(seed=0)
    drafter = noisy_copy(verifier, 0.6)
    engine = Engine(verifier=verifier, drafter=drafter)
    ids = random_prompts(1, length=40)[0]
    counter = [0]
    fn = drafter_logprob_fn(engine, "conv", counter)
    got = fn(ids)
    assert len(got) == len(ids)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(_reference_logprobs(drafter, ids)),
                               atol=1e-4, rtol=0)  # fp32 cached vs one-shot forward
    assert counter[0] == 39  # tokens 0..38 fed; the last token's log-prob needs no forward
    longer = ids + random_prompts(1, length=10, seed=1)[0]
    got = fn(longer)
    torch.testing.assert_close(torch.tensor(got),
                               torch.tensor(_reference_logprobs(drafter, longer)),
                               atol=1e-4, rtol=0)
    assert counter[0] == 39 + 11  # re-fed token 39 (its output predicts token 40) + 40..48
    # generate then finds the drafter cache warm: only the last token is re-fed
    r = engine.generate(longer, mode="spec", max_new_tokens=4, cache_key="conv")
    assert r.stats.drafter_prefill_tokens == 1


@pytest.fixture(scope="module")
def chat_engine(smollm_tokenizer):
    # a 1-layer model over the real SmolLM2 vocabulary (49152 x 32 embedding): chat templates
    # and the tokenizer are real, the model is tiny; its text is noise, its token ids are not
    verifier = make_model(seed=0, vocab=49152, hidden=32, layers=1, max_positions=4096)
    return Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.3), tokenizer=smollm_tokenizer,
                  spec=SpecConfig(k=3), compression={"compressors": ["surprisal"]})


def test_chat_spec_equals_full_and_reuses_the_prefix(chat_engine):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say something."}]
    full = chat_engine.chat(messages, mode="full", max_new_tokens=8, cache_key="f")
    spec = chat_engine.chat(messages, mode="spec", max_new_tokens=8, cache_key="s")
    assert spec.token_ids == full.token_ids  # greedy spec is lossless through chat too
    assert spec.stats.verifier_prefill_tokens == spec.stats.full_context_tokens  # cold
    history = messages + [{"role": "assistant", "content": spec.text},
                          {"role": "user", "content": "Again."}]
    again = chat_engine.chat(history, mode="spec", max_new_tokens=8, cache_key="s")
    # the new turn's tokens (plus the re-rendered end of the answer) are all that is prefilled
    assert again.stats.verifier_prefill_tokens < again.stats.full_context_tokens - \
        spec.stats.full_context_tokens + 4
    assert again.finish_reason in ("stop", "length")


def test_chat_asym_with_surprisal_compression(chat_engine):
    tool_output = " ".join(f"row {i}: value {i * 7} status ok" for i in range(40))
    messages = [{"role": "user", "content": "Check the table."},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "read_table", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": tool_output}]
    r = chat_engine.chat(messages, mode="asym", max_new_tokens=6, cache_key="a")
    s = r.stats
    assert s.verifier_context_tokens < s.full_context_tokens  # surprisal pruned the tool output
    assert s.compression_ratio < 1.0
    conversation = chat_engine.conversation("a")  # the chat state beside the caches
    assert len(conversation.logprobs) == s.full_context_tokens  # views asked for the log-probs
    # the drafter prefilled the full view once, for the log-probs (tokens 0..n-2; generate's
    # prefill then re-fed only the last one); with beta = 0 (the default) there is no base pass,
    # so the compressed view is never prefilled by the drafter
    assert s.drafter_prefill_tokens == (s.full_context_tokens - 1) + 1


def test_chat_names_the_bad_entry_before_any_work(smollm_tokenizer):
    engine = Engine(verifier=make_model(seed=0, vocab=49152, hidden=32, layers=1),
                    tokenizer=smollm_tokenizer)
    ok = {"role": "user", "content": "hi"}
    # the error names the offending index: entry 1 has no role, entry 2 is not a dict
    with pytest.raises(ValueError, match=r"messages\[1\] must be a dict with a 'role'"):
        engine.chat([ok, {"content": "no role"}], mode="full")
    with pytest.raises(ValueError, match=r"messages\[2\]"):
        engine.chat([ok, ok, "hello"], mode="full")
    # a bad mode is caught by chat itself, before rendering views or computing log-probs
    with pytest.raises(ValueError, match="unknown mode 'turbo'"):
        engine.chat([ok], mode="turbo")
    assert len(engine.caches) == 0  # every rejection came before a cache session was made
