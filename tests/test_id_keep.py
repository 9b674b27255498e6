"""Identifier keep (asymagent/context/id_keep.py): the elided rows that carry ids later turns copy."""

from __future__ import annotations

import pytest

from asymagent.context import id_keep, query_keep
from asymagent.context.compressors import CompressionConfig, MessageContext, ToolOutputCompressor
from asymagent.context.token_counting import HFTokenCounter


@pytest.fixture(scope="module")
def hf(smollm_tokenizer):
    return HFTokenCounter(smollm_tokenizer)


def tickets(n=8):
    rows = [f"TCK-{3000 + 7 * i} | opened 2026-0{1 + i % 9}-1{i % 10} by Ada Silva | billing-api: an invoice is wrong"
            for i in range(n)]
    prose = ("The vendor documented the migration plan after a call on Tuesday. "
             "Support confirmed the onboarding checklist and scheduled a follow-up.\n") * 3
    return rows, prose


def test_identifiers_are_codes_paths_and_addresses_not_numbers_or_words():
    got = id_keep.identifiers("TCK-3335 opened 2026-04-18 by ada@example.com in /srv/exports/finance, "
                              "priority P1, build v2.1.7, payments-core, 1234567.")
    assert got == {"TCK-3335", "ada@example.com", "srv/exports/finance", "v2.1.7"}


def test_select_keeps_id_rows_by_density_within_budget_and_skips_what_is_shown(hf):
    rows, prose = tickets()
    middle = prose + "\n".join(rows[2:6]) + "\n" + prose
    seen = id_keep.identifiers(rows[3])  # e.g. the row is in the kept head already
    spans = id_keep.select(middle, 200, hf.count, seen=seen)
    kept = [middle[s:e].strip() for s, e in spans]
    assert kept == [rows[2], rows[4], rows[5]]  # in order; prose (no ids) and the shown row left out
    one = hf.count(rows[2]) + 1
    assert [middle[s:e].strip() for s, e in id_keep.select(middle, one, hf.count, seen=seen)] == [rows[2]]
    assert id_keep.select(middle, one - 1, hf.count, seen=seen) == []  # no row fits
    assert id_keep.select(prose * 3, 500, hf.count) == []  # nothing to copy


def test_select_prefers_a_short_id_row_to_a_long_paragraph_naming_one_code(hf):
    long = "The account manager questioned the refund for order ORD-55555 " + "and more words " * 40
    short = "ORD-12345 | shipped"
    middle = long + "\n" + short + "\n"
    spans = id_keep.select(middle, hf.count(short) + 5, hf.count)
    assert [middle[s:e].strip() for s, e in spans] == [short]


def test_select_leaves_rows_taken_by_query_keep_and_never_keeps_a_call(hf):
    rows, _ = tickets(4)
    call = 'TCK-9999 {"name": "mark_duplicate", "arguments": {"ticket_id": "TCK-9999"}}'
    middle = "\n".join(rows + [call]) + "\n"
    units = query_keep.split_units(middle)
    spans = id_keep.select(middle, 500, hf.count, taken=[units[1]])
    assert units[1] not in spans and [middle[s:e].strip() for s, e in spans] == [rows[0], rows[2], rows[3]]


def test_tool_output_keeps_the_listing_rows_the_cut_dropped(hf):
    rows, _ = tickets(8)
    text = "Open tickets, page 1 of 2\n" + "\n".join(rows) + "\nCall list_tickets with page=2 for more."
    plain = ToolOutputCompressor(head_tokens=24, tail_tokens=16)
    comp = ToolOutputCompressor(head_tokens=24, tail_tokens=16, id_keep_tokens=400)
    ctx = MessageContext("tool", text, False, 0, "list_tickets", False, hf)
    cut = plain.transform(text, ctx)
    missing = [r.split(" |")[0] for r in rows if r.split(" |")[0] not in cut]
    assert missing  # the head/tail cut loses ids of the listing
    out = comp.transform(text, ctx)
    assert all(tid in out for tid in missing) and out.startswith(cut.split("\n[...")[0])
    assert out.endswith("for more.")
    assert hf.count(out) < hf.count(text)  # the partial rows' rest is still cut
    # under budget pressure the keep budget shrinks like head and tail
    shrunk = MessageContext("tool", text, False, 4, "list_tickets", False, hf)
    assert len([t for t in missing if t in comp.transform(text, shrunk)]) < len(missing)


def test_id_keep_presets_validate():
    budgets = {"id_keep": 96, "id_keep_192": 192, "id_keep_64": 64, "id_keep_32_16": 128}
    for name, budget in budgets.items():
        comp = CompressionConfig.preset(name).compressors[0]
        assert comp.id_keep_tokens == budget and comp.query_keep_tokens == 96


def test_the_default_view_keeps_ids_and_the_query_rows():
    """The default view (docs/context.md "Identifier keep", "Whole small gaps"): head 64, tail 32,
    query keep 96 and identifier keep 64 tokens, gaps under 24 tokens kept (`id_keep_64_gaps`);
    `id_keep_64` and `query_keep` name the views before it."""
    comp = CompressionConfig().compressors[0]
    assert (comp.head_tokens, comp.tail_tokens, comp.query_keep_tokens, comp.id_keep_tokens,
            comp.min_gap) == (64, 32, 96, 64, 24)
    assert comp.min_gap == comp.min_omitted
    assert CompressionConfig.preset("id_keep_64_gaps") == CompressionConfig()
    assert CompressionConfig.preset("id_keep_64").compressors[0].min_gap == 0
    assert CompressionConfig.preset("query_keep").compressors[0].id_keep_tokens == 0
