"""Attention keep: the rows of the history the verifier's view keeps, chosen by where the drafter looks.

The drafter reads the full view anyway (its cache grows by the appended block each step). While
it prefills a step's last rows (the generation prompt and the end of the newest message,
asymagent/chat/session.py `drafter_attention_fn`), the attention those rows give every earlier
position is captured (asymagent/kv/attention.py `AttentionCapture`: max over heads, mean over the
rows and the layers): the idea of Speculative Prefill, where a small model's attention picks the
prompt tokens a large one keeps. This module turns those per-token scores into rows to keep:

- a row (a unit of `CompressionConfig.keep_unit`: by default `query_keep.split_units`, a line or a
  JSON object of a long line; context/units.py's blocks with "block") scores the
  largest attention any of its tokens gets (a row the step reads hard at one token, the name in
  a `component -> team` line, is one it needs; a mean would drown it in the row's other tokens);
- **at entry** (`select`): a tool output cut by `tool_output` keeps, besides its head, tail and
  the query/identifier rows, the best-scored rows of its middle within `attention_keep_tokens`;
  decided once, when the output enters the history, so the view stays append-stable;
- **re-admission** (`readmit`): at every later step the same scores reach the rows earlier
  outputs had cut; a cut row the step's rows read at `readmit_ratio` times the uniform share
  (1 / positions) or more is brought back, best first within `readmit_tokens`, as a marked block
  at the end of the newest message (`render_block`): that message has not been prefilled by the
  verifier yet, so its cache keeps every earlier token (docs/architecture.md, "Attention keep").
- a row that spells out a tool call (`query_keep.has_call_format`) is never kept or brought back
  (an injected call would reach the verifier; the rule the other keeps follow).

Scores are (char start, char end, score) triples over a message's original content; nothing here
names a suite, a field or a word: the drafter's reading is the only signal.
"""

from __future__ import annotations

from asymagent.context.query_keep import has_call_format, split_units

READMIT_HEADER = "[earlier output, brought back]"


def row_scores(text: str, scores: list, offset: int = 0, split=split_units) -> list:
    """[(start, end, score)] for the units of `text`: each unit's largest token score, where
    `scores` holds (start, end, score) over the text the units sit in at `offset`; split(text) ->
    units (`split_units`, or context/units.py's blocks: `CompressionConfig.keep_unit`)."""
    out = []
    for s, e in split(text):
        inside = [v for a, b, v in scores if a >= s + offset and b <= e + offset and b > a]
        if inside:
            out.append((s, e, max(inside)))
    return out


def select(middle: str, offset: int, scores: list, budget: int, count, *, taken: list = (),
           split=split_units) -> list:
    """Spans of `middle` to keep for the drafter's attention, in order.

    middle: the elided text, at `offset` in the content the `scores` (start, end, score) cover;
    budget: tokens to spend; count(text) -> tokens; taken: spans already kept (not taken again);
    split: the units (`row_scores`).
    """
    if budget <= 0 or not scores or not middle.strip():
        return []
    already = set(taken)
    ranked = sorted(((-v, s, e) for s, e, v in row_scores(middle, scores, offset, split)
                     if (s, e) not in already and not has_call_format(middle[s:e])))
    kept, left = [], budget
    for _, s, e in ranked:
        cost = count(middle[s:e].strip()) + 1  # + the newline that separates it
        if cost <= left:
            kept.append((s, e))
            left -= cost
    return sorted(kept)


def cut_rows(original: str, compressed: str, split=split_units) -> list:
    """[(start, end)] units (`split`) of `original` the compressed text does not show."""
    return [(s, e) for s, e in split(original) if original[s:e].strip() not in compressed]


def readmit(candidates: list, positions: int, ratio: float, budget: int, count) -> list:
    """The cut rows to bring back, best first.

    candidates: [(score, key, text)] every cut row of the earlier outputs with its largest token
    score this step (key: anything that names the row, e.g. (message index, start));
    positions: the full view's length (1 / positions is the uniform share a row's score is
    compared with); ratio: the multiple of it a row needs; budget: tokens to spend."""
    if budget <= 0 or positions <= 0:
        return []
    floor = ratio / positions
    kept, left = [], budget
    for score, key, text in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if score < floor:
            break
        if has_call_format(text):
            continue
        cost = count(text.strip()) + 1
        if cost <= left:
            kept.append((score, key, text))
            left -= cost
    return kept


def render_block(rows: list) -> str:
    """The marked block appended to the newest message: the rows in their history order."""
    return "\n" + READMIT_HEADER + "\n" + "\n".join(text.strip() for text in rows)
