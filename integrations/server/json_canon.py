"""Canonical JSON, incrementally: the prefix of `json.dumps(json.loads(value), ensure_ascii=False)` that a partial value's text already fixes.

The output parser serialises a call's arguments that way (asymagent/chat/output_parsing.py), so
a streamed call's `function.arguments` fragments must add up to exactly that string, whatever
whitespace, escapes or number forms the model wrote (the reference pair pretty-prints its calls).
`canonical_prefix(raw)` walks the partial text: whitespace outside strings is dropped, `:` and
`,` become `": "` and `", "` (json.dumps' separators), each string character is written as
json.dumps writes it (`\\u00e9` -> `é`, `\\/` -> `/`), and a number or literal (`1.50`, `1e2`,
`true`) is written once it has ended, as json.dumps writes its value (`1.5`, `100.0`). It stops
before anything not yet fixed: an unfinished escape, a high surrogate waiting for its pair, an
unfinished number, or text that is no JSON (the call is then the parser's to judge). Known gap:
an object with a duplicate key (json.loads keeps the last one) streams both.
"""

from __future__ import annotations

import json

_SEPARATORS = {":": ": ", ",": ", "}
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
                   "t": "\t"}
_BARE = set("0123456789+-.eEtrufalsnINfiy")  # numbers, true/false/null, NaN/Infinity


def _char(ch: str) -> str:
    """One string character as json.dumps(ensure_ascii=False) writes it inside quotes."""
    return json.dumps(ch, ensure_ascii=False)[1:-1]


def _string(raw: str, pos: int) -> tuple[str, int, bool]:
    """(canonical text, position after it, closed) for the string whose opening quote is at
    `pos`; stops before what is not fixed yet."""
    out, i = ['"'], pos + 1
    while i < len(raw):
        ch = raw[i]
        if ch == '"':
            out.append('"')
            return "".join(out), i + 1, True
        if ch < " ":  # a raw control character: no JSON (json.loads refuses it)
            return "".join(out), i, False
        if ch != "\\":
            out.append(_char(ch))
            i += 1
            continue
        if i + 1 >= len(raw):
            break
        esc = raw[i + 1]
        if esc in _SIMPLE_ESCAPES:
            out.append(_char(_SIMPLE_ESCAPES[esc]))
            i += 2
            continue
        if esc != "u" or i + 6 > len(raw):
            break
        try:
            code = int(raw[i + 2:i + 6], 16)
        except ValueError:
            break
        if 0xD800 <= code < 0xDC00:  # a high surrogate: json.loads pairs it with a low one
            if i + 12 > len(raw):
                break
            if raw[i + 6:i + 8] == "\\u":
                try:
                    low = int(raw[i + 8:i + 12], 16)
                except ValueError:
                    break
                if 0xDC00 <= low < 0xE000:
                    out.append(_char(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))))
                    i += 12
                    continue
        out.append(_char(chr(code)))
        i += 6
    return "".join(out), i, False


def canonical_prefix(raw: str) -> str:
    """The text of json.dumps(json.loads(v), ensure_ascii=False) that every completion `v` of
    the partial JSON value text `raw` starts with (module docstring)."""
    out, i = [], 0
    while i < len(raw):
        ch = raw[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in "{}[]":
            out.append(ch)
            i += 1
        elif ch in _SEPARATORS:
            out.append(_SEPARATORS[ch])
            i += 1
        elif ch == '"':
            text, i, closed = _string(raw, i)
            out.append(text)
            if not closed:
                break
        elif ch in _BARE:
            end = i
            while end < len(raw) and raw[end] in _BARE:
                end += 1
            if end == len(raw):
                break  # it may go on
            try:
                out.append(json.dumps(json.loads(raw[i:end])))
            except ValueError:
                break
            i = end
        else:
            break
    return "".join(out)
