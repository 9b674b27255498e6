"""Call wrappers: the tags and code fences a model puts around or beside a tool call, which are no answer content.

On the reference pair (Qwen2.5-Coder-1.5B under tool_choice "auto", 2026-12-07) the model wraps
its call in a tag of its own choosing, `<json>\\n{...call...}\\n</json>`; once the call is taken
out, `<json>\\n\\n</json>` is left. Such wrappers are removed where a call was taken
(asymagent/chat/output_parsing.py), and the streamer never sends them
(integrations/server/deltas.py), with the same rules:
- before a call: a trailing run of whitespace (kept in front of the first wrapper: the line
  break between text and call stays, as without a wrapper), empty tag pairs (`<x>` then only
  whitespace then `</x>`), opening tags (`<x>`, `<x attr="...">`) and code-fence openers ("```json"; a fence
  that would close an open code block is kept);
- after a call: a leading run of whitespace, empty tag pairs, closing tags (`</x>`) and closing
  fences ("```" not followed by a language);
- a message that holds nothing but such a run (e.g. `<json>\\n\\n</json>`, an empty fence) has no
  content at all.
A closing tag before a call (`<b>42</b>`) or an opening one after it is content, and so is an
empty tag pair in the middle of the text, away from any call.
"""

from __future__ import annotations

import re

_NAME = r"[A-Za-z][\w:.-]*"
_OPEN = rf"<{_NAME}(?:\s[^<>\n]*)?>"
_EMPTY_PAIR = rf"<({_NAME})(?:\s[^<>\n]*)?>\s*</\1\s*>"
_FENCE_OPEN = r"```[\w+.-]*"
_EMPTY_FENCE = r"```[\w+.-]*\s*```"
# one element of a run before a call, matched at the end of the text
_BEFORE = re.compile(rf"(?:\s+|{_EMPTY_PAIR}|{_EMPTY_FENCE}|{_OPEN}|{_FENCE_OPEN})\Z")
# one element of a run after a call, matched at the start of the text
_AFTER = re.compile(rf"\A(?:\s+|{_EMPTY_PAIR}|{_EMPTY_FENCE}|</{_NAME}\s*>|```(?![\w+.-]))")
# what may still grow into an element of a run before a call (streaming): `<`, `<js`,
# `<json attr`, `</`, `</js`, a backtick or two
_PARTIAL = re.compile(rf"(?:<(?:{_NAME}(?:\s[^<>\n]*)?)?|</[\w:.-]*|`{{1,2}})\Z")


WINDOW = 512  # the streamer looks for a run in the text's last WINDOW characters (longer: sent)


def _opens_a_block(text: str, at: int, fences_before: int = 0) -> bool:
    """True when the fence at `at` opens a code block: an even number of fences before it."""
    return (fences_before + text.count("```", 0, at)) % 2 == 0


def run_before_call(text: str, fences_before: int = 0) -> int:
    """Where the trailing run of wrappers of `text` starts (len(text): there is none);
    `fences_before`: the code fences in text that came before `text`."""
    end, start = len(text), 0
    while end:
        m = _BEFORE.search(text, start, end)
        if m is None or m.start() == end:
            break
        if m.group(0).startswith("```") and not _opens_a_block(text, m.start(), fences_before):
            start = m.start() + 1  # it closes a code block: content (a shorter match may not)
            continue
        end, start = m.start(), 0
    return end


def run_after_call(text: str) -> int:
    """Where the leading run of wrappers of `text` ends (0: there is none)."""
    pos = 0
    while pos < len(text):
        m = _AFTER.match(text[pos:])
        if m is None or not m.group(0):
            break
        pos += m.end()
    return pos


def _trim_before(text: str) -> str:
    """`text` without the wrappers of its trailing run; the run's leading whitespace stays (the
    line break between the text and the call, as without a wrapper)."""
    cut = run_before_call(text)
    rest = text[cut:]
    return text[: cut + len(rest) - len(rest.lstrip())] if rest.strip() else text


def _trim_after(text: str) -> str:
    """`text` without the wrappers of its leading run; the run's trailing whitespace stays."""
    cut = run_after_call(text)
    head = text[:cut]
    return text[len(head.rstrip()):] if head.strip() else text


def held_while_streaming(text: str) -> int:
    """Where the suffix of streamed `text` that may yet be a wrapper before a call starts: a
    run before a call, possibly ending in a partial tag or fence (len(text): none). Only the
    last WINDOW characters are looked at (each push reads them: linear in the answer)."""
    base = max(0, len(text) - WINDOW)
    tail, fences = text[base:], text.count("```", 0, base)
    partial = _PARTIAL.search(tail)
    whole = run_before_call(tail, fences)  # "```" is an opener whole, and "``" + "`" a partial
    if partial is not None:
        whole = min(whole, run_before_call(tail[: partial.start()], fences))
    return base + whole


def only_wrappers(text: str) -> bool:
    """True when `text` holds nothing but wrappers (or nothing at all)."""
    return run_before_call(text) == 0 or run_after_call(text) == len(text)


def join_around_calls(segments: list[str]) -> str:
    """The content of a message whose text around its calls is `segments` (one more than the
    calls): each call's wrappers taken off both sides; a message of wrappers only is empty."""
    pieces = list(segments)
    for i in range(len(pieces) - 1):
        pieces[i] = _trim_before(pieces[i])
        pieces[i + 1] = _trim_after(pieces[i + 1])
    text = "".join(pieces)
    return "" if only_wrappers(text) else text
