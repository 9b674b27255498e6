"""Append-stability property (hypothesis): a view of history n is a prefix of that of n+1,
unless the step reports a counted rewrite."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asymagent.chat.chat_format import ChatFormat
from asymagent.context.views import ContextViews, VerifierBudgetError

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up in the knowledge base and return the record.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]

CONFIGS = [
    {"compressors": ["tool_output"]},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1},
                     {"type": "recent_turns", "keep_turns": 1, "demote_every": 2}]},
    {"compressors": ["tool_output", "tool_schemas", {"type": "recent_turns", "keep_turns": 2,
                                                      "demote_every": 1}]},
    {"compressors": [{"type": "surprisal", "keep_ratio": 0.5, "min_tokens": 4}, "recent_turns"]},
    {"compressors": ["tool_output"], "max_verifier_tokens": 700},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1,
                      "query_keep_tokens": 24}]},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1,
                      "keep_newest": True, "query_keep_tokens": 24}]},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1,
                      "query_keep_tokens": 24, "query_keep_rank": "per_token"}]},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1,
                      "query_keep_tokens": 24, "id_keep_tokens": 24}]},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1,
                      "query_keep_tokens": 24, "id_keep_tokens": 24, "min_gap": 6}]},
    {"compressors": [{"type": "tool_output", "head_tokens": 8, "tail_tokens": 4, "min_omitted": 1,
                      "query_keep_tokens": 24, "id_keep_tokens": 24, "min_gap": 6}],
     "keep_unit": "block", "keep_unit_max_tokens": 12, "readmit_lexical_tokens": 16},
]

text = st.text(alphabet=st.sampled_from(list("abc xyz,.:{}[]\"0123456789\néü東🚀")), max_size=60)
output = st.one_of(
    text,
    st.builds(lambda t, n: (t + "\n") * n, text, st.integers(1, 40)),  # long, repetitive
    st.dictionaries(st.sampled_from(["a", "b", "c"]),
                    st.one_of(st.integers(), text, st.lists(st.integers(), max_size=5))),  # nested
)
# One agent step: ("user", text) | ("call", key, output, thought) | ("final", text) | ("edit",)
step = st.one_of(
    st.tuples(st.just("user"), text),
    st.tuples(st.just("call"), text, output, st.one_of(st.none(), text)),
    st.tuples(st.just("final"), text),
    st.tuples(st.just("edit")),
)


@pytest.fixture(scope="module")
def cf(smollm_tokenizer):
    return ChatFormat(smollm_tokenizer)


def fake_logprobs(ids: list) -> list:
    """Deterministic stand-in for the drafter's per-token log-probs."""
    return [-((t * 2654435761) % 1000) / 100.0 for t in ids]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=st.sampled_from(CONFIGS), steps=st.lists(step, min_size=1, max_size=10),
       use_tools=st.booleans())
def test_views_are_append_stable_or_count_a_rewrite(cf, config, steps, use_tools):
    views = ContextViews(compression=config, chat_format=cf)
    tools = TOOLS if use_tools else None
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "start"}]
    prev_full = prev_body = None
    for i, s in enumerate(steps):
        edited = False
        if s[0] == "user":
            messages.append({"role": "user", "content": s[1]})
        elif s[0] == "final":
            messages += [{"role": "assistant", "content": s[1]}, {"role": "user", "content": "next"}]
        elif s[0] == "call":
            cid = f"call_{i}"
            messages += [{"role": "assistant", "content": s[3], "tool_calls": [{"id": cid,
                          "type": "function", "function": {"name": "lookup",
                                                           "arguments": json.dumps({"key": s[1]})}}]},
                         {"role": "tool", "tool_call_id": cid, "content": s[2]}]
        else:  # rewrite history: the user's first message changes
            messages[1] = {"role": "user", "content": messages[1]["content"] + " (edited)"}
            edited = True
        try:
            pair = views.build(messages, tools, logprob_fn=fake_logprobs)
        except VerifierBudgetError:
            return  # documented: a view that cannot fit the budget is an error, not a silent cut
        gen = pair.generation_prompt_len
        full_body, body = pair.full_ids[:-gen], pair.compressed_ids[:-gen]
        assert pair.full_ids[-gen:] == pair.compressed_ids[-gen:]  # same generation point
        if prev_full is not None and not edited:
            assert full_body[: len(prev_full)] == prev_full  # the full view only grows
        if prev_body is not None:
            extends = body[: len(prev_body)] == prev_body
            assert extends == (pair.rewrites == 0), (extends, pair.rewrites)
            if edited:
                assert pair.rewrites == 1  # a rewritten history is always counted
        if config.get("max_verifier_tokens"):
            assert pair.verifier_context_tokens <= config["max_verifier_tokens"]
        prev_full, prev_body = full_body, body
