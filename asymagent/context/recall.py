"""Recall on evidence: bring back the removed text a step needs, during decoding, and decode the step again.

While a step decodes on the compressed view, the decode loop hands every emitted token to a
`RecallWatch` (asymagent/decoding/loop.py, `LoopContext.interrupt`). The watch reads the full
view's copy evidence (asymagent/decoding/copy_delta.py) at that output position:

- `evidence="copy"`: the full view would copy a continuation that only its removed text holds
  (c_F > c_C) and the emitted token is none of those (the verifier missed the copy);
- `evidence="copy_any"`: the full view's copy points into removed text at all (c_F > c_C),
  whether or not the verifier agreed: the step is reading text the verifier does not see;
- `evidence="copy_any_length"`: as copy_any, at the longest suffix length whose continuations
  differ between the views (the longest match often ends in an earlier call both views hold);
- `evidence="margin"`: a *decision* trigger, for steps that copy nothing: the compressed
  verifier's own top-2 log-prob gap at an emitted token is under `margin` nats (it hesitates,
  where what the view removed may decide). Nothing is restored: the step is decoded again from
  its first token on the full view, in mode spec (lossless: full's output), using the
  conversation's full-view verifier cache (its prefix kept across steps); the next step is back
  on the compressed view, whose cache is untouched. Found with evals/probes/recall_evidence.py:
  on the bench every step where asym leaves full has its lowest (or second lowest) margin at the
  divergence, 0.0-0.38 nats, while 6 of the 7 identical steps stay above 0.75. Same seed, same
  output holds as for the other evidence, with one caveat: the gap is a log-prob value, and a
  round's rows can differ from a plain step's row in the last bits (bf16), so a gap within those
  bits of the threshold may fire under one round layout and not another. No escalation while a
  compressed tool output spells out a tool call (the full view would hand it to the verifier:
  on the injection_call attack set, dev seeds, escalating took asym's attack success from 0 to
  2/12, full's 7/12). Nor while the full view is longer than `limit` (the verifier cannot read it).
  With a `vote` (CompressionConfig.recall_vote), a hesitation escalates only when the drafter
  model, which reads the full history, says the removed text matters there: between the
  verifier's emitted token a and its runner-up b, `vote(full_prefix, compressed_prefix, a, b)`
  scores how far the full view moves the drafter toward b (session.py `drafter_vote_fn`: on the
  full view alone, or as the difference of its two views); at most `vote_min` nats and the
  hesitation is the verifier's own (the same on both views), so the step goes on. The drafter's
  caches of both views are kept across steps (only what they lack is fed, when a vote is asked).
  With `escalation="restore"` (CompressionConfig.recall_escalation) the hesitation does not
  switch caches: every tool output the view cut is restored whole (`ContextViews.restore`,
  sticky), the verifier's one cache re-prefilled from the first of them, and the step decoded
  again on that view, which now equals the full view (full's output). The full-view escalation
  keeps a second verifier cache that each escalation brings up to date while the compressed one
  keeps growing too; the restore leaves one cache, and a later hesitation restores only the
  outputs cut since.
- `evidence="margin_readmit"`: at such a hesitation the drafter's attention there (its rows up to
  the token the verifier hesitates on, over the full view and the output so far) scores the rows
  the view cut; those it reads at `readmit_ratio` x the uniform share come back, within
  `readmit_tokens`, as the marked block at the end of the newest message
  (`ContextViews.readmit_at`, `readmit(full_prefix) -> message indices`), and the step is decoded
  again from its first token on that view: the verifier re-prefills only the newest message, not
  the full view. A hesitation where no cut row passes goes on (nothing escalates). Rows that spell
  out a tool call never come back (attention_keep.py).

When it fires and the tool outputs holding the copy sources (`scope="all"`), or the latest of
them only (`scope="latest"`: the cheapest re-prefill, which starts at the first restored message;
a further recall may bring back an older one), can be restored (and, with `max_tokens`, the restore would re-prefill at most that many
verifier tokens: a bounded cost per recall; with `limit`, the model's context, the restored view
leaves a position to generate in: the engine's ContextLengthError binds the verifier's view)
(`ContextViews.restore`: whole, sticky, so later steps keep them and stay append-stable), the
loop stops there (finish "recall"; the tokens after it are never decoded) and the step is decoded
again from its first token on the restored view: the verifier re-prefills from the first restored
message (its cache keeps everything before; the newest output is the cache's tail, the cheapest
case). From the first token, not from the evidence position: the tokens before it were chosen
without the removed text. At most `CompressionConfig.max_recalls` recalls per step; the last
pass runs without a watch. A tool output that spells out a tool call in the chat format
(`query_keep.has_call_format`, the rule query keep applies to rows) is never restored: a recall
would hand the verifier an injected call to copy (measured: on the injection_call attack set,
dev seeds, restoring such outputs took asym's attack success from 0 to 0.29, full's 0.57). Deterministic: the evidence at position t depends only on the two
views and the tokens before t, which under the default (position-invariant) rule do not depend
on how rounds were laid out. The returned result's StepStats count the recalls (`recalls`,
`recall_prefill_tokens`: verifier prefill of the passes after a recall) and sum the wall time,
prefill tokens and FLOPs of every pass.
"""

from __future__ import annotations

from typing import Callable

from asymagent.context.query_keep import has_call_format
from asymagent.decoding.copy_delta import copy_sources, copy_sources_any_length, recall_sources

EVIDENCE = ("copy", "copy_any", "copy_any_length", "margin", "margin_readmit")
ESCALATIONS = ("full", "restore")  # how a margin hesitation reaches the removed text
SCOPES = ("all", "latest")  # restore every tool output the evidence points into, or the latest one
MAX_READMIT_ASKS = 4  # margin_readmit: hesitations a pass asks the drafter's attention about
_SUMMED = ("wall_s", "prefill_s", "decode_s", "verifier_prefill_tokens", "drafter_prefill_tokens",
           "verifier_flops")


def evidence_sources(evidence: str, full: list, compressed: list, emitted: int, *, min_len: int = 3):
    """Positions of `full` the evidence points at for the token `emitted` after these views
    (an empty array: no evidence)."""
    if evidence == "copy":
        return recall_sources(full, compressed, emitted, min_len=min_len)
    if evidence == "copy_any":
        return copy_sources(full, compressed, min_len=min_len)[0]
    if evidence == "copy_any_length":
        return copy_sources_any_length(full, compressed, min_len=min_len)[0]
    if evidence in ("margin", "margin_readmit"):
        raise ValueError("margin evidence has no copy sources (RecallWatch reads the verifier's log-probs)")
    raise ValueError(f"recall evidence must be one of {EVIDENCE}, got {evidence!r}")


class RecallWatch:
    """The decode loop's interrupt for one pass: True (stop, a recall happened) at the first output
    position whose evidence restores a removed tool output (module docstring)."""

    def __init__(self, views, full_ids: list, compressed_ids: list, *, evidence: str = "copy",
                 min_len: int = 3, scope: str = "all", max_tokens: int = 0, margin: float = 0.5,
                 limit: int = 0, vote: Callable | None = None, vote_min: float = 0.0,
                 readmit: Callable | None = None, escalation: str = "full") -> None:
        if scope not in SCOPES:
            raise ValueError(f"recall scope must be one of {SCOPES}, got {scope!r}")
        if evidence not in EVIDENCE:
            raise ValueError(f"recall evidence must be one of {EVIDENCE}, got {evidence!r}")
        self.views, self.evidence, self.min_len, self.scope = views, evidence, min_len, scope
        self.margin = margin  # evidence "margin": top-2 log-prob gap (nats) under which to escalate
        # evidence "margin" reads the verifier's top-2 log-probs of each emitted token: the decode
        # function gives it a LogprobRecorder(top=2) here (None: it never fires)
        self.needs_logprobs = evidence in ("margin", "margin_readmit")
        self.readmit = readmit  # margin_readmit: full-prefix ids -> message indices brought back
        if escalation not in ESCALATIONS:
            raise ValueError(f"recall escalation must be one of {ESCALATIONS}, got {escalation!r}")
        self.escalation = escalation  # margin: "full" (the full-view cache) or "restore" (this one)
        self.recorder = None
        self.escalate = False  # fired on margin: decode the step again on the full view
        self.checked = 0  # output positions already checked (margin)
        self._call_seen: bool | None = None  # a compressed output spells out a call (margin)
        self.max_tokens = max_tokens  # a restore re-prefilling more verifier tokens is skipped (0: any)
        # the model's context limit (0: none): a restore that would leave the verifier's view no
        # position to generate in is skipped, and margin never escalates to a full view longer
        # than it (the verifier cannot read it: the engine's ContextLengthError)
        self.limit = limit
        # margin: the drafter's vote at a hesitation (module docstring); None: every one escalates
        self.vote, self.vote_min = vote, vote_min
        self.votes: list = []  # (output position, the vote's score) of every vote asked
        self.asks = 0  # margin_readmit: the drafter's attention asked this pass
        self.full, self.compressed = list(full_ids), list(compressed_ids)
        self.position: int | None = None  # output position where it fired
        self.restored: list = []  # message indices brought back

    def __call__(self, generated: list, start: int) -> bool:
        """Check the output positions start..len(generated)-1 (tokens new since the last call)."""
        if self.evidence == "margin":
            return self._margin(generated)
        if self.evidence == "margin_readmit":
            return self._margin_readmit(generated)
        for t in range(start, len(generated)):
            src = evidence_sources(self.evidence, self.full + generated[:t],
                                   self.compressed + generated[:t], generated[t], min_len=self.min_len)
            if not src.size:
                continue
            positions = self._safe([int(p) for p in src if p < len(self.full)])
            if self.scope == "latest":
                positions = self._latest(positions)
            if self.max_tokens and self.cost(positions) > self.max_tokens:
                continue
            if self.limit and len(self.compressed) + self._restored(positions)[1] + t >= self.limit:
                continue  # the restored view (and the tokens before t) would not fit
            hit = self.views.restore(positions)
            if hit:
                self.position, self.restored = t, hit
                return True
        return False


    def _margin(self, generated: list) -> bool:
        """Fire at the first scored output position whose verifier top-2 gap is under `margin`
        (a view that removed nothing never fires: the full view would say the same)."""
        if self.recorder is None or self.full == self.compressed or self._removed_call():
            return False
        if self.limit and len(self.full) >= self.limit:
            return False  # the full view is longer than the verifier's context
        for t, top in self._hesitations(generated):
            if not self._voted(generated, t, top):
                continue
            if self.escalation == "full":
                self.position, self.escalate = t, True
                return True
            cut = [s.full[0] for s in self.views.message_spans() if s.role == "tool" and not s.same]
            hit = self.views.restore(cut)  # every cut output whole, in the verifier's one cache
            if hit:
                self.position, self.restored = t, hit
                return True
            return False  # nothing restorable (the cut is not in a tool output): the step goes on
        return False

    def _hesitations(self, generated: list):
        """(output position, the verifier's top-2) of each newly scored position whose top-2 gap
        is under `margin`, in order; every position scored is checked once."""
        entries = self.recorder.entries
        for t in range(self.checked, min(len(generated), len(entries))):
            self.checked = t + 1
            top = entries[t].top
            if len(top) >= 2 and top[0][1] - top[1][1] < self.margin:
                yield t, top

    def _margin_readmit(self, generated: list) -> bool:
        """Fire at the first hesitation (top-2 gap under `margin`) where the drafter's attention
        brings cut rows back (module docstring); at most MAX_READMIT_ASKS asks a pass."""
        if self.recorder is None or self.readmit is None or self.full == self.compressed:
            return False
        for t, _ in self._hesitations(generated):
            if self.asks >= MAX_READMIT_ASKS:
                continue
            self.asks += 1
            hit = self.readmit(self.full + generated[:t])
            if hit:
                self.position, self.restored = t, hit
                return True
        return False

    def _voted(self, generated: list, t: int, top: list) -> bool:
        """Whether the drafter's vote (if any) lets the hesitation at output position t escalate:
        between the emitted token and the best other of the verifier's top two."""
        if self.vote is None:
            return True
        emitted = generated[t]
        other = top[1][0] if top[0][0] == emitted else top[0][0]
        score = self.vote(self.full + generated[:t], self.compressed + generated[:t], emitted, other)
        self.votes.append((t, score))
        return score > self.vote_min

    def _removed_call(self) -> bool:
        """A compressed tool output spells out a tool call: the full view would hand it to the
        verifier (injection), so no escalation (checked once per pass)."""
        if self._call_seen is None:
            self._call_seen = any(s.role == "tool" and not s.same and has_call_format(self.views.original_text(i))
                                  for i, s in enumerate(self.views.message_spans()))
        return self._call_seen

    def _safe(self, positions: list) -> list:
        """`positions` outside tool outputs that spell out a tool call (injection: module docstring)."""
        spans = self.views.message_spans()
        bad = [s.full for i, s in enumerate(spans)
               if s.role == "tool" and has_call_format(self.views.original_text(i))]
        return [p for p in positions if not any(a <= p < b for a, b in bad)]

    def _restored(self, positions: list) -> tuple:
        """(the first restored output's start in the compressed view or None, the tokens the
        view grows by) for a restore of the compressed tool outputs holding `positions`."""
        first, extra = None, 0
        for span in self.views.message_spans():
            if span.role == "tool" and not span.same and any(span.full[0] <= p < span.full[1] for p in positions):
                first = span.compressed[0] if first is None else first
                extra += (span.full[1] - span.full[0]) - (span.compressed[1] - span.compressed[0])
        return first, extra

    def cost(self, positions: list) -> int:
        """Verifier tokens a restore of the compressed tool outputs holding `positions` would
        prefill: from the first of them to the end of the view, with those outputs whole."""
        first, extra = self._restored(positions)
        return 0 if first is None else len(self.compressed) - first + extra

    def _latest(self, positions: list) -> list:
        """The positions inside the latest still-compressed tool output that holds any."""
        out = []
        for span in self.views.message_spans():
            inside = [p for p in positions if span.full[0] <= p < span.full[1]]
            if inside and span.role == "tool" and not span.same:
                out = inside
        return out


def recall_loop(views, full_ids: list, compressed_ids: list, decode: Callable, *,
                evidence: str = "copy", min_len: int = 3, scope: str = "all", max_tokens: int = 0,
                margin: float = 0.5, limit: int = 0, vote: Callable | None = None,
                vote_min: float = 0.0, readmit: Callable | None = None, escalation: str = "full"):
    """The step's final result after up to `views.config.max_recalls` recalls.

    `decode(compressed_ids, interrupt, full=False)` decodes the step on a verifier view (same full
    view); `interrupt` is a RecallWatch, or None for the last allowed pass; `full=True`: on the
    full view, lossless (after a margin escalation; that pass is the last). `vote`, `vote_min`:
    the drafter's vote on a margin escalation (RecallWatch); the result's StepStats count the
    votes asked (`recall_votes`) and those that let the step go on (`recall_vetoes`)."""
    recalls, before, escalated = 0, None, False
    votes = vetoes = 0  # the drafter's votes asked, and those that let the step go on
    while True:
        watch = RecallWatch(views, full_ids, compressed_ids, evidence=evidence, min_len=min_len,
                            scope=scope, max_tokens=max_tokens, margin=margin, limit=limit,
                            vote=vote, vote_min=vote_min, readmit=readmit, escalation=escalation) \
            if recalls < views.config.max_recalls else None
        result = decode(compressed_ids, watch, full=escalated)
        if watch is not None:
            votes += len(watch.votes)
            vetoes += sum(1 for _, score in watch.votes if score <= vote_min)
        result.stats.recall_votes, result.stats.recall_vetoes = votes, vetoes
        if before is not None:
            s = result.stats
            s.recalls = before.recalls + 1
            s.recall_prefill_tokens = before.recall_prefill_tokens + s.verifier_prefill_tokens
            s.ttft_s += before.wall_s
            for name in _SUMMED:
                setattr(s, name, getattr(s, name) + getattr(before, name))
        if watch is None or watch.position is None:
            return result
        recalls, before = recalls + 1, result.stats
        if watch.escalate:  # margin: the step again on the full view (mode spec: full's output)
            escalated = True
            recalls = views.config.max_recalls
        compressed_ids = views.compressed_ids()
