"""Context views: the drafter's full token stream and the verifier's compressed, append-stable one.

`ContextViews` is stateful per conversation. When a message enters the history its compressed
form is decided once and memoised, so the compressed stream of history n is a token prefix of
that of history n+1 and the verifier's KV cache is reused across agent steps. The only changes
to earlier messages are *rewrites*, each counted: a batched `recent_turns` demotion (every m
turns), a budget escalation, or a caller whose history is not an extension of the previous one
(the memo is reset). Both streams end with the same tail: the generation prompt, after the close
of a trailing run of tool messages where the template merges such a run into one turn
(asymagent/context/rendering.py; a message after a run carries the run's close in front of it).

Budget (`max_verifier_tokens`, counted in the verifier's own tokens): when the compressed view
is over it, these steps are taken in order, each sticky for the rest of the conversation, until
it fits: 1. tool listing to name_sig; 2. demote every turn but the last (old tool outputs become
stubs); 3. halve the head/tail kept of the remaining tool outputs, up to 6 times. If the view is
still over, `build` raises `VerifierBudgetError` (a ValueError) naming both lengths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from asymagent.context import attention_keep, query_keep
from asymagent.context.rendering import MessageRenderer, Segment, call_json, function_of, message_text, \
    strip_descriptions
from asymagent.context.compressors import (CompressionConfig, MessageContext, RecentTurnsCompressor,
                                   SurprisalCompressor, ToolOutputCompressor, ToolSchemasCompressor)
from asymagent.context.query_keep import recent_query
from asymagent.context.token_counting import TokenCounter, make_counter

MAX_SHRINK = 6  # head/tail halvings under budget pressure: 64/32 tokens -> 1/0 tokens
_PER_MESSAGE_TOKENS = 4  # role markers per message when counting text-only views (OpenAI's rule)

class VerifierBudgetError(ValueError):
    """The compressed view does not fit `max_verifier_tokens` even after every budget step."""


@dataclass
class ViewPair:
    """Both token streams at one generation point, and what building them cost."""

    full_ids: list  # [N_full] drafter's view, ends with the generation prompt
    compressed_ids: list  # [N_ver] verifier's view, ends with the same tail (generation prompt)
    rewrites: int  # 1 if the compressed stream is not an extension of the previous build's
    full_context_tokens: int
    verifier_context_tokens: int
    compression_ratio: float  # verifier_context_tokens / full_context_tokens
    generation_prompt_len: int = 0  # tokens of the shared tail: a trailing tool run's close (if
    # any), then the generation prompt

    def fill(self, stats) -> None:
        """Copy the view fields into a StepStats."""
        stats.full_context_tokens = self.full_context_tokens
        stats.verifier_context_tokens = self.verifier_context_tokens
        stats.compression_ratio = self.compression_ratio
        stats.rewrites += self.rewrites


@dataclass
class MessageSpan:
    """One message's token range in the full and in the compressed view (`message_spans`)."""

    role: str
    full: tuple  # (start, end) in ViewPair.full_ids
    compressed: tuple  # (start, end) in ViewPair.compressed_ids
    same: bool  # identical tokens in both views (the message was not compressed)


@dataclass
class CompressedMessages:
    """Text-level compressed view, for models we do not host (the middleware)."""

    messages: list  # OpenAI messages with compressed contents
    tools: list | None  # tools (descriptions stripped under name_sig)
    rewrites: int
    full_tokens: int  # counted with the view's counter
    compressed_tokens: int


@dataclass
class _Entry:
    key: str  # the message as JSON, in its own key order (`_key`)
    message: dict  # as given
    role: str
    original: str  # content as the full view renders it (tool calls already as JSON)
    turn: int | None  # None for system messages (never compressed)
    tool_name: str | None
    has_tool_calls: bool
    full: Segment | None = None
    lead_full: list = field(default_factory=list)  # close of the tool run before it (merged templates)
    lead_comp: list = field(default_factory=list)  # the same in the compressed view
    pruned: list | None = None  # surprisal-kept ids of the full segment, decided at entry
    surprisal_done: bool = False
    demoted: bool = False
    shrink: int = 0
    state: tuple | None = None  # (demoted, shrink, style) the compressed form was built for
    compressed_text: str = ""
    compressed_ids: list = field(default_factory=list)
    query: frozenset = frozenset()  # tool outputs: words of the turns before them (query_keep)
    newest: bool = False  # tool output of the latest turn
    restored: bool = False  # brought back whole by a recall (`ContextViews.restore`); sticky
    attention_done: bool = False  # the drafter's attention was offered at its entry
    attention: tuple = ()  # (char start, char end, score) per content token, at entry (tool outputs)
    token_spans: list | None = None  # [(segment token index, char start, char end)] of the content
    readmit: str = ""  # cut rows of earlier outputs brought back at its entry (attention_keep.py)
    readmit_rows: list = field(default_factory=list)  # ... those rows, in the block's order
    lexical_done: bool = False  # lexical re-admission was decided at its entry


def _key(obj) -> str:
    """A message's (or the tools') identity: JSON in its own key order, since the template renders
    that order (`tojson` of a tool, a call's dict arguments): a reordered schema is a new prompt."""
    return json.dumps(obj, ensure_ascii=False, default=str)


def _joined_units(rows: list, units):
    """A `split` for the text "\n".join(rows), optionally followed by more text: each row one unit
    (rows are units already), then `units` of what follows (lexical re-admission's query)."""
    doc = "\n".join(rows)
    spans, pos = [], 0
    for r in rows:
        spans.append((pos, pos + len(r)))
        pos += len(r) + 1

    def split(text: str) -> list:
        if not text.startswith(doc):
            return units(text)
        return spans + [(len(doc) + a, len(doc) + b) for a, b in units(text[len(doc):])]

    return split


class ContextViews:
    """Builds (full, compressed) views of one conversation, append-stable across calls."""

    def __init__(self, tokenizer=None, compression=None, chat_format: MessageRenderer | None = None,
                 counter: TokenCounter | None = None):
        self.config = CompressionConfig.from_any(compression)
        if chat_format is None and tokenizer is not None:
            chat_format = MessageRenderer(tokenizer)
        self.chat_format = chat_format
        tok = tokenizer if tokenizer is not None else getattr(chat_format, "tokenizer", None)
        self.counter = counter or make_counter(tok)
        self._units = self.config.units(self.counter.count)  # the keeps' units (keep_unit)
        self.total_rewrites = 0
        self._last_body: list | None = None  # compressed ids (no generation prompt) last built
        self._pending_reset = False  # a `verifier_tokens` sync reset the memo (the next build reports it)
        self._last_texts: list | None = None  # compressed (role, text) list last returned
        self._reset(None)

    # -- state ---------------------------------------------------------------------------------
    def _reset(self, tools) -> None:
        self.entries: list = []
        self.tools = tools or None
        self.tools_key = _key(self.tools)
        self.turns = 0
        self.call_names: dict = {}
        self.frontier = 0  # turns with index < frontier are demoted
        self.schemas_forced = False
        self.shrink = 0

    @property
    def tool_style(self) -> str:
        forced = self.schemas_forced or self.config.get(ToolSchemasCompressor) is not None
        return "name_sig" if forced else "full"

    def _entry(self, message: dict, key: str) -> _Entry:
        if self.chat_format is not None:
            plain = self.chat_format.template_message(message)
        else:
            plain = _plain_message(message)
        role = plain["role"]
        calls = message.get("tool_calls") or []
        for call in calls:
            if isinstance(call, dict) and call.get("id"):
                fn = call.get("function") if isinstance(call.get("function"), dict) else {}
                self.call_names[call["id"]] = fn.get("name")
        if role == "system":
            turn = None
        elif role == "tool":
            self.turns = max(self.turns, 1)
            turn = self.turns - 1
        else:
            turn, self.turns = self.turns, self.turns + 1
        name = message.get("name") or self.call_names.get(message.get("tool_call_id"))
        query = recent_query([e.message for e in self.entries]) if role == "tool" else frozenset()
        return _Entry(key, message, role, plain["content"], turn,
                      name if role == "tool" else None, bool(calls), query=query)

    def _sync(self, messages: list, tools, logprob_fn, attention_fn=None) -> bool:
        """Bring the memo up to `messages`; returns True if the memo had to be reset."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of OpenAI-style message dicts")
        tools = tools or None
        keys = [_key(m) for m in messages]
        n = len(self.entries)
        extends = (_key(tools) == self.tools_key and n <= len(messages)
                   and all(e.key == k for e, k in zip(self.entries, keys)))
        reset = not extends
        if reset:
            self._reset(tools)
        for i in range(len(self.entries), len(messages)):
            self.entries.append(self._entry(messages[i], keys[i]))
        recent = self.config.get(RecentTurnsCompressor)
        if recent is not None:
            self.frontier = max(self.frontier, recent.frontier(self.turns))
        self._refresh(logprob_fn, attention_fn)
        budget = self.config.max_verifier_tokens
        while budget is not None and self._measure() > budget:
            if self.tools and self.tool_style == "full":
                self.schemas_forced = True
            elif self.frontier < self.turns - 1:
                self.frontier = self.turns - 1
            elif self.shrink < MAX_SHRINK:
                self.shrink += 1
            else:
                raise VerifierBudgetError(self._budget_message(budget))
            self._refresh(logprob_fn)
        return reset

    # -- compressing messages --------------------------------------------------------------------
    def _compressors(self) -> list:
        """Configured compressors, plus the ones budget pressure needs with their defaults."""
        out = list(self.config.compressors)
        if self.frontier > 0 and self.config.get(RecentTurnsCompressor) is None:
            out.append(RecentTurnsCompressor())
        if self.shrink > 0 and self.config.get(ToolOutputCompressor) is None:
            out.append(ToolOutputCompressor())
        return out

    def _refresh(self, logprob_fn, attention_fn=None) -> None:
        cf, style = self.chat_format, self.tool_style
        newest = any(isinstance(c, ToolOutputCompressor) and c.keep_newest for c in self.config.compressors)
        last = max((i for i, e in enumerate(self.entries) if e.role in ("user", "assistant")), default=-1)
        for i, e in enumerate(self.entries):
            e.demoted = e.turn is not None and e.turn < self.frontier
            e.shrink = 0 if e.demoted else self.shrink
            e.newest = newest and e.role == "tool" and i > last
        if cf is not None:
            self._full_pre = cf.preamble_segment(self.tools, "full") if not self._first_system() else None
            self._comp_pre = cf.preamble_segment(self.tools, style) if not self._first_system() else None
            for i, e in enumerate(self.entries):
                if e.full is None:
                    run = self._run_before(i, compressed=False)
                    e.full = cf.render_message(e.message, i, self.tools, "full", first=(i == 0), run=run)
                    e.lead_full = self._close_ids(run) if e.role != "tool" else []
            self._apply_surprisal(logprob_fn)
            self._apply_attention(attention_fn)
        self._compress_changed(style)
        if cf is not None and self._apply_lexical():
            self._compress_changed(style)

    def _compress_changed(self, style: str) -> None:
        """(Re)compress the entries whose compressed form is out of date."""
        changed = False  # the previous entry was (re)compressed: a tool run's next message follows it
        for i, e in enumerate(self.entries):
            state = (e.demoted, e.shrink, style if i == 0 else None, e.newest, e.restored)
            follows_tool = i > 0 and self.entries[i - 1].role == "tool"
            changed = e.state != state or (changed and follows_tool)
            if changed:
                self._compress(i, e)
                e.state = state

    def _apply_lexical(self) -> bool:
        """Lexical re-admission (`CompressionConfig.readmit_lexical_tokens`), decided once when
        tool outputs enter: the rows earlier outputs had cut that share a rare word with the newest
        output (query_keep's rule, that output as the query: the component a ticket names
        finds the routing row that names it) come back, within the budget, as the marked block at
        the end of the newest output (attention_keep.render_block), which the verifier has not
        prefilled yet: its cache keeps every earlier token. Returns True if a block was added."""
        todo = [e for e in self.entries if not e.lexical_done]
        for e in todo:
            e.lexical_done = True
        budget = self.config.readmit_lexical_tokens
        new = [e for e in todo if e.role == "tool"]
        if budget <= 0 or not new or self.entries[-1] is not new[-1]:
            return False  # only where the conversation ends on the new outputs (the step reads them)
        target = new[-1]  # the newest output asks (a history built at once: its last output)
        shown = "".join(x.readmit for x in self.entries if not x.restored)
        rows = []
        for _, e in self._cut_outputs(frozenset({id(target)})):
            for a, b in self._units(e.original):
                row = e.original[a:b].strip()
                if row and row not in e.compressed_text and row not in shown and row not in rows:
                    rows.append(row)
        if not rows:
            return False
        doc, asked = "\n".join(rows), target.original
        split = query_keep.split_units if self.config.keep_unit == "line" else _joined_units(rows, self._units)
        spans = query_keep.select(doc, query_keep.words(asked), budget, self.counter.count,
                                  context=doc + "\n" + asked, rank="per_token", split=split)
        chosen = [doc[a:b].strip() for a, b in spans]
        if not chosen:
            return False
        target.readmit_rows = target.readmit_rows + chosen
        target.readmit = attention_keep.render_block(target.readmit_rows)
        target.state = None  # compressed again with its block
        return True

    def _run_before(self, i: int, compressed: bool) -> list:
        """The tool messages right before entry i (its turn's earlier results), as the full or
        the compressed view renders them."""
        j = i
        while j > 0 and self.entries[j - 1].role == "tool":
            j -= 1
        return [{"role": "tool", "content": x.compressed_text} if compressed else x.message
                for x in self.entries[j:i]]

    def _close_ids(self, run: list) -> list:
        seg = self.chat_format.close_segment(run) if run else None
        return list(seg.ids) if seg is not None else []

    def _tail(self, compressed: bool) -> list:
        """What follows the last message: the close of a trailing tool run, then the generation prompt."""
        run = self._run_before(len(self.entries), compressed)
        return self._close_ids(run) + list(self.chat_format.generation_prompt_ids)

    def _context(self, e: _Entry) -> MessageContext:
        return MessageContext(e.role, e.original, e.demoted, e.shrink, e.tool_name,
                              e.has_tool_calls, self.counter, e.query, e.newest, e.attention, self._units)

    def _transformed(self, e: _Entry) -> str:
        """The content after the text compressors, in order (system messages are kept)."""
        text = e.original
        if e.role != "system" and not e.restored:
            ctx = self._context(e)
            for comp in self._compressors():
                text = comp.transform(text, ctx)
        return text + ("" if e.restored else e.readmit)  # restored whole: as the full view has it

    def _compress(self, i: int, e: _Entry) -> None:
        text = e.compressed_text = self._transformed(e)
        cf = self.chat_format
        if cf is None:
            return
        # the tool run before it as the compressed view holds it (merged templates render a tool
        # message after its run's earlier results, and put the run's close before the next message)
        run = self._run_before(i, compressed=True)
        same_run = [m["content"] for m in run] == [x.original for x in self.entries[i - len(run):i]]
        e.lead_comp = (e.lead_full if same_run else self._close_ids(run)) if e.role != "tool" else []
        if i == 0 and e.role == "system":
            e.compressed_ids = cf.render_message(e.message, 0, self.tools, self.tool_style,
                                                 first=True).ids
        elif text != e.original:
            e.compressed_ids = cf.render_message({"role": e.role, "content": text}, i, run=run).ids
        else:
            e.compressed_ids = e.pruned if e.pruned is not None else e.full.ids
            if e.role == "tool" and not same_run:  # its run's earlier results were compressed
                seg = cf.render_message({"role": e.role, "content": text}, i, run=run)
                if seg.text != e.full.text:  # a template that reads them (none we know of)
                    e.compressed_ids = seg.ids

    def _apply_surprisal(self, logprob_fn) -> None:
        """Decide surprisal pruning once for new messages, from the drafter's log-probs."""
        comp = self.config.get(SurprisalCompressor)
        todo = [e for e in self.entries if not e.surprisal_done]
        for e in todo:
            e.surprisal_done = True
        if comp is None or logprob_fn is None:
            return  # documented: without log-probs the messages stay as the text compressors left them
        todo = [e for e in todo if comp.applies(self._context(e), self._transformed(e))]
        if not todo:
            return
        full_ids, offsets = self._full_ids_with_offsets()
        logprobs = list(logprob_fn(full_ids))
        if len(logprobs) != len(full_ids):
            raise ValueError(f"logprob_fn returned {len(logprobs)} log-probs for {len(full_ids)} tokens")
        position = {id(x): k for k, x in enumerate(self.entries)}
        for e in todo:
            spans = self._token_spans(e, position[id(e)])  # [] for a slow tokenizer: no pruning
            if not spans:
                continue
            base = offsets[id(e)]
            pieces = [e.original[s:t] for _, s, t in spans]
            kept = set(comp.select(pieces, [logprobs[base + j] for j, _, _ in spans]))
            drop = {j for k, (j, _, _) in enumerate(spans) if k not in kept}
            e.pruned = [t for j, t in enumerate(e.full.ids) if j not in drop]

    def _token_spans(self, e: _Entry, index: int) -> list:
        """[(token index in e.full, char start, char end)] of the content's tokens (chars of
        e.original), once per message; [] where offsets are not to be had."""
        if e.token_spans is None:
            e.token_spans = []
            run = self._run_before(index, compressed=False)
            span = self.chat_format.content_span(e.full.text, e.role, e.original, run)
            try:
                enc = self.chat_format.tokenizer(e.full.text, add_special_tokens=False,
                                                 return_offsets_mapping=True)
            except (NotImplementedError, ValueError, TypeError):
                return e.token_spans  # a slow tokenizer has no offsets: no attention keep
            if span is not None and list(enc["input_ids"]) == list(e.full.ids):
                e.token_spans = [(j, s - span[0], t - span[0])
                                 for j, (s, t) in enumerate(enc["offset_mapping"])
                                 if s >= span[0] and t <= span[1] and t > s]
        return e.token_spans

    def _apply_attention(self, attention_fn) -> None:
        """Offer the drafter's attention to the new messages, once (attention keep), and bring
        back the cut rows of earlier outputs that this step reads (re-admission), as a block at
        the end of the newest message (asymagent/context/attention_keep.py)."""
        todo = [e for e in self.entries if not e.attention_done]
        for e in todo:
            e.attention_done = True
        if attention_fn is None or not todo or not self.config.reads_attention():
            return
        full_ids, offsets = self._full_ids_with_offsets()
        scores = list(attention_fn(full_ids))
        if len(scores) != len(full_ids):
            raise ValueError(f"attention_fn returned {len(scores)} scores for {len(full_ids)} tokens")
        new = {id(e) for e in todo}
        for i, e in enumerate(self.entries):
            if id(e) in new and e.role == "tool":
                e.attention = self._scored(i, e, scores, offsets)
        candidates = self._cut_rows(scores, offsets, skip=new) if self.config.readmit_tokens else []
        target = next((e for e in reversed(todo) if e.role != "system"), None)
        rows = attention_keep.readmit(candidates, len(full_ids), self.config.readmit_ratio,
                                      self.config.readmit_tokens, self.counter.count)
        if target is not None and rows:
            target.readmit_rows = [text for _, _, text in sorted(rows, key=lambda r: r[1])]
            target.readmit = attention_keep.render_block(target.readmit_rows)

    def _scored(self, i: int, e: _Entry, scores: list, offsets: dict) -> tuple:
        """(char start, char end, score) of entry i's content tokens, from per-position scores."""
        base = offsets[id(e)]
        return tuple((s, t, scores[base + j]) for j, s, t in self._token_spans(e, i))

    def _cut_outputs(self, skip=frozenset()):
        """(index, entry) of each tool output whose view cuts rows: not restored, not in `skip`
        (ids of entries); what lexical and attention re-admission both walk."""
        for i, e in enumerate(self.entries):
            if e.role == "tool" and id(e) not in skip and not e.restored and e.compressed_text != e.original:
                yield i, e

    def _cut_rows(self, scores: list, offsets: dict, skip=frozenset()) -> list:
        """[(score, (message index, char start), row text)] of every row the view cuts from a tool
        output (entries in `skip` aside) and shows nowhere, scored by its largest token score."""
        blocks = "".join(x.readmit for x in self.entries)
        out = []
        for i, e in self._cut_outputs(skip):
            shown = e.compressed_text + blocks
            for s, t, v in attention_keep.row_scores(e.original, list(self._scored(i, e, scores, offsets)),
                                                     split=self._units):
                if e.original[s:t].strip() not in shown:
                    out.append((v, (i, s), e.original[s:t]))
        return out

    def readmit_at(self, scores: list) -> list:
        """Re-admission during decoding (context/recall.py, evidence "margin_readmit"): the cut
        rows that per-position `scores` over the last `build`'s full view (the drafter's attention
        at the token the verifier hesitates on; positions past the view are ignored) reach at
        `readmit_ratio` x the uniform share, best first within `readmit_tokens`, join the block at
        the end of the newest message. That message is the verifier's cache's tail, so only it is
        re-prefilled; the block stays (append-stable). Returns the indices of the rows' messages
        ([]: nothing new)."""
        full_ids, offsets = self._full_ids_with_offsets()
        scores = list(scores)[:len(full_ids)]
        if len(scores) < len(full_ids) or not self.entries:
            raise ValueError(f"readmit_at needs a score for each of the {len(full_ids)} full-view tokens")
        target = next((e for e in reversed(self.entries) if e.role != "system"), None)
        if target is None:
            return []
        budget = self.config.readmit_tokens - sum(self.counter.count(r.strip()) + 1 for r in target.readmit_rows)
        rows = attention_keep.readmit(self._cut_rows(scores, offsets), len(full_ids),
                                      self.config.readmit_ratio, budget, self.counter.count)
        if not rows:
            return []
        target.readmit_rows = target.readmit_rows + [text for _, _, text in sorted(rows, key=lambda r: r[1])]
        target.readmit = attention_keep.render_block(target.readmit_rows)
        target.state = None  # compressed again with its block
        self._refresh(None)
        self._last_body = self._compressed_body()
        return sorted({key[0] for _, key, _ in rows})

    def _first_system(self) -> bool:
        return bool(self.entries) and self.entries[0].role == "system"

    # -- assembling --------------------------------------------------------------------------------
    def _full_ids_with_offsets(self) -> tuple[list, dict]:
        ids = list(self._full_pre.ids) if self._full_pre else []
        offsets = {}
        for e in self.entries:
            ids.extend(e.lead_full)
            offsets[id(e)] = len(ids)
            ids.extend(e.full.ids)
        return ids + self._tail(compressed=False), offsets

    def _compressed_body(self) -> list:
        ids = list(self._comp_pre.ids) if self._comp_pre else []
        for e in self.entries:
            ids.extend(e.lead_comp)
            ids.extend(e.compressed_ids)
        return ids

    def _measure(self) -> int:
        if self.chat_format is not None:
            return len(self._compressed_body()) + len(self._tail(compressed=True))
        return self._text_tokens(compressed=True)

    def _text_tokens(self, compressed: bool) -> int:
        n = sum(self.counter.count(e.compressed_text if compressed else e.original)
                + _PER_MESSAGE_TOKENS for e in self.entries)
        tools = self._tools_out(compressed)
        return n + (self.counter.count(_key(tools)) if tools else 0)

    def _budget_message(self, budget: int) -> str:
        fixed = 0
        if self.chat_format is not None:
            fixed = len(self._comp_pre.ids) if self._comp_pre else 0
            if self._first_system():
                fixed += len(self.entries[0].compressed_ids)
            fixed += len(self._tail(compressed=True))
        return (f"the verifier's view needs {self._measure()} tokens after every compression step, "
                f"over max_verifier_tokens={budget} (the system prompt, tool listing and generation "
                f"prompt alone take {fixed} tokens); raise max_verifier_tokens or shorten the history")

    def build(self, messages: list, tools=None,
              logprob_fn: Callable[[list], list] | None = None,
              attention_fn: Callable[[list], list] | None = None) -> ViewPair:
        """Full and compressed token views of `messages` at the generation point.

        logprob_fn(full_ids) -> [len(full_ids)] log p(token_t | tokens_<t) from the drafter; only
        called when a surprisal compressor has new messages to prune.
        attention_fn(full_ids) -> [len(full_ids)] the drafter's attention per position; only
        called when attention keep or re-admission is configured and new messages entered.
        """
        if self.chat_format is None:
            raise ValueError("ContextViews.build needs a tokenizer or chat_format (token views)")
        reset = self._sync(messages, tools, logprob_fn, attention_fn) or self._pending_reset
        self._pending_reset = False
        body = self._compressed_body()
        last = self._last_body
        rewrites = int(last is not None and (reset or body[: len(last)] != last))
        self._last_body = body
        self.total_rewrites += rewrites
        gen = self._tail(compressed=True)
        full_ids = self._full_ids_with_offsets()[0]
        compressed_ids = body + gen
        return ViewPair(full_ids, compressed_ids, rewrites, len(full_ids), len(compressed_ids),
                        len(compressed_ids) / len(full_ids) if full_ids else 1.0, len(gen))

    def verifier_tokens(self, messages: list, tools=None,
                        logprob_fn: Callable[[list], list] | None = None,
                        attention_fn: Callable[[list], list] | None = None) -> int:
        """The length of the compressed view `build(messages, tools)` will give, without being a
        build (the rewrites it brings are reported by that build): what a server admits a request
        by when the verifier reads the compressed view and the full one is over the model's
        context (integrations/server/worker.py)."""
        if self.chat_format is None:
            raise ValueError("ContextViews.verifier_tokens needs a tokenizer or chat_format (token views)")
        self._pending_reset = self._sync(messages, tools, logprob_fn, attention_fn) or self._pending_reset
        return self._measure()

    def restore(self, full_positions) -> list:
        """Recall: bring back whole the compressed messages of the last `build` that hold any of
        `full_positions` (token positions in its full view); returns their indices.

        Sticky: a restored message stays whole in every later build (the view is append-stable
        again from there). The caller re-prefills the verifier from the first changed token and
        counts the recall (StepStats.recalls); the next `build` does not count it as a rewrite.
        """
        spans, hit = self.message_spans(), []
        for i, (span, e) in enumerate(zip(spans, self.entries)):
            if span.same or e.role != "tool" or e.restored:
                continue
            if any(span.full[0] <= p < span.full[1] for p in full_positions):
                e.restored = True
                hit.append(i)
        if hit:
            self._refresh(None)
            self._last_body = self._compressed_body()
        return hit

    def original_text(self, index: int) -> str:
        """Message `index`'s content as the full view renders it (tool calls as JSON)."""
        return self.entries[index].original

    def compressed_ids(self) -> list:
        """The compressed view of the last `build` as it stands now (after any `restore`)."""
        return self._compressed_body() + self._tail(compressed=True)

    def message_spans(self) -> list:
        """Where each message of the last `build` sits in both token views.

        One `MessageSpan` per message, in order: `full` and `compressed` are (start, end) token
        ranges; `same` says the message's tokens are identical in both views (not compressed).
        """
        full = len(self._full_pre.ids) if self._full_pre else 0
        comp = len(self._comp_pre.ids) if self._comp_pre else 0
        out = []
        for e in self.entries:
            full, comp = full + len(e.lead_full), comp + len(e.lead_comp)
            nf, nc = len(e.full.ids), len(e.compressed_ids)
            out.append(MessageSpan(e.role, (full, full + nf), (comp, comp + nc),
                                   list(e.full.ids) == list(e.compressed_ids)))
            full, comp = full + nf, comp + nc
        return out

    # -- text-level view (models we do not host) ------------------------------------------------------
    def _tools_out(self, compressed: bool):
        if not self.tools or not compressed or self.tool_style == "full":
            return self.tools
        return [{"type": "function", "function": strip_descriptions(function_of(t))}
                for t in self.tools]

    def compress_messages(self, messages: list, tools=None) -> CompressedMessages:
        """The compressed view as OpenAI messages (no surprisal: it needs our drafter)."""
        reset = self._sync(messages, tools, None)
        out = []
        for e in self.entries:
            if e.compressed_text == e.original or e.role in ("system", "assistant"):
                out.append(e.message)
            else:
                out.append({**e.message, "content": e.compressed_text})
        texts = [(e.role, e.compressed_text) for e in self.entries]
        last = self._last_texts
        rewrites = int(last is not None and (reset or texts[: len(last)] != last))
        self._last_texts = texts
        self.total_rewrites += rewrites
        return CompressedMessages(out, self._tools_out(True), rewrites,
                                  self._text_tokens(False), self._text_tokens(True))


def _plain_message(message: dict) -> dict:
    """{role, content text} without a chat template (text-only views)."""
    if "role" not in message:
        raise ValueError(f"a message must have a 'role', got {message!r}")
    role = {"developer": "system", "function": "tool"}.get(message["role"], message["role"])
    content = message.get("content")
    if role == "tool" and not isinstance(content, (str, list, type(None))):
        content = json.dumps(content, ensure_ascii=False)
    text = message_text(content)
    calls = [call_json(c) for c in message.get("tool_calls") or []]
    return {"role": role, "content": "\n".join(([text] if text else []) + calls)}
