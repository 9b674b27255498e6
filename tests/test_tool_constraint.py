"""ToolCallConstraint: schema-valid calls under greedy/sampled decoding, rollback, jump-forward."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_llama

from asymagent.decoding.constraint import TokenConstraint
from asymagent.chat.tool_constraint import ToolCallConstraint, measure_overhead, parse_call
from asymagent.agents.tools import schema_errors

V = 49152  # SmolLM2 vocabulary size (the tiny model uses the real tokenizer's ids)

# Bounded parameters (maxLength, min/max) so a random model cannot write forever: with
# unbounded strings a random walk may never pick the closing quote within the token budget.
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string", "maxLength": 12},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
    {"type": "function", "function": {"name": "search", "description": "search", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["query"],
        "properties": {"query": {"type": "string", "maxLength": 20},
                       "k": {"type": "integer", "minimum": 0, "maximum": 100},
                       "exact": {"type": "boolean"}, "lang": {"enum": ["en", "fr"]}}}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(vocab_size=V, seed=3)


@pytest.fixture(scope="module")
def prompt(smollm_tokenizer):
    text = "<|im_start|>user\nWeather in Paris for 3 days?<|im_end|>\n<|im_start|>assistant\n"
    return smollm_tokenizer.encode(text)


def decode_constrained(model, tok, prompt_ids, tool_choice, *, seed, sample, budget=120,
                       use_forced=True, vocab_size=V):
    """Plain constrained decoding: forced tokens first, else mask the logits and pick."""
    c = ToolCallConstraint(tok, TOOLS, tool_choice, vocab_size=vocab_size)
    gen = torch.Generator().manual_seed(seed)
    ids, out, forced = list(prompt_ids), [], 0
    with torch.no_grad():
        while not c.is_terminated() and len(out) < budget:
            jump = c.forced_tokens() if use_forced else []
            if jump:
                for t in jump:
                    assert c.advance(t)
                ids += jump
                out += jump
                forced += len(jump)
                continue
            logits = model(torch.tensor([ids])).logits[0, -1]  # [V]
            logits = logits.masked_fill(~c.allowed_mask(), float("-inf"))
            if sample:
                t = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            else:
                t = int(logits.argmax())
            assert c.advance(t)
            ids.append(t)
            out.append(t)
    return c, out, forced


def assert_valid_call(text: str, names: set):
    obj = parse_call(text)
    assert obj["name"] in names
    assert schema_errors(obj["arguments"], PARAMS[obj["name"]]) == [], text


def test_is_a_token_constraint(smollm_tokenizer):
    assert isinstance(ToolCallConstraint(smollm_tokenizer, TOOLS), TokenConstraint)


@pytest.mark.parametrize("sample", [False, True])
def test_every_output_is_a_schema_valid_call(tiny, smollm_tokenizer, prompt, sample):
    names = {"get_weather", "search"}
    texts = set()
    for seed in range(12):  # 12 seeds x 2 settings; a random model stresses the grammar
        model = tiny if seed % 2 == 0 else make_tiny_llama(vocab_size=V, seed=100 + seed)
        c, out, forced = decode_constrained(model, smollm_tokenizer, prompt, "required",
                                            seed=seed, sample=sample)
        assert c.is_terminated(), smollm_tokenizer.decode(out, skip_special_tokens=True)
        text = smollm_tokenizer.decode(out, skip_special_tokens=True)
        assert_valid_call(text, names)
        # '{"' 'name' '":' are forced at the start of every call: at least 3 tokens for free.
        assert forced >= 3
        texts.add(text)
    assert len(texts) > 1  # different models/seeds really produce different calls


def test_named_tool_choice_forces_that_tool(tiny, smollm_tokenizer, prompt):
    for choice in ("search", {"type": "function", "function": {"name": "search"}}):
        for seed in range(4):
            c, out, forced = decode_constrained(tiny, smollm_tokenizer, prompt, choice,
                                                seed=seed, sample=True)
            text = smollm_tokenizer.decode(out, skip_special_tokens=True)
            assert_valid_call(text, {"search"})
            # The name has one option, so '{"name": "search", "arguments": {"' is forced
            # up to the first argument key's opening quote: more than 8 tokens.
            assert forced > 8


def test_without_jump_forward_same_validity(tiny, smollm_tokenizer, prompt):
    for seed in range(3):
        c, out, forced = decode_constrained(tiny, smollm_tokenizer, prompt, "required",
                                            seed=seed, sample=True, use_forced=False)
        assert forced == 0
        assert_valid_call(smollm_tokenizer.decode(out, skip_special_tokens=True), {"get_weather", "search"})


def test_speculative_rollback_keeps_state_consistent(smollm_tokenizer, prompt):
    """Draft K tokens with one model under the mask, verify with another, roll back rejects.

    The final text must still be a valid call, and after every rollback the mask must equal
    the mask read before drafting (same matcher state).
    """
    drafter = make_tiny_llama(vocab_size=V, seed=11)
    verifier = make_tiny_llama(vocab_size=V, seed=12)
    tok = smollm_tokenizer
    for seed in range(4):
        c = ToolCallConstraint(tok, TOOLS, "required", vocab_size=V)
        ids, out, k = list(prompt), [], 3
        with torch.no_grad():
            while not c.is_terminated() and len(out) < 150:
                before = c.allowed_mask().clone()
                drafts, masks = [], []
                for _ in range(k):
                    if c.is_terminated():
                        break
                    m = c.allowed_mask()
                    masks.append(m)
                    logits = drafter(torch.tensor([ids + drafts])).logits[0, -1]
                    d = int(logits.masked_fill(~m, float("-inf")).argmax())
                    assert c.advance(d)
                    drafts.append(d)
                masks.append(c.allowed_mask())  # position K+1
                c.rollback(len(drafts))
                assert torch.equal(c.allowed_mask(), before)
                vl = verifier(torch.tensor([ids + drafts])).logits[0, len(ids) - 1:]  # [K+1, V]
                vl = vl[: len(masks)].masked_fill(~torch.stack(masks), float("-inf"))
                accepted = 0
                while accepted < len(drafts) and int(vl[accepted].argmax()) == drafts[accepted]:
                    accepted += 1
                emitted = drafts[:accepted] + [int(vl[accepted].argmax())]
                for t in emitted:
                    if c.is_terminated():  # the stop token was accepted: the call is over
                        break
                    assert c.advance(t)
                    ids.append(t)
                    out.append(t)
        assert c.is_terminated()
        assert_valid_call(tok.decode(out, skip_special_tokens=True), {"get_weather", "search"})


def test_mask_covers_padded_vocab_and_rejects_bad_tokens(smollm_tokenizer):
    c = ToolCallConstraint(smollm_tokenizer, TOOLS, vocab_size=V + 64)
    mask = c.allowed_mask()
    assert mask.shape == (V + 64,) and mask.dtype == torch.bool
    assert not mask[V:].any()  # ids past the tokenizer never decode to text
    # Nothing is emitted yet, so the only allowed tokens start the object with '{'.
    allowed = [smollm_tokenizer.decode([int(i)]) for i in mask.nonzero().flatten()]
    assert allowed and all(a.startswith("{") for a in allowed)
    bad = smollm_tokenizer.encode("hello")[0]
    assert c.advance(bad) is False and c.num_accepted == 0
    assert c.advance(V + 10) is False
    with pytest.raises(ValueError):
        c.rollback(1)


def test_forced_tokens_are_unambiguous(smollm_tokenizer):
    tok = smollm_tokenizer
    c = ToolCallConstraint(tok, TOOLS, "search")
    forced = c.forced_tokens()
    text = tok.decode(forced)
    # The grammar forces '{"name": "search", "arguments": {"'; its encoding ends with ' {"',
    # which is held back because the next key's first characters could merge with it.
    full = c._matcher.find_jump_forward_string()
    assert full.startswith('{"name": "search", "arguments": {')
    assert full.startswith(text) and len(text) < len(full)
    assert forced == tok.encode(text, add_special_tokens=False)
    assert c.num_accepted == 0  # forced_tokens() does not move the matcher


def test_hermes_wrapping(tiny, smollm_tokenizer):
    c = ToolCallConstraint(smollm_tokenizer, TOOLS, "get_weather", hermes=True)
    ids = smollm_tokenizer.encode("<|im_start|>assistant\n")
    out = []
    with torch.no_grad():
        while not c.is_terminated() and len(out) < 120:
            jump = c.forced_tokens()
            for t in jump:
                assert c.advance(t)
            out += jump
            ids += jump
            if jump:
                continue
            logits = tiny(torch.tensor([ids])).logits[0, -1].masked_fill(~c.allowed_mask(), -1e9)
            t = int(logits.argmax())
            assert c.advance(t)
            out.append(t)
            ids.append(t)
    text = smollm_tokenizer.decode(out, skip_special_tokens=True)
    assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")
    obj = parse_call(text, hermes=True)
    assert obj["name"] == "get_weather" and not schema_errors(obj["arguments"], PARAMS["get_weather"])


@pytest.mark.parametrize("bad", ["auto", "none", "nope", {"type": "function", "function": {}}, 3])
def test_bad_tool_choice(smollm_tokenizer, bad):
    with pytest.raises(ValueError):
        ToolCallConstraint(smollm_tokenizer, TOOLS, bad)


def test_bad_tools(smollm_tokenizer):
    with pytest.raises(ValueError, match="at least one tool"):
        ToolCallConstraint(smollm_tokenizer, [], "required")
    with pytest.raises(ValueError, match="no function name"):
        ToolCallConstraint(smollm_tokenizer, [{"type": "function", "function": {}}])
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        ToolCallConstraint(smollm_tokenizer, TOOLS, vocab_size=100)


def test_overhead_is_small(smollm_tokenizer):
    r = measure_overhead(smollm_tokenizer, TOOLS, calls=5)
    assert r["tokens"] > 20
    # Measured ~40 us/token on 2 shared cores. A 135M decode forward costs ~40 ms there, so
    # even 5 ms (100x the measurement, room for a loaded CI box) would be a small overhead.
    assert r["total_us"] < 5000, json.dumps(r)


def test_bounded_strings_reject_control_characters(smollm_tokenizer):
    """xgrammar's maxLength strings admit raw control characters; ours must not (invalid JSON)."""
    tok = smollm_tokenizer
    c = ToolCallConstraint(tok, TOOLS, "search")
    for t in c.forced_tokens():  # '{"name": "search", "arguments": {"query":' (only required key)
        assert c.advance(t)
    rest = c._matcher.find_jump_forward_string()
    assert rest == ' "'  # the value's opening quote: forced, held back as the string's last token
    for t in tok.encode(rest, add_special_tokens=False):
        assert c.advance(t)
    mask = c.allowed_mask()
    tab, letter = tok.encode("\t")[0], tok.encode("a")[0]
    assert mask[letter] and not mask[tab]


def test_after_the_stop_token_only_stop_tokens_are_absorbed(smollm_tokenizer):
    tok = smollm_tokenizer
    c = ToolCallConstraint(tok, TOOLS, "get_weather")
    text = '{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}'
    for t in tok.encode(text, add_special_tokens=False):
        assert c.advance(t)
    assert c.is_completed() and not c.is_terminated()
    assert c.forced_tokens() == [tok.convert_tokens_to_ids("<|im_end|>")]  # the only stop id
    assert c.advance(c.forced_tokens()[0]) and c.is_terminated()
    # A speculative round may emit a second stop token at its bonus position: absorbed.
    assert c.advance(c.stop_ids[0]) and not c.advance(tok.encode("a")[0])
    assert c.allowed_mask().nonzero().flatten().tolist() == list(c.stop_ids)
    c.rollback(2)  # the absorbed stop and the real one
    assert c.is_completed() and not c.is_terminated()
    assert parse_call(c.text()) == {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}
