"""The values an oracle's answer holds, and whether another answer carries every one of them.

A final answer is graded by the facts it states, not by its wording. The facts are derived from
the episode, with no rule that names a suite, a table or a field:

- every word of the oracle's answer that holds a digit (ids, counts, amounts, dates, times);
- every other word of the oracle's answer that the environment supplied: it occurs in a tool
  output of the episode, is not a stopword, and is not a word of the request (system prompt,
  user turns, tool schemas; compared by a crude stem, so "closed" matches the request's
  "close"). Names, places, statuses, teams the answer copies from the tools count this way;
  template words ("done", "complete") and words the question itself gave do not.

A candidate answer carries a value when one of its words equals it, case-insensitively, with
edge punctuation stripped and thousands separators removed ("1,234.50" carries "1234.50").
Words are whole tokens: "5" is not carried by "15", "Cebu" not by "Cebuano" (a number may carry
a unit of up to three letters glued on: "39.72kg").
"""

from __future__ import annotations

import json
import re

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing done down during each few for from further
had has have having he her here hers him his how i if in into is it its itself just me more most my
no nor not now of off on once one only or other our out over own same she should so some such than
that the their them then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yes ok okay please thanks
""".split())

_TOKEN = re.compile(r"[\w.:/@+-]+")
_EDGE = ".:/-+@_"


def words(text: str | None) -> list[str]:
    """The canonical words of `text`: lowercased tokens, edge punctuation stripped (a number's
    sign kept), thousands separators inside numbers removed."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text or "")
    out = []
    for tok in _TOKEN.findall(text.lower()):
        tok = tok.rstrip(_EDGE)
        if not (tok[:1] in "-+" and tok[1:2].isdigit()):  # a number keeps its sign
            tok = tok.lstrip(_EDGE)
        if tok:
            out.append(tok)
    return out


def stem(word: str) -> str:
    """A crude English stem ("closed", "closes", "closing" -> "clos"), for comparing with the request."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def _request_stems(request_texts: list) -> set:
    out = set()
    for text in request_texts:
        for w in words(text):
            out.add(stem(w))
            out.update(stem(p) for p in re.split(r"[^a-z]+", w) if p)
    return out


def answer_values(answer: str, request_texts: list, output_texts: list) -> list[str]:
    """The values `answer` holds (see the module docstring), in order, without repeats."""
    request = _request_stems(request_texts)
    supplied = {w for text in output_texts for w in words(text)}
    out: list[str] = []
    for w in words(answer):
        if w in out:
            continue
        if any(c.isdigit() for c in w):
            out.append(w)
        elif w in supplied and w not in STOPWORDS and len(w) > 1 and stem(w) not in request:
            out.append(w)
    return out


def carries_values(text: str | None, values: list) -> bool:
    """Does `text` state every one of `values` (as whole words, see `words`)? A number may carry
    a short unit glued to it ("39.72kg" carries "39.72")."""
    have = set(words(text))
    return all(v in have or (v[-1].isdigit() and any(
        t.startswith(v) and t[len(v):].isalpha() and len(t) - len(v) <= 3 for t in have)) for v in values)


def history_parts(history: list, tools: list | None = None) -> tuple[list, list]:
    """(request texts, tool output texts) of an OpenAI-format history: the system and user turns
    plus the tool schemas, and every tool message's content."""
    request, outputs = [], []
    for m in history:
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if m.get("role") in ("system", "user"):
            request.append(content or "")
        elif m.get("role") == "tool":
            outputs.append(content or "")
    if tools:
        request.append(json.dumps(tools))
    return request, outputs


def answer_ok(expected: str, text: str | None, history: list, tools: list | None = None) -> bool:
    """Is `text` a right final answer where the oracle answered `expected` after `history`? It
    must carry every value of `expected`; an expected answer with no value at all is matched by
    its content words outside the request (and, failing those, by any non-empty text)."""
    if not (text or "").strip():
        return False
    request, outputs = history_parts(history, tools)
    values = answer_values(expected, request, outputs)
    if not values:
        stems = _request_stems(request)
        values = [w for w in dict.fromkeys(words(expected))
                  if w not in STOPWORDS and len(w) > 1 and stem(w) not in stems]
    return carries_values(text, values)
