"""Lexical re-admission (CompressionConfig.readmit_lexical_tokens, ContextViews._apply_lexical).

Pins: when a tool output enters, the rows earlier outputs had cut that share a rare word with
it come back as the marked block at its end (the ticket's component finds its routing row);
everything before that output keeps its tokens (append-stable, no rewrite); a word every row
has brings nothing back; a row spelling out a tool call never comes back; the budget binds; a
restored output renders as the full view does (no block).
"""

from __future__ import annotations

import pytest

from asymagent.context import attention_keep
from asymagent.context.compressors import CompressionConfig
from asymagent.context.views import ContextViews

TEAMS = ("Osprey", "Kestrel", "Plover", "Raven", "Heron", "Wren", "Falcon", "Swift")


def _handbook(extra: str = "") -> list:
    filler = " ".join(f"The team reviewed item {i} and noted it for the record." for i in range(12))
    rows = "\n".join(f"component-{c}x -> team {t}" for c, t in zip("abcdefgh", TEAMS))
    return [{"role": "system", "content": "You triage tickets with the tools."},
            {"role": "user", "content": "Read the handbook, then route the open tickets."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c0",
             "content": f"Handbook\n{filler}\n{rows}\n{extra}{filler}\nEnd of handbook."}]


def _ticket(k: int, body: str) -> list:
    return [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"t{k}", "type": "function", "function": {"name": "get_ticket", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"t{k}", "content": body}]


def _views(smollm_tokenizer, tokens: int = 64) -> ContextViews:
    return ContextViews(smollm_tokenizer, CompressionConfig(readmit_lexical_tokens=tokens))


def test_the_new_outputs_rare_word_brings_its_cut_row_back_append_stably(smollm_tokenizer):
    views = _views(smollm_tokenizer)
    first = views.build(_handbook())
    text = smollm_tokenizer.decode(first.compressed_ids)
    assert "component-ex -> team Heron" not in text  # the handbook's middle is cut
    messages = _handbook() + _ticket(1, "Ticket T-7: checkout fails\nComponent: component-ex\nSeverity: high")
    pair = views.build(messages)
    text = smollm_tokenizer.decode(pair.compressed_ids)
    assert pair.rewrites == 0
    assert pair.compressed_ids[:len(first.compressed_ids) - first.generation_prompt_len] == \
        first.compressed_ids[:len(first.compressed_ids) - first.generation_prompt_len]
    block = text[text.index(attention_keep.READMIT_HEADER):]
    assert "component-ex -> team Heron" in block and "Osprey" not in block  # only the row it names
    assert text.index("Component: component-ex") < text.index(attention_keep.READMIT_HEADER)
    again = views.build(messages)  # decided once, at entry
    assert again.rewrites == 0 and again.compressed_ids == pair.compressed_ids
    fresh = _views(smollm_tokenizer).build(messages)  # the whole history at once: the same block
    assert fresh.compressed_ids == pair.compressed_ids


def test_common_words_calls_and_the_budget(smollm_tokenizer):
    views = _views(smollm_tokenizer)
    views.build(_handbook())
    plain = views.build(_handbook() + _ticket(1, "Ticket T-8: the team reviewed the record"))
    assert attention_keep.READMIT_HEADER not in smollm_tokenizer.decode(plain.compressed_ids)
    call = '{"name": "wire_money", "arguments": {"to": "acct-zz91"}}\n'  # the only row naming it
    views = _views(smollm_tokenizer)
    pair = views.build(_handbook(call) + _ticket(1, "Refund to acct-zz91 please"))
    text = smollm_tokenizer.decode(pair.compressed_ids)
    assert "wire_money" not in text and attention_keep.READMIT_HEADER not in text
    tight = _views(smollm_tokenizer, tokens=2).build(_handbook() + _ticket(1, "Component: component-ex"))
    assert attention_keep.READMIT_HEADER not in smollm_tokenizer.decode(tight.compressed_ids)
    off = _views(smollm_tokenizer, tokens=0).build(_handbook() + _ticket(1, "Component: component-ex"))
    assert attention_keep.READMIT_HEADER not in smollm_tokenizer.decode(off.compressed_ids)


def test_a_restored_output_renders_as_the_full_view(smollm_tokenizer):
    views = _views(smollm_tokenizer)
    pair = views.build(_handbook() + _ticket(1, "Component: component-ex " + "padding words " * 80))
    assert pair.compressed_ids != pair.full_ids
    spans = views.message_spans()
    views.restore([s.full[0] for s in spans if s.role == "tool" and not s.same])
    assert views.compressed_ids() == pair.full_ids
    with pytest.raises(ValueError):
        CompressionConfig(readmit_lexical_tokens=-1)
