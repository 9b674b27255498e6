"""Doubled-brace calls: `{{"name": ..., "arguments": {...}}}`, the call form Qwen2.5's template shows, in the spellings its models copy.

Qwen2.5's chat template (Hermes style) prints the call format in its tool instructions as a Jinja
string escaped as if for str.format: `{{"name": <function-name>, "arguments": <args-json-object>}}`.
The reference pair (Qwen2.5-Coder-1.5B, `serve --pair`, 2026-12-07) copies the doubled braces and
varies the key's spelling: `{{'name': 'get_weather', 'arguments': {'city': 'Paris'}}}`,
`<{{name": "get_weather", ...}}}>`, `{{name: "get_weather", ...}}}`. Refusing those spellings in the
grammar only moved the model to another one (branch fix57b, measured: with `{{name:` refused it wrote
`{{name="get_weather", arguments={"city":"Paris"}}}`), so the call is read where the model starts it:
- TRIGGERS: `{{`, an optional space, the name key in one of KEY_SPELLINGS, then `:` (or `=` after a
  bare `name`, the keyword-argument spelling). The colon is part of the trigger so a template expression in an answer (Jinja `{{ name }}`, `{{name}}`) stays
  free text. A `<` before `{{` (the pair's `<{{name"`) is free text to the grammar and belongs to
  the call for the parser and the streamer.
- call_head(trigger, name): what the grammar forces after a trigger, up to the arguments, in the
  spelling the trigger started (`{{'name': 'get_weather', 'arguments': `); the arguments are
  then compact JSON under the tool's schema, closed by CLOSINGS.
- read_doubled(text, start): the parser's and the streamer's reading of such a call (any of the
  spellings, any whitespace, `"arguments"` or `"parameters"`, both closing braces), so what the
  grammar holds parses back to exactly one call. (xgrammar dispatches on the longest trigger:
  `{{"name":` never becomes free `{` + a single-brace call, so a turn cannot end after one `}`.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# how the name key is spelled after `{{`: JSON, Python-dict quotes, bare, and the pair's `name"`
KEY_SPELLINGS = ('"name"', "'name'", "name", 'name"')
SPACES = ("", " ")  # between `{{` and the key
TRIGGERS = tuple("{{" + space + key + sep for space in SPACES for key in KEY_SPELLINGS
                 for sep in (":", "=") if sep == ":" or key == "name")
CLOSINGS = ("}}", " }}")  # after the compact arguments
# the head of a doubled call as read back (any spelling and whitespace); group 1: a leading `<`
HEAD = re.compile(r"""(<?)\{\{\s*(?:["']?name["']?\s*:|name\s*=)\s*("(?:[^"\\\n]|\\.)*"|'[^'\\\n]*')"""
                  r"""\s*,\s*(?:["']?(?:arguments|parameters)["']?\s*:|(?:arguments|parameters)\s*=)\s*""")
# where a doubled call may start, as the streamer looks for it: `<{{name":`, `{{ 'name':` ...
SIGN = re.compile(r"""<?\{\{\s*(?:["']?name["']?\s*:|name\s*=)""")
# what may still grow into a SIGN at the end of streamed text: `{`, `<{{`, `{{ 'nam` ...
_PARTIAL_SIGN = re.compile(r"""<?(?:\{(?:\{[ \t]*(?:["']?(?:n(?:a(?:m(?:e(?:["']?[ \t]*)?)?)?)?)?)?)?)?\Z""")
PARTIAL_WINDOW = 32  # the streamer looks for a partial sign in the text's last characters only
_DECODER = json.JSONDecoder()


@dataclass
class DoubledCall:
    """A doubled call read from text: its object (name, arguments) and its span [start, end)."""

    obj: dict
    start: int
    end: int


def call_head(trigger: str, name: str) -> str:
    """The call's text from `trigger` (one of TRIGGERS) up to its arguments, in its spelling."""
    key, sep = trigger[2:-1].strip(), trigger[-1]
    if sep == "=":  # keyword arguments: `{{name="get_weather", arguments=`
        return trigger + json.dumps(name, ensure_ascii=False) + ", arguments="
    if key == "'name'" and "'" not in name and "\\" not in name:
        quoted, args_key = "'" + name + "'", "'arguments'"
    else:
        quoted = json.dumps(name, ensure_ascii=False)
        args_key = "arguments" if key == "name" else '"arguments"'
    return trigger + " " + quoted + ", " + args_key + ": "


def partial_sign(text: str) -> int:
    """Where the suffix of streamed `text` that may yet grow into a SIGN starts (len(text): none)."""
    base = max(0, len(text) - PARTIAL_WINDOW)
    m = _PARTIAL_SIGN.search(text, base)
    return m.start() if m is not None else len(text)


def name_of(literal: str) -> str | None:
    """The tool name a head's name literal (`"x"` JSON, `'x'` Python) spells, None if broken."""
    if literal.startswith("'"):
        return literal[1:-1]
    try:
        return json.loads(literal)
    except json.JSONDecodeError:
        return None


def read_doubled(text: str, start: int) -> DoubledCall | None:
    """The doubled call whose head starts at `start` (HEAD), else None: a string name, a JSON
    value for the arguments, then `}}` (and `>` after a leading `<`)."""
    m = HEAD.match(text, start)
    if m is None:
        return None
    name = name_of(m.group(2))
    try:
        args, end = _DECODER.raw_decode(text, m.end())
    except json.JSONDecodeError:
        return None
    rest = text[end:]
    close = re.match(r"\s*\}[ \t]*\}", rest)
    if name is None or close is None:
        return None
    end += close.end()
    if m.group(1) and text.startswith(">", end):
        end += 1
    return DoubledCall({"name": name, "arguments": args}, start, end)


def find_doubled(text: str, start: int, stop: int) -> DoubledCall | None:
    """The first doubled call whose head starts in text[start:stop], else None."""
    pos = start
    while True:
        at = text.find("{{", pos, stop)
        if at < 0:
            return None
        begin = at - 1 if at > start and text[at - 1] == "<" else at
        call = read_doubled(text, begin)
        if call is not None:
            return call
        pos = at + 1
