"""Keep units: the pieces of a tool output that the row-level keeps take or leave whole.

Query, identifier and attention keep (query_keep.py, id_keep.py, attention_keep.py) and the
re-admissions (views.py) score and keep *units* of a cut output. `CompressionConfig.keep_unit`
says what a unit is:

- `"line"` (`query_keep.split_units`): a line, and in a long line each top-level `{...}` object
  of a JSON list. A paragraph wrapped over several lines is then several units, and a kept line
  can lose the words that give it meaning (a date row kept, the month on the line before it cut);
- `"block"` (`block_units`): units that follow the text's structure, whole while they cost at
  most `max_tokens` (`keep_unit_max_tokens`), else split into their parts:
  * a *row*: a line and its wrap continuations. Line k+1 continues line k when both are non-blank
    at the same indentation, line k is long but no longer than text is wrapped at (at least
    `WRAP_SHARE` of the text's widest line of at most `MAX_WRAP` characters, that width at least
    `MIN_WRAP`; itself at most `MAX_WRAP`), line k+1 starts no item of its own (a bullet, a
    number, a `key:`, a table bar, a closing bracket), neither line looks like a table row (a tab,
    a `|`, a run of aligned spaces, or both holding the same number, two or more, of `,` or `;`)
    and they do not start with words of one numeric shape (`2024-05-01`, `2024-05-02`: a log's or
    a listing's rows): a wrapped paragraph is one row, a listing's rows stay apart;
  * a *block*: a row and the rows after it indented deeper than it (before the next row at its
    indentation or less), blank lines included: a list item's fields, a key's wrapped value; a
    line of closing brackets joins the block before it;
  * a block over the cap is split into its own row and its children's blocks, each taken by the
    same rule; a row over the cap into its sentences if it is a wrapped paragraph (a sentence:
    up to `.`, `!` or `?` and the space before a capital or a digit; one still over the cap into
    its part of each line), or as `split_units` splits a line if it is one line (a long JSON line
    between its objects).
  Units are spans of the text in order, without overlap; blank-only spans are dropped.

A pure function of the text (and the counter): the view stays append-stable. Nothing here names a
format, a tool or a field; the signals are indentation, line width and item markers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from asymagent.context.query_keep import split_units

KEEP_UNITS = ("line", "block")
WRAP_SHARE = 0.6  # a line at least this share of the widest wrappable line may wrap onto the next
MIN_WRAP = 40  # narrower texts are not treated as wrapped
MAX_WRAP = 120  # a longer line is a line of its own, not text wrapped at a width
_ITEM = re.compile(r"\s*([-*+\u2022]\s|\d{1,3}[.)]\s|#|\||[\]\})]|[A-Za-z_][\w.\-]*( [\w.\-]+){0,2}:(\s|$))")
_CLOSER = re.compile(r"\s*[\]\})]+[,;]?\s*$")
_TABLE = re.compile(r"\t|\||\S {2,}\S")
_SENTENCE_END = re.compile(r"(?<=[.!?])['\")\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


@dataclass
class _Row:
    start: int  # char offset of the row's first line
    end: int  # char offset after its last line (newline included)
    indent: int
    lines: list  # [(start, end)] of its lines
    children: list = field(default_factory=list)  # [_Row] indented deeper, after it


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _same_separators(a: str, b: str) -> bool:
    return any(a.count(c) == b.count(c) >= 2 for c in ",;")


def _shape(line: str) -> str:
    """The first word's character classes (digits 9, letters a, runs collapsed), if it holds a digit."""
    word = line.split(None, 1)[0] if line.strip() else ""
    if not any(c.isdigit() for c in word):
        return ""
    return re.sub(r"(.)\1+", r"\1", re.sub(r"[A-Za-z]", "a", re.sub(r"[0-9]", "9", word)))


def _wraps(prev: str, nxt: str, width: int) -> bool:
    """Whether line `nxt` continues line `prev` (module docstring, a row); `width`: the text's
    widest line of at most MAX_WRAP characters."""
    if not prev.strip() or not nxt.strip() or _indent(prev) != _indent(nxt):
        return False
    n = len(prev.rstrip())
    if width < MIN_WRAP or n < WRAP_SHARE * width or n > MAX_WRAP:
        return False
    if _ITEM.match(nxt) or _TABLE.search(prev.strip()) or _TABLE.search(nxt.strip()):
        return False
    shape = _shape(prev)
    return not _same_separators(prev, nxt) and not (shape and shape == _shape(nxt))


def _rows(text: str) -> list:
    """[_Row] of `text`: lines joined with their wrap continuations (blank lines are no rows)."""
    lines, pos = [], 0
    for line in text.splitlines(keepends=True):
        lines.append((pos, pos + len(line), line.rstrip("\r\n")))
        pos += len(line)
    width = max((len(t.rstrip()) for _, _, t in lines if len(t.rstrip()) <= MAX_WRAP), default=0)
    rows, prev = [], None
    for s, e, t in lines:
        if not t.strip():
            prev = None
            continue
        if prev is not None and _wraps(prev, t, width):
            rows[-1].end = e
            rows[-1].lines.append((s, e))
        else:
            rows.append(_Row(s, e, _indent(t), [(s, e)]))
        prev = t
    return rows


def _tree(rows: list, text: str) -> list:
    """The rows as a forest by indentation: a row's children are the rows after it indented
    deeper; a closing-bracket row joins the innermost open block at its indentation or less."""
    roots, stack = [], []  # stack: the open blocks, outermost first
    for r in rows:
        closer = bool(_CLOSER.match(text[r.start:r.end]))
        while stack and (stack[-1].indent > r.indent if closer else stack[-1].indent >= r.indent):
            stack.pop()
        if closer and (stack or roots):
            (stack[-1] if stack else roots[-1]).children.append(r)
            continue
        (stack[-1].children if stack else roots).append(r)
        stack.append(r)
    return roots


def _end(r: _Row) -> int:
    return max([r.end] + [_end(c) for c in r.children])


def _sentences(text: str, s: int, e: int) -> list:
    """[(start, end)] the sentences of the wrapped row text[s:e], each with the space after it."""
    cuts = [s] + [s + m.end() for m in _SENTENCE_END.finditer(text[s:e])] + [e]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _split_row(r: _Row, text: str, max_tokens: int, count, long_line: int) -> list:
    """A row over the cap: a single line as `split_units` splits it; a wrapped paragraph into its
    sentences, a sentence still over the cap into its lines."""
    if len(r.lines) == 1:
        return [(r.start + a, r.start + b) for a, b in split_units(text[r.start:r.end], long_line)]
    out = []
    for a, b in _sentences(text, r.start, r.end):
        if count(text[a:b].strip()) <= max_tokens:
            out.append((a, b))
            continue
        for s, e in r.lines:  # the sentence's part of each line it crosses
            if max(a, s) < min(b, e):
                out.append((max(a, s), min(b, e)))
    return out


def _emit(r: _Row, text: str, max_tokens: int, count, long_line: int, out: list) -> None:
    """Units of the block rooted at `r` (module docstring): whole, or its row and its children's."""
    end = _end(r)
    if count(text[r.start:end].strip()) <= max_tokens:
        out.append((r.start, end))
        return
    if count(text[r.start:r.end].strip()) <= max_tokens:
        out.append((r.start, r.end))
    else:
        out += _split_row(r, text, max_tokens, count, long_line)
    for c in r.children:
        _emit(c, text, max_tokens, count, long_line, out)


def block_units(text: str, max_tokens: int, count, long_line: int = 400) -> list:
    """[(start, end)] character spans of `text`'s block units (module docstring), in order.

    max_tokens: the most a unit may cost whole;  count(text) -> tokens;  long_line: as in
    `split_units` (a single line longer than this is split between its JSON objects)."""
    out: list = []
    for r in _tree(_rows(text), text):
        _emit(r, text, max_tokens, count, long_line, out)
    return [(s, e) for s, e in out if text[s:e].strip()]


def splitter(unit: str, max_tokens: int, count):
    """text -> [(start, end)] units, for a `CompressionConfig.keep_unit`: `split_units` itself
    for "line" (the keeps' behaviour before units existed), `block_units` for "block"."""
    if unit not in KEEP_UNITS:
        raise ValueError(f"keep_unit must be one of {KEEP_UNITS}, got {unit!r}")
    if unit == "line":
        return split_units
    return lambda text: block_units(text, max_tokens, count)
