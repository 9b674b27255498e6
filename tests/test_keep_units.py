"""Keep units (asymagent/context/units.py, `CompressionConfig.keep_unit`): what the row-level keeps take whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from asymagent.context import id_keep, query_keep, units
from asymagent.context.compressors import CompressionConfig, MessageContext, ToolOutputCompressor
from asymagent.context.token_counting import HFTokenCounter
from asymagent.context.views import ContextViews


def words(text: str) -> int:  # a counter that needs no tokenizer: one token a word
    return len(text.split())


PARAGRAPH = ("    The meeting with the regional partners has been moved to the main office on\n"
             "    12th floor at 3 PM. The catering order stays as it was agreed in the first\n"
             "    message. Bring the signed forms.\n")  # 34 words: sentences of 18, 12 and 4


def email(i: int, body: str, sender: str = "") -> str:
    return (f"- id_: '{i}'\n  sender: {sender or f'person{i}@example.com'}\n  body: 'Hello,\n\n\n"
            f"{body.rstrip()}'\n  subject: Update {i}\n")


def covered(text: str, spans: list) -> bool:
    """Spans in order, without overlap, and every non-blank character inside one."""
    inside = [False] * len(text)
    pos = 0
    for s, e in spans:
        assert pos <= s < e <= len(text)
        pos = e
        for k in range(s, e):
            inside[k] = True
    return all(inside[k] or text[k].isspace() for k in range(len(text)))


def test_a_wrapped_paragraph_is_one_unit_and_a_record_with_its_fields_too():
    text = email(1, PARAGRAPH)
    assert units.block_units(text, 200, words) == [(0, len(text))]  # the whole record, small enough
    spans = units.block_units(text, 40, words)  # the record is over the cap: its rows and children
    pieces = [text[s:e] for s, e in spans]
    assert "  body: 'Hello,\n\n\n" + PARAGRAPH.rstrip() + "'\n" in pieces  # a key with its wrapped value
    assert "  sender: person1@example.com\n" in pieces and "- id_: '1'\n" in pieces
    assert covered(text, spans)
    pieces = [text[s:e] for s, e in units.block_units(text, 35, words)]  # the value's paragraph alone
    assert "  body: 'Hello,\n" in pieces and PARAGRAPH.rstrip() + "'\n" in pieces
    assert not any(PARAGRAPH.splitlines()[0] in p and "12th" in p for p in
                   (text[s:e] for s, e in query_keep.split_units(text)))  # lines: three units


def test_a_listing_keeps_its_rows_apart():
    csv = "id,name,city\n" + "".join(f"{i},name number {i} with a long tail of words here,city {i}\n"
                                     for i in range(6))
    table = "| id | name |\n|---|---|\n" + "".join(f"| {i} | n{i} |\n" for i in range(6))
    bullets = "".join(f"- item {i} with a long description that goes on and on for a while\n" for i in range(6))
    aligned = "".join(f"ID-{i}    alpha beta gamma delta epsilon zeta eta theta iota kappa\n" for i in range(6))
    logs = "".join(f"2024-05-0{i} 12:00:0{i} worker {i} started the nightly export of the ledger shards\n"
                   for i in range(1, 7))
    long_lines = "".join(f"Message {i} from the support team which runs well past any width text is wrapped at "
                         f"so it is a line of its own and not the start of a wrapped paragraph\n" for i in range(4))
    for text in (csv, table, bullets, aligned, logs, long_lines):
        assert units.block_units(text, 1000, words) == query_keep.split_units(text), text


def test_pretty_json_objects_are_units_with_their_closing_brackets():
    text = json.dumps([{"id": f"A{i}1", "name": f"n{i}", "tags": ["x", "y"]} for i in range(3)], indent=2)
    pieces = [text[s:e] for s, e in units.block_units(text, 12, words)]
    assert pieces[0] == "[\n" and pieces[-1] == "]"
    assert pieces[1].startswith("  {\n") and pieces[1].rstrip().endswith("},") and '"A01"' in pieces[1]
    assert len(pieces) == 5 and covered(text, units.block_units(text, 12, words))


def test_the_cap_splits_a_paragraph_into_sentences_then_lines():
    spans = units.block_units(PARAGRAPH, 20, words)  # 34 words: over the cap, its sentences
    pieces = [PARAGRAPH[s:e] for s, e in spans]
    assert pieces == [PARAGRAPH[:PARAGRAPH.index("The catering")], "The catering order stays as it was agreed "
                      "in the first\n    message. ", "Bring the signed forms.\n"]
    assert covered(PARAGRAPH, spans)
    pieces = [PARAGRAPH[s:e] for s, e in units.block_units(PARAGRAPH, 5, words)]  # sentences over the cap
    first, second, _ = PARAGRAPH.splitlines(keepends=True)
    assert pieces == [first, "    12th floor at 3 PM. ", "The catering order stays as it was agreed in the first\n",
                      "    message. ", "Bring the signed forms.\n"]
    # a long JSON line over the cap splits between its objects, as lines do
    line = json.dumps([{"k": i, "v": "w " * 20} for i in range(30)])
    assert units.block_units(line, 10, words) == query_keep.split_units(line)


def test_id_keep_takes_the_sentence_whole_with_block_units():
    filler = "".join(email(i, f"    Short note number {i}.\n", "desk@example.com") for i in range(2, 6))
    middle = filler + email(9, PARAGRAPH, "desk@example.com") + filler
    line_spans = id_keep.select(middle, 30, words, seen={"desk@example.com"})
    block = lambda t: units.block_units(t, 20, words)  # noqa: E731
    block_spans = id_keep.select(middle, 30, words, seen={"desk@example.com"}, split=block)
    line_text = "".join(middle[s:e] for s, e in line_spans)
    block_text = "".join(middle[s:e] for s, e in block_spans)
    assert "12th floor" in line_text and "main office on" not in line_text  # the line alone
    assert block_text == PARAGRAPH[:PARAGRAPH.index("The catering")]  # the sentence, with the line before


def test_query_keep_keeps_the_paragraph_a_line_of_which_matches():
    middle = "".join(email(i, f"    Short note number {i}.\n") for i in range(2, 8)) + email(9, PARAGRAPH)
    q = query_keep.words("where is the catering order?")
    line = "".join(middle[s:e] for s, e in query_keep.select(middle, q, 60, words, context=middle))
    block = "".join(middle[s:e] for s, e in query_keep.select(
        middle, q, 60, words, context=middle, split=lambda t: units.block_units(t, 50, words)))
    assert "catering" in line and "12th floor" in line and "main office" not in line
    assert PARAGRAPH.rstrip() in block


def test_keep_unit_is_a_validated_config_option():
    assert CompressionConfig().keep_unit == "line"
    assert CompressionConfig().units(words) is query_keep.split_units
    assert CompressionConfig(keep_unit="block").keep_unit_max_tokens == 64
    assert CompressionConfig.preset("id_keep_blocks").keep_unit == "block"
    with pytest.raises(ValidationError):
        CompressionConfig(keep_unit="word")
    with pytest.raises(ValidationError):
        CompressionConfig(keep_unit="block", keep_unit_max_tokens=0)
    with pytest.raises(ValueError):
        units.splitter("sentence", 10, words)


def _conversation(text: str) -> list:
    return [{"role": "system", "content": "Be exact."},
            {"role": "user", "content": "When is it, exactly?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "search", "arguments": "{\"folder\": \"inbox\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": text}]


def test_line_is_bit_identical_and_block_keeps_the_sentence_in_the_view(smollm_tokenizer):
    filler = "".join(email(i, f"    Short note number {i} about nothing in particular.\n", "desk@example.com")
                     for i in range(2, 9))
    text = filler + email(9, PARAGRAPH, "desk@example.com") + filler
    msgs = _conversation(text)
    default = ContextViews(smollm_tokenizer, CompressionConfig()).build(msgs)
    line = ContextViews(smollm_tokenizer, CompressionConfig(keep_unit="line")).build(msgs)
    block = ContextViews(smollm_tokenizer, CompressionConfig.preset("id_keep_blocks")).build(msgs)
    assert line.compressed_ids == default.compressed_ids and line.full_ids == default.full_ids
    shown_line = smollm_tokenizer.decode(line.compressed_ids)
    shown_block = smollm_tokenizer.decode(block.compressed_ids)
    assert "12th floor" in shown_line and "main office on\n" not in shown_line  # the date row alone
    assert "main office on\n    12th floor at 3 PM" in shown_block  # the record's body, whole
    assert "message. Bring the signed forms.'" in shown_block
    assert block.full_ids == default.full_ids
    # the compressor with the line splitter named is the compressor without it
    hf = HFTokenCounter(smollm_tokenizer)
    comp = CompressionConfig().compressors[0]
    assert isinstance(comp, ToolOutputCompressor)
    q = query_keep.words(msgs[1]["content"])
    ctx = MessageContext("tool", text, False, 0, "search", False, hf, q)
    ctx_line = MessageContext("tool", text, False, 0, "search", False, hf, q, units=query_keep.split_units)
    assert comp.transform(text, ctx) == comp.transform(text, ctx_line)


_LINE = st.text(alphabet=st.sampled_from(list("ab 12-:,.|{}[]\t")), max_size=90)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.tuples(st.integers(0, 6), _LINE), max_size=25), cap=st.integers(1, 40))
def test_block_units_are_ordered_disjoint_and_cover_the_text(lines, cap):
    text = "".join(" " * indent + line + "\n" for indent, line in lines)
    spans = units.block_units(text, cap, words)
    assert covered(text, spans)
    assert all(text[s:e].strip() for s, e in spans)
