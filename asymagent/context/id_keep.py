"""Identifier keep: the rows of a tool output's elided middle that later turns are likely to copy.

Query-aware keep (context/query_keep.py) brings back the middle's rows that share rare words with
the turns *before* an output. An agent often needs a row of an output later, for a reason no
earlier turn states: the next ticket of a listing it walks in order, the next directory, the
record a later tool result points to. Those rows are the ones that carry *identifiers* — ids,
codes, paths, e-mail addresses — which later calls copy token by token; prose rows (a thread's
messages, a handbook's filler) are rarely copied. Measured on a tickets test step (seed 100005,
its third turn): the 170-token listing "Open tickets, page 1 of 2" was cut to its first 64 and last
32 tokens, the third ticket's id was in the cut middle, and mode asym read the next ticket from
the visible rows while mode full took the right one.

- identifiers: runs of letters, digits and `_-./@:` (query_keep's words, case kept) of at least
  four characters that hold a digit and a letter (`TCK-3335`, `ORD-22114`, `v2.1`), or a `/`
  between word characters (`/srv/exports/finance`), or an `@` (an e-mail address); pure numbers
  and dates are not identifiers (every row of a table has some);
- a unit (query_keep's: a line, or a top-level `{...}` object of a long JSON line) is a candidate
  when it holds an identifier that neither the kept head and tail nor an already kept row shows;
  candidates are taken by density (new identifiers per token of budget, so a listing's short rows
  come before a long paragraph that mentions one code) and, at equal density, in order, while
  they fit the budget;
- a unit in a tool-call format is never kept (`query_keep.has_call_format`: injection).

A pure function of the output's text and the budget, decided when the output enters the history:
the view stays append-stable.
"""

from __future__ import annotations

import re

from asymagent.context.query_keep import has_call_format, split_units

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-./@:]*")
_LETTER = re.compile(r"[A-Za-z]")
_DIGIT = re.compile(r"[0-9]")
_PATH = re.compile(r"\w/\w")
MIN_LENGTH = 4  # shorter codes ("P1", "v2") are too common to tell rows apart


def identifiers(text: str) -> set:
    """The identifiers of `text` (module docstring), stripped of trailing punctuation."""
    out = set()
    for w in _WORD.findall(text):
        w = w.rstrip("-./@:_")
        if len(w) < MIN_LENGTH:
            continue
        if (_LETTER.search(w) and _DIGIT.search(w)) or _PATH.search(w) or "@" in w:
            out.add(w)
    return out


def select(middle: str, budget: int, count, *, seen: set = frozenset(), taken: list = (),
           split=split_units) -> list:
    """Spans of `middle` to keep for their identifiers, in order.

    middle: the elided text;  budget: tokens to spend;  count(text) -> tokens;  seen: identifiers
    already visible (the kept head and tail);  taken: spans of `middle` already kept (by query
    keep: their identifiers count as seen, and they are not taken again);  split(text) -> units
    (`split_units`, or context/units.py's blocks: `CompressionConfig.keep_unit`).
    """
    if budget <= 0 or not middle.strip():
        return []
    units = split(middle)
    shown = set(seen)
    for s, e in taken:
        shown |= identifiers(middle[s:e])
    already = set(taken)
    candidates = []
    for i, (s, e) in enumerate(units):
        if (s, e) in already:
            continue
        text = middle[s:e]
        new = identifiers(text) - shown
        if not new or has_call_format(text):
            continue
        cost = count(text.strip()) + 1  # + the newline that separates it
        candidates.append((-len(new) / cost, i, cost, new))
    kept, left = [], budget
    for _, i, cost, new in sorted(candidates, key=lambda c: (c[0], c[1])):
        if cost > left:
            continue
        if not new - shown:  # every identifier it holds came in with a row kept before it
            continue
        kept.append(i)
        shown |= new
        left -= cost
    return [units[i] for i in sorted(kept)]
