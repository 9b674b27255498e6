"""Query-aware keep: which rows of a tool output's elided middle the current task needs.

When `tool_output` cuts a long output to its head and tail, the middle often holds exactly the
row the next turns copy: the record whose id the user named, the line that answers the request.
The recent user and assistant turns (the task, the tool calls and their arguments) say what that
is. This module scores the middle's *units* (lines; top-level `{...}` objects of long JSON lines)
by the rare words they share with those turns and keeps the best within a token budget:

- words: runs of letters, digits and `_-./@:` (ids, paths, names, keys, numbers), lowercased,
  plus their `-_/.`-separated parts; words under 3 characters and common English words are
  ignored;
- a word's weight is its inverse document frequency over the output's units,
  log(1 + N / df); a unit's score is the sum over the query words it contains;
- a unit is a candidate only if it holds a query word that at most a quarter of the units (or
  two, in a short output) contain: a word every row has tells no row apart;
- candidates are kept best first (ties: earlier first) while they fit the budget; "best" is the
  score (`rank="score"`) or the score per token of budget the unit costs (`rank="per_token"`:
  value per token, the greedy knapsack rule, so a short row holding the id beats a long filler
  paragraph that shares a few topic words); kept units are rendered in their original order
  with omission markers between them;
- a unit that holds text in a tool-call format (`"name": ..., "arguments":` as the chat format
  writes calls, or a `<tool_call>` tag) is never kept: a tool output that spells out a call is
  an injection pattern, and bringing it back would hand the verifier a call to copy
  (evals/suites/suite_injection_call.py measures this).

The selection is a pure function of (output text, query texts, budget, counter), decided when
the output enters the history, so the compressed view stays append-stable.
"""

from __future__ import annotations

import math
import re

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-./@:]*")
_PARTS = re.compile(r"[-_/.@:]+")
_STOP = frozenset("""
the and for are was were with that this from have has had not but you your can will all any
its into than then them they their there these those what when where which while who whom why
how our out off over under again also just only such very more most some each few other own
same both too nor may might must shall should would could does did doing done been being
here per via use used using one two three get set now new let see yes true false null none
""".split())
MARKER_TOKENS = 12  # about what `[... N tokens omitted ...]` and its newlines cost
RARE_SHARE = 0.25  # a candidate must hold a query word that at most this share of the units contain
_CALL_FORMAT = re.compile(r'"name"\s*:\s*"[^"]*"\s*,\s*"(arguments|parameters)"\s*:|<tool_call>|</tool_call>')


def has_call_format(text: str) -> bool:
    """True when `text` spells out a tool call in the chat format (`"name": ..., "arguments":`
    or a `<tool_call>` tag): never brought back into the verifier's view (module docstring)."""
    return bool(_CALL_FORMAT.search(text))


def words(text: str) -> set:
    """The comparable words of `text` (see the module docstring)."""
    out = set()
    for w in _WORD.findall(text):
        w = w.strip("-./@:_").lower()
        for part in [w] + [p for p in _PARTS.split(w) if p != w]:
            if len(part) >= 3 and part not in _STOP:
                out.add(part)
    return out


def split_units(text: str, long_line: int = 400) -> list:
    """[(start, end)] character spans of `text`'s units: lines, and in lines longer than
    `long_line` characters the pieces between top-level `},` boundaries (JSON objects in a list)."""
    spans, pos = [], 0
    for line in text.splitlines(keepends=True):
        end = pos + len(line)
        if len(line) > long_line:
            start = pos
            for m in re.finditer(r"\}\s*,\s*(?=\{)", line):
                cut = pos + m.end()
                spans.append((start, cut))
                start = cut
            spans.append((start, end))
        else:
            spans.append((pos, end))
        pos = end
    return [(s, e) for s, e in spans if text[s:e].strip()]


RANKS = ("score", "per_token")


def select(middle: str, query: set, budget: int, count, *, context: str = "", rank: str = "score",
           split=split_units) -> list:
    """Spans of `middle` to keep, in order.

    middle:  the elided text;  query: `words` of the recent turns;  budget: tokens to spend;
    count(text) -> tokens;  context: the whole output (document frequencies are counted over
    its units, so rows in the kept head and tail count too);  rank: "score" or "per_token"
    (the order candidates are taken in, module docstring);  split(text) -> [(start, end)] units
    (`split_units`, or context/units.py's block units: `CompressionConfig.keep_unit`).
    """
    if rank not in RANKS:
        raise ValueError(f"query_keep rank must be one of {RANKS}, got {rank!r}")
    if budget <= 0 or not query or not middle.strip():
        return []
    units = split(middle)
    unit_words = [words(middle[s:e]) for s, e in units]
    all_units = [words(context[s:e]) for s, e in split(context)] if context else unit_words
    n = max(len(all_units), 1)
    df: dict = {}
    for ws in all_units:
        for w in ws & query:
            df[w] = df.get(w, 0) + 1
    rare_max = max(2, int(RARE_SHARE * n))
    scored = []
    for i, ws in enumerate(unit_words):
        if _CALL_FORMAT.search(middle[units[i][0]:units[i][1]]):
            continue  # never bring back a tool call spelled out in an output (module docstring)
        hits = ws & query
        if not any(df.get(w, 1) <= rare_max for w in hits):
            continue
        score = sum(math.log(1.0 + n / df.get(w, 1)) for w in hits)
        cost = count(middle[units[i][0]:units[i][1]].strip()) + 1  # + the newline that separates it
        scored.append((-(score / cost if rank == "per_token" else score), i, cost))
    kept, left = [], budget
    for _, i, cost in sorted(scored):
        if cost <= left:
            kept.append(i)
            left -= cost
    return [units[i] for i in sorted(kept)]


def render(head: str, middle: str, tail: str, spans: list, count, *, min_gap: int = 0) -> str:
    """head, the kept spans of `middle` and tail, with `[... N tokens omitted ...]` for each gap
    (a gap shorter than a marker, between kept text, is kept as it is; so is any gap, the one
    before the tail too, of fewer than `min_gap` tokens; never a gap that spells out a tool
    call, `has_call_format`)."""
    out, pos = head, 0
    for s, e in list(spans) + [(len(middle), len(middle))]:
        gap = middle[pos:s]
        last = s == len(middle)
        if gap.strip():
            n = count(gap)
            if ((n <= MARKER_TOKENS and not last) or n < min_gap) and not has_call_format(gap):
                out += gap  # cheaper than a marker
            else:
                out = out.rstrip("\n") + f"\n[... {n} tokens omitted ...]\n"
        elif not out.endswith("\n"):
            out += gap
        out += middle[s:e]
        pos = e
    return out + tail


QUERY_TURNS = 4  # assistant messages (calls and their arguments) read besides the latest user message


def query_text(message: dict) -> str:
    """The text of one user/assistant message that a query reads: its content, and for each
    tool call the function name and the arguments (not the call's JSON wrapper)."""
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = [content if isinstance(content, str) else ""]
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            out += [str(fn.get("name") or ""), args if isinstance(args, str) else repr(args)]
    return "\n".join(out)


def recent_query(messages: list) -> frozenset:
    """`words` of the latest user message and the last QUERY_TURNS assistant messages of
    `messages` (OpenAI-style, oldest first): what the turn that reads the next output is about."""
    texts, assistants, user = [], 0, False
    for m in reversed(messages):
        role = m.get("role")
        if role == "assistant" and assistants < QUERY_TURNS:
            texts.append(query_text(m))
            assistants += 1
        elif role == "user" and not user:
            texts.append(query_text(m))
            user = True
        if user and assistants >= QUERY_TURNS:
            break
    return frozenset(words("\n".join(texts)))
