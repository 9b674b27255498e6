"""Compressors of the verifier's view and `CompressionConfig`, the list of them that is applied.

Four compressors (listed in `CompressionConfig.compressors`, applied in order):
- `tool_output`: a long tool output keeps its first `head_tokens` and last `tail_tokens` tokens
  with a marker between them naming how many tokens were omitted.
- `recent_turns`: the last `keep_turns` turns stay verbatim; tool outputs of older turns become a
  one-line stub (tool name, original token count, the start of the first line). Assistant and
  user messages are kept. Demotion happens in batches, every `demote_every` turns, so the
  verifier's cache is rewritten once per batch instead of every turn.
- `tool_schemas`: the tool listing is reduced to `name(arg: type, ...)` (the paper's name_sig).
- `surprisal`: LLMLingua-style pruning of a message's content tokens driven by the drafter's
  per-token log-probs over the full view (which the engine computes in its prefill anyway):
  keep the `keep_ratio` most surprising tokens, always keeping structural tokens (JSON
  punctuation, newlines) and, if `keep_numbers`, tokens with digits. Role markers and the
  JSON of tool calls are never touched (they are outside the pruned spans).

A turn starts at every user or assistant message; tool messages belong to the turn of the
assistant message that called them; system messages are never compressed. `surprisal` acts on
messages the text compressors leave verbatim (its log-probs are positions of the full view).
`asymagent.context.views.ContextViews` applies a config to a conversation, append-stably.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from asymagent.context import attention_keep, id_keep, query_keep, units
from asymagent.context.token_counting import TokenCounter

_JSON_PUNCT = set('{}[]:,"')


@dataclass
class MessageContext:
    """What a compressor may look at when it rewrites one message's content."""

    role: str  # system | user | assistant | tool
    original: str  # the message's content as the full view renders it
    demoted: bool  # older than the recent-turns window (or pushed out by the budget)
    shrink: int  # budget pressure: head/tail sizes are divided by 2**shrink
    tool_name: str | None  # for tool messages, the tool that produced the output
    has_tool_calls: bool  # assistant message carrying tool calls
    counter: TokenCounter
    query: frozenset = frozenset()  # words of the recent user/assistant turns (context/query_keep.py)
    newest: bool = False  # a tool output of the latest turn (no assistant message after it yet)
    # the drafter's attention over the content at its entry: (char start, char end, score) per
    # token of `original` (context/attention_keep.py); empty without a drafter
    attention: tuple = ()
    # text -> [(start, end)] the units the row-level keeps take or leave (CompressionConfig.keep_unit,
    # context/units.py): lines by default
    units: object = query_keep.split_units


class ToolOutputCompressor(BaseModel):
    """Keep the head and tail of long tool outputs, with a marker naming the omitted count."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_output"] = "tool_output"
    head_tokens: int = Field(64, ge=0)  # enough for a JSON header / the first rows of a listing
    tail_tokens: int = Field(32, ge=0)  # the end often holds totals, errors, "N more results"
    min_omitted: int = Field(24, ge=1)  # cut only if it saves this much (the marker costs ~12)
    # query-aware keep (context/query_keep.py): tokens of the elided middle's rows that share
    # rare words with the recent user/assistant turns, kept besides head and tail; 0 = off
    query_keep_tokens: int = Field(0, ge=0)
    # the order candidate rows are kept in: by score, or by score per token of budget (short rows
    # holding the task's ids before long filler paragraphs; query_keep.py)
    query_keep_rank: Literal["score", "per_token"] = "score"
    # identifier keep (context/id_keep.py): tokens of the elided middle's rows holding ids, codes,
    # paths or addresses that the kept text does not show (what later calls copy), besides the
    # query-aware rows; 0 = off
    id_keep_tokens: int = Field(0, ge=0)
    # a gap of the middle left between kept rows (or before the tail) shorter than this many
    # tokens is kept instead of marked: a cut that saves less than `min_omitted` is not made
    # for the whole output either; 0 = only gaps cheaper than the marker, between kept rows
    min_gap: int = Field(0, ge=0)
    # the latest turn's outputs stay whole until the next assistant message, then are cut (a
    # rewrite of the view's end every step: the verifier re-prefills that output's cut form)
    keep_newest: bool = False
    # attention keep (context/attention_keep.py): tokens of the elided middle's rows the drafter's
    # last rows read hardest at the output's entry, besides the query-aware rows; 0 = off
    attention_keep_tokens: int = Field(0, ge=0)

    def sizes(self, shrink: int) -> tuple[int, int]:
        return self.head_tokens >> shrink, self.tail_tokens >> shrink

    def transform(self, text: str, ctx: MessageContext) -> str:
        if ctx.role != "tool" or not text or (self.keep_newest and ctx.newest and not ctx.demoted):
            return text
        head, tail = self.sizes(ctx.shrink)
        min_omitted = self.min_omitted if ctx.shrink == 0 else 1
        head_text, tail_text, omitted = ctx.counter.head_tail(text, head, tail)
        if omitted < min_omitted:
            return text
        middle = text[len(head_text): len(text) - len(tail_text)]
        spans = []
        budget = self.query_keep_tokens >> ctx.shrink
        if budget and ctx.query:
            spans = query_keep.select(middle, ctx.query, budget, ctx.counter.count, context=text,
                                      rank=self.query_keep_rank, split=ctx.units)
        id_budget = self.id_keep_tokens >> ctx.shrink
        attention_budget = self.attention_keep_tokens >> ctx.shrink
        if attention_budget and ctx.attention and text == ctx.original:
            spans = sorted(spans + attention_keep.select(middle, len(head_text), list(ctx.attention),
                                                         attention_budget, ctx.counter.count,
                                                         taken=spans, split=ctx.units))
        if id_budget:
            spans = sorted(spans + id_keep.select(middle, id_budget, ctx.counter.count, taken=spans,
                                                  seen=id_keep.identifiers(head_text + tail_text),
                                                  split=ctx.units))
        if spans:
            return query_keep.render(head_text, middle, tail_text, spans, ctx.counter.count,
                                     min_gap=self.min_gap >> ctx.shrink)
        return f"{head_text}\n[... {omitted} tokens omitted ...]\n{tail_text}"


class RecentTurnsCompressor(BaseModel):
    """Keep the last k turns verbatim; stub older tool outputs; demote in batches of m turns."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["recent_turns"] = "recent_turns"
    keep_turns: int = Field(3, ge=0)  # k: the current step plus the two before it stay whole
    demote_every: int = Field(6, ge=1)  # m: one verifier cache rewrite per m turns
    preview_tokens: int = Field(12, ge=0)  # start of the output's first line kept in the stub

    def frontier(self, turns: int) -> int:
        """Turns with index < frontier are demoted, for a history of `turns` turns.

        It moves only when `turns - keep_turns` crosses a multiple of `demote_every`, so a
        rewrite happens once every m turns and between rewrites at most k+m-1 turns are whole.
        """
        if turns <= self.keep_turns:
            return 0
        return ((turns - self.keep_turns) // self.demote_every) * self.demote_every

    def transform(self, text: str, ctx: MessageContext) -> str:
        if ctx.role != "tool" or not ctx.demoted:
            return text
        return stub(ctx, self.preview_tokens)


def stub(ctx: MessageContext, preview_tokens: int) -> str:
    """One-line stand-in for an old tool output: tool, original size, start of its first line."""
    original = ctx.original
    n = ctx.counter.count(original)
    name = ctx.tool_name or "tool"
    first_line = next((line.strip() for line in original.splitlines() if line.strip()), "")
    if not first_line:
        return f"[{name} output omitted: {n} tokens]"
    preview, _, cut = ctx.counter.head_tail(first_line, preview_tokens, 0)
    ellipsis = "..." if cut or first_line != original.strip() else ""
    return f"[{name} output omitted: {n} tokens; began: {preview}{ellipsis}]"


class ToolSchemasCompressor(BaseModel):
    """Reduce the tool listing to names and signatures (the paper's name_sig)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_schemas"] = "tool_schemas"
    style: Literal["name_sig"] = "name_sig"

    def transform(self, text: str, ctx: MessageContext) -> str:
        return text  # acts on the tool listing (see ContextViews), not on message contents


class SurprisalCompressor(BaseModel):
    """Prune low-surprisal content tokens using the drafter's log-probs of the full view."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["surprisal"] = "surprisal"
    keep_ratio: float = Field(0.5, gt=0.0, le=1.0)  # fraction of a span's tokens kept
    roles: list[Literal["user", "assistant", "tool"]] = Field(default_factory=lambda: ["tool"])
    keep_numbers: bool = True  # ids, prices, dates: the facts an agent most often needs
    min_tokens: int = Field(32, ge=1)  # shorter spans are not worth pruning

    def transform(self, text: str, ctx: MessageContext) -> str:
        return text  # acts on token ids (see `select`), after the text compressors

    def applies(self, ctx: MessageContext, text: str) -> bool:
        return (ctx.role in self.roles and not ctx.has_tool_calls and not ctx.demoted
                and text == ctx.original and bool(text))

    def select(self, pieces: list, logprobs: list) -> list:
        """Indices of content tokens to keep, in order.

        pieces:   [n] the text of each content token
        logprobs: [n] log p(token | full prefix) from the drafter
        """
        if len(pieces) != len(logprobs):
            raise ValueError(f"{len(pieces)} tokens but {len(logprobs)} log-probs")
        n = len(pieces)
        if n < self.min_tokens:
            return list(range(n))
        target = math.ceil(self.keep_ratio * n)
        forced = {i for i, p in enumerate(pieces) if self._structural(p)}
        free = sorted((i for i in range(n) if i not in forced), key=lambda i: (logprobs[i], i))
        extra = max(0, target - len(forced))
        return sorted(forced | set(free[:extra]))  # lowest log-prob = most surprising first

    def _structural(self, piece: str) -> bool:
        core = piece.strip()
        if "\n" in piece or (core and all(c in _JSON_PUNCT for c in core)):
            return True
        return self.keep_numbers and any(c.isdigit() for c in piece)


Compressor = Annotated[
    Union[ToolOutputCompressor, RecentTurnsCompressor, ToolSchemasCompressor, SurprisalCompressor],
    Field(discriminator="type"),
]


DEFAULT_QUERY_KEEP_TOKENS = 96  # the default view's query-aware keep budget (docs/context.md)
DEFAULT_ID_KEEP_TOKENS = 64  # the default view's identifier keep budget (docs/context.md)
DEFAULT_MIN_GAP = 24  # the default view keeps a gap between kept rows shorter than this (docs/context.md)


def _default_compressors() -> list:
    # Measured on a 30-step tool-heavy trace (docs/views.md): tool_output alone reaches ratio
    # 0.25 with zero rewrites; adding recent_turns reaches 0.14-0.17 but its batched rewrites
    # make the verifier prefill 1.3-1.8x more tokens over the run. Demotion stays the budget
    # fallback. Query-aware keep (issue 26, docs/context.md): the rows of the cut middle that
    # share rare words with the task come back, append-stably, for ~15% more verifier prefill.
    # Identifier keep (docs/context.md, "Identifier keep"): the cut middle's rows that carry ids
    # the kept text does not show, within 64 more tokens: the most the view can take on the
    # 30-step synthetic trace and stay within half of the full context (tests/test_views_synthetic.py:
    # 0.47; 96 tokens gave 0.51), measured on dev seeds before the test seeds (docs/context.md).
    # Whole small gaps (docs/context.md, "Whole small gaps"): a gap the kept rows leave that is
    # shorter than min_omitted (24) is kept, as a cut saving less is not made for a whole output
    # either (a listing cut mid-row for 21 tokens lost the row).
    return [ToolOutputCompressor(query_keep_tokens=DEFAULT_QUERY_KEEP_TOKENS,
                                 id_keep_tokens=DEFAULT_ID_KEEP_TOKENS, min_gap=DEFAULT_MIN_GAP)]


# Named settings: the views compared on the context frontier (docs/context.md).
PRESETS: dict = {
    "none": {"compressors": []},
    "head_tail": {"compressors": [{"type": "tool_output"}]},  # the default before issue 26
    "head_tail_32_16": {"compressors": [{"type": "tool_output", "head_tokens": 32, "tail_tokens": 16}]},
    "head_tail_128_64": {"compressors": [{"type": "tool_output", "head_tokens": 128, "tail_tokens": 64}]},
    "head_tail_256_128": {"compressors": [{"type": "tool_output", "head_tokens": 256, "tail_tokens": 128}]},
    "query_keep": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}]},  # the default before id_keep
    "query_keep_128_64": {"compressors": [{"type": "tool_output", "head_tokens": 128, "tail_tokens": 64,
                                           "query_keep_tokens": 96}]},
    "query_keep_pt": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                       "query_keep_rank": "per_token"}]},
    "query_keep_pt_192": {"compressors": [{"type": "tool_output", "query_keep_tokens": 192,
                                           "query_keep_rank": "per_token"}]},
    "query_keep_192": {"compressors": [{"type": "tool_output", "query_keep_tokens": 192}]},
    "id_keep": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 96}]},
    "id_keep_192": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 192}]},
    "id_keep_64": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64}]},
    "id_keep_64_gaps": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                         "min_gap": 24}]},  # the default
    "id_keep_32_16": {"compressors": [{"type": "tool_output", "head_tokens": 32, "tail_tokens": 16,
                                       "query_keep_tokens": 96, "id_keep_tokens": 128}]},
    # attention keep (context/attention_keep.py): the drafter's reading (its prompt's last rows
    # and its 32-token look-ahead, rows pooled by max) keeps rows at entry and re-admits cut rows
    # a later step reads. On the default view's cuts, or on a lean one (head 32, tail 16, ids)
    "attention_keep": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                        "min_gap": 24, "attention_keep_tokens": 96}],
                       "readmit_tokens": 96, "attention_lookahead": 32, "attention_pool": "max"},
    "attention_lean": {"compressors": [{"type": "tool_output", "head_tokens": 32, "tail_tokens": 16,
                                        "id_keep_tokens": 64, "attention_keep_tokens": 96}],
                       "readmit_tokens": 128, "attention_lookahead": 32, "attention_pool": "max"},
    # the same keep and re-admission read from the look-ahead's rows alone, upper layers
    "attention_lookahead": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                             "min_gap": 24, "attention_keep_tokens": 96}],
                            "readmit_tokens": 96, "attention_lookahead": 32, "attention_pool": "max",
                            "attention_rows": "lookahead", "attention_layers": "upper"},
    # the default view with whole logical units kept (context/units.py): a wrapped sentence or a
    # small record, not a line of it
    "id_keep_blocks": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                        "min_gap": 24}], "keep_unit": "block"},
    "newest": {"compressors": [{"type": "tool_output", "keep_newest": True}]},
    "newest_query_keep": {"compressors": [{"type": "tool_output", "keep_newest": True, "query_keep_tokens": 96}]},
    "query_keep_recall": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}], "max_recalls": 1},
    "query_keep_recall_any": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}], "max_recalls": 2,
                              "recall_evidence": "copy_any"},
    "query_keep_recall_latest": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}],
                                 "max_recalls": 2, "recall_evidence": "copy_any", "recall_scope": "latest"},
    "query_keep_recall_length": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}],
                                 "max_recalls": 2, "recall_evidence": "copy_any_length",
                                 "recall_scope": "latest"},
    "query_keep_recall_cheap": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}],
                                "max_recalls": 2, "recall_evidence": "copy_any", "recall_scope": "latest",
                                "recall_max_tokens": 1536},
    "query_keep_margin": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}],
                          "max_recalls": 1, "recall_evidence": "margin", "recall_margin": 0.5},
    "query_keep_margin_02": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96}],
                             "max_recalls": 1, "recall_evidence": "margin", "recall_margin": 0.2},
    # the default view, escalated where the verifier hesitates (margin), and where the drafter that
    # reads the full history says the removed text matters there (the vote: docs/views.md, "The
    # drafter's vote")
    "id_keep_margin": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                        "min_gap": 24}],
                       "max_recalls": 1, "recall_evidence": "margin", "recall_margin": 0.5},
    # ... escalated by restoring every cut output into the verifier's one cache (recall_escalation)
    "id_keep_margin_restore": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                                "id_keep_tokens": 64, "min_gap": 24}],
                               "max_recalls": 1, "recall_evidence": "margin", "recall_margin": 0.5,
                               "recall_escalation": "restore"},
    # ... and the cut rows that share a rare word with each new output, brought back at its end
    "id_keep_lexical": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                         "min_gap": 24}], "readmit_lexical_tokens": 64},
    "id_keep_lexical_margin_restore": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                                        "id_keep_tokens": 64, "min_gap": 24}],
                                       "readmit_lexical_tokens": 64, "max_recalls": 1,
                                       "recall_evidence": "margin", "recall_margin": 0.5,
                                       "recall_escalation": "restore"},
    "id_keep_margin_vote": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96, "id_keep_tokens": 64,
                                             "min_gap": 24}],
                            "max_recalls": 1, "recall_evidence": "margin", "recall_margin": 0.5,
                            "recall_vote": "delta"},
    "id_keep_margin_vote_full": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                                  "id_keep_tokens": 64, "min_gap": 24}],
                                 "max_recalls": 1, "recall_evidence": "margin", "recall_margin": 0.5,
                                 "recall_vote": "full"},
    # ... and where it hesitates, the cut rows the drafter reads at that token come back (96 tokens)
    "id_keep_margin_readmit": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                                "id_keep_tokens": 64, "min_gap": 24}],
                               "max_recalls": 2, "recall_evidence": "margin_readmit", "recall_margin": 0.5,
                               "readmit_tokens": 96, "attention_pool": "max"},
    # ... read by the rows of the answer so far in the drafter's upper layers (evals/probes/cut_row_rank.py:
    # the rows that write the step's answer, in the upper layers, rank the rows it rests on near the top)
    "id_keep_margin_readmit_upper": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                                      "id_keep_tokens": 64, "min_gap": 24}],
                                     "max_recalls": 2, "recall_evidence": "margin_readmit", "recall_margin": 0.5,
                                     "readmit_tokens": 96, "attention_pool": "max",
                                     "attention_rows": "lookahead", "attention_layers": "upper"},
    "query_keep_pt_recall_any": {"compressors": [{"type": "tool_output", "query_keep_tokens": 96,
                                                  "query_keep_rank": "per_token"}],
                                 "max_recalls": 2, "recall_evidence": "copy_any"},
    "masking": {"compressors": [{"type": "tool_output", "keep_newest": True},
                                {"type": "recent_turns", "keep_turns": 1, "demote_every": 1, "preview_tokens": 12}]},
}


class CompressionConfig(BaseModel):
    """Which compressors build the verifier's view (applied in order) and its token budget.

    `CompressionConfig()` is the default (tool_output); `CompressionConfig.none()`
    leaves the view uncompressed. Files: YAML or JSON with the same fields, e.g.
    `{"compressors": [{"type": "tool_output", "head_tokens": 48}, "recent_turns"],
    "max_verifier_tokens": 4096}` (a bare name means the compressor with its defaults).
    """

    model_config = ConfigDict(extra="forbid")
    compressors: list[Compressor] = Field(default_factory=_default_compressors)
    max_verifier_tokens: int | None = Field(None, ge=1)
    # recall on evidence (context/recall.py, docs/views.md): when, during decoding, the full
    # view's copy evidence says a step's output needs text the verifier's view removed, that tool
    # output is restored whole (sticky) and the step decoded again from its first token; at most
    # this many times per step (0: never)
    max_recalls: int = Field(0, ge=0)
    # which evidence fires a recall: "copy" (the full view copies a continuation only the removed
    # text holds and the verifier emitted another token), "copy_any" (it copies from removed
    # text at all, whatever the verifier emitted) or "copy_any_length" (copy_any at the longest
    # suffix length whose continuations differ between the views)
    # ... or "margin" (the verifier's top-2 gap under recall_margin nats: the step is decoded
    # again on the full view, in mode spec; context/recall.py)
    # ... or "margin_readmit" (at such a hesitation, the cut rows the drafter's attention there
    # reads come back as the newest message's block, within readmit_tokens, and the step is
    # decoded again on that view; context/recall.py)
    recall_evidence: Literal["copy", "copy_any", "copy_any_length", "margin", "margin_readmit"] = "copy"
    recall_margin: float = Field(0.5, gt=0.0)
    # how a margin hesitation (recall_evidence "margin") reaches the removed text: "full" decodes
    # the step again on the full view in mode spec, in the conversation's second (full-view)
    # verifier cache, which each escalation brings up to date; "restore" brings every cut tool
    # output back whole into the verifier's one cache (ContextViews.restore: sticky, re-prefilled
    # from the first restored message) and decodes the step again on that view, which then equals
    # the full view: one cache, and a later escalation re-prefills only what was cut since
    recall_escalation: Literal["full", "restore"] = "full"
    # the drafter's vote on a margin escalation (context/recall.py): where the verifier hesitates
    # between its top token a and runner-up b, the drafter model (which reads the full history)
    # scores both; "full": escalate only if, on the full view, it ranks b above a by more than
    # recall_vote_min nats; "delta": only if the removed text moves it toward b by more than
    # that, i.e. [log p_F(b) - log p_F(a)] - [log p_C(b) - log p_C(a)] > recall_vote_min (its
    # two views part there); "none": every hesitation escalates
    recall_vote: Literal["none", "full", "delta"] = "none"
    recall_vote_min: float = 0.0
    # what a recall restores: every tool output the evidence points into, or the latest of them
    # (the cheapest re-prefill; another recall may bring back an older one)
    recall_scope: Literal["all", "latest"] = "all"
    # a recall whose restore would re-prefill more verifier tokens than this is not made (0: any)
    recall_max_tokens: int = Field(0, ge=0)
    # re-admission (context/attention_keep.py): at each step, cut rows of earlier outputs that the
    # drafter's last rows read at `readmit_ratio` times the uniform share or more come back, within
    # this many tokens, as a marked block at the end of the newest message (0: never)
    readmit_tokens: int = Field(0, ge=0)
    readmit_ratio: float = Field(20.0, gt=0.0)
    # lexical re-admission (ContextViews._apply_lexical): when tool outputs enter, the rows earlier
    # outputs had cut that share a rare word with them come back, within this many tokens, as the
    # block at the end of the newest output (0: never). No model: the step's own new text asks
    readmit_lexical_tokens: int = Field(0, ge=0)
    # the drafter's own greedy continuation of this many tokens is read too (its rows' attention
    # joins the prompt's last rows'; Speculative Prefill's look-ahead), and offered as copied drafts
    attention_lookahead: int = Field(0, ge=0)
    # how the read rows' attention is pooled per position: mean, or max (one row reading a
    # position hard counts: the token that decides)
    attention_pool: Literal["mean", "max"] = "mean"
    # which rows score: the prompt's last rows and the look-ahead's, or the look-ahead's alone
    # (the rows writing the step's answer; the prompt's rows then only where the look-ahead is
    # empty), and over which layers: all, or the upper half (evals/probes/cut_row_rank.py: on the
    # pair's dev steps the 0.5B's look-ahead rows in its upper layers rank the rows full's answer
    # rests on near the top, its prompt rows and lower layers near the bottom)
    attention_rows: Literal["prompt_and_lookahead", "lookahead"] = "prompt_and_lookahead"
    attention_layers: Literal["all", "upper"] = "all"
    # the unit every row-level keep takes or leaves (query, identifier and attention keep; lexical
    # and attention re-admission): "line" (a line; each JSON object of a long line), or "block"
    # (context/units.py: a wrapped paragraph, a record with its indented lines, whole while it
    # costs at most keep_unit_max_tokens; else its row and its parts; a wrapped paragraph's
    # sentences; a listing's rows stay apart)
    keep_unit: Literal["line", "block"] = "line"
    keep_unit_max_tokens: int = Field(64, ge=1)  # the default view's identifier keep budget

    def reads_attention(self) -> bool:
        """Whether the drafter's attention is read at each step's start (attention keep, or
        re-admission there; with recall_evidence "margin_readmit" it is read at the verifier's
        hesitations instead, context/recall.py)."""
        return (self.readmit_tokens > 0 and self.recall_evidence != "margin_readmit") or any(
            getattr(c, "attention_keep_tokens", 0) > 0 for c in self.compressors)

    @field_validator("compressors", mode="before")
    @classmethod
    def _bare_names(cls, value):
        if isinstance(value, (list, tuple)):
            return [{"type": v} if isinstance(v, str) else v for v in value]
        return value

    @classmethod
    def default(cls) -> "CompressionConfig":
        """tool_output with 64 head and 32 tail tokens, query-aware keep of 96 tokens and
        identifier keep of 64 tokens (why: docs/views.md, docs/context.md)."""
        return cls()

    @classmethod
    def preset(cls, name: str) -> "CompressionConfig":
        """A named setting (PRESETS; docs/context.md compares them on one frontier)."""
        if name not in PRESETS:
            raise ValueError(f"unknown compression preset {name!r}; one of {', '.join(PRESETS)}")
        return cls.model_validate(PRESETS[name])

    @classmethod
    def none(cls) -> "CompressionConfig":
        """No compression: the verifier reads the full view."""
        return cls(compressors=[])

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "CompressionConfig":
        """Load a YAML (.yaml/.yml) or JSON file."""
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ValueError(f"{path}: not valid YAML: {exc}") from exc
        else:
            data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a compression config must be a mapping, got {type(data).__name__}")
        return cls.model_validate(data)

    @classmethod
    def from_any(cls, value) -> "CompressionConfig":
        """None -> default, a config, a dict, or a path to a YAML/JSON file."""
        if value is None:
            return cls.default()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.model_validate(value)
        if isinstance(value, (str, os.PathLike)):
            return cls.from_file(value)
        raise ValueError(f"cannot make a CompressionConfig from {type(value).__name__}")

    def units(self, count):
        """text -> [(start, end)] the keep units of this config (`keep_unit`, context/units.py)."""
        return units.splitter(self.keep_unit, self.keep_unit_max_tokens, count)

    def get(self, kind: type):
        """The first configured compressor of class `kind`, or None."""
        return next((c for c in self.compressors if isinstance(c, kind)), None)
