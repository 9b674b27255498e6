"""Turns streamed model text into OpenAI `delta` payloads: content, or tool calls as OpenAI sends them.

The model's raw text arrives in pieces (one per decoding round). While it does not look like a
tool call it is streamed as `delta.content`; once it does (it starts with `{` or `<tool_call>`,
or later a `<tool_call>` tag, a line starting with `{` (after tags of its own too: `<json>{`),
or an echo of the tool list `<tools>` appears, or a doubled-brace call's head `{{'name':`, `<{{name":`
anywhere in a line (asymagent/chat/doubled_calls.py): wherever the output parser may read a call or drop
text), calls are streamed as `delta.tool_calls`: every entry has `index`; `id`, `type` and
`function.name` come only in a call's first delta (with `arguments: ""`), then
`function.arguments` string fragments follow: the arguments as the output parser serialises them
(`json.dumps(..., ensure_ascii=False)`, written as the model goes,
integrations/server/json_canon.py), whatever whitespace the model wrote. A
call is recognised by the chat format's shape `{"name": "...", "arguments": <json>}`
(optionally inside `<tool_call>...</tool_call>`), or doubled in braces in any spelling of its keys
(`{{'name': 'x', 'arguments': <json>}}`, a `<` before it and a `>` after it belong to it).

Held back while streaming, released by `finish(result)`: trailing whitespace and any suffix
that could start a stop sequence or a `<tool_call>` tag (so a stop string the engine later
trims is never sent) or a `<tools>` echo or a doubled call's head (a template's `{{ name }}` is sent
once it cannot be one), any run of wrappers a call may yet follow (opening
tags, empty tag pairs, code fences: asymagent/chat/call_wrappers.py, the parser drops them with
the call), and trailing `}` of arguments (they may close the outer object). At the
end the engine's `ChatResult` is authoritative: the rest of `result.text` and of each parsed
call's arguments is sent, and calls never recognised while streaming are sent whole. What was
sent cannot be retracted: if the model starts a call shape and then writes malformed JSON, the
client has already seen that call's name (the engine reports it in `invalid_tool_calls`).
"""

from __future__ import annotations

import json
import re
import uuid

from asymagent.chat.call_wrappers import held_while_streaming
from asymagent.chat.doubled_calls import HEAD as DOUBLED_HEAD
from asymagent.chat.doubled_calls import SIGN as DOUBLED_SIGN
from asymagent.chat.doubled_calls import partial_sign, read_doubled
from asymagent.integrations.server.json_canon import canonical_prefix

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
TOOLS_ECHO = "<tools>"  # the tool list echoed: the parser drops it, so it is never content
_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>\n]*)?>")  # any tag: `<json>`, `</tool_call>`
# a call may start here: a `{` at a line start, after a line's leading tags too (`<json>{"name"`)
_CALL_SIGN = re.compile(r"<tool_call>|<tools>|</tools>|(?:^|\n)[ \t]*(?:<[A-Za-z][\w:.-]*"
                        r"(?:\s[^<>\n]*)?>[ \t]*)*\{|" + DOUBLED_SIGN.pattern)
_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()
SIGN_LOOKBACK = 600  # a call sign's leading tags and whitespace fit in this (linear streaming)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _held_suffix(text: str, needles: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `needles`."""
    best = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:n]):
                best = n
                break
    return best


class _Call:
    def __init__(self, index: int, name: str, args_start: int, closing: str = "}"):
        self.index, self.name, self.args_start = index, name, args_start
        self.closing = closing  # what closes the call after its arguments: "}", "}}" or "}}>"
        self.sent_args = ""
        self.value_end: int | None = None  # absolute end of the arguments JSON once complete


class DeltaStreamer:
    """Feed raw text with `push(text)`; close with `finish(result)`; both return delta dicts."""

    def __init__(self, *, tools_enabled: bool, stop: list[str] | None = None,
                 max_calls: int | None = None, call_id=None):
        self.tools_enabled = tools_enabled
        # call_id(index) -> the id of the call at `index` (the task's, so the streamed id is
        # the one in the engine's result and the trace); a fresh id per call without one
        self.call_id = call_id or (lambda index: new_call_id())
        self.max_calls = max_calls  # parallel_tool_calls=false: 1 (later calls are dropped)
        self.stop = list(stop or [])
        self.text = ""
        self.mode = "undecided" if tools_enabled else "content"
        self.content_sent = ""
        self.content_end = 0  # text[:content_end] is content; tool calls start after it
        self.calls: list[_Call] = []
        self.scan = 0  # where the next call object may start (tools mode)
        self.signs_seen = 0  # the text up to here holds no call sign (content mode)

    # -- streaming ----------------------------------------------------------------------------
    def push(self, piece: str) -> list[dict]:
        self.text += piece
        out: list[dict] = []
        if self.mode == "undecided":
            head = self.text.lstrip()
            if not head or TAG_OPEN.startswith(head):
                return out
            if head.startswith("{") or head.startswith(TAG_OPEN):
                self._enter_tools(len(self.text) - len(head))
            else:
                self.mode = "content"
        if self.mode == "content":
            out += self._content_step()
        if self.mode == "tools":
            out += self._tools_step()
        return out

    def _enter_tools(self, at: int) -> None:
        self.mode = "tools"
        self.content_end = at
        self.scan = at

    def _content_step(self) -> list[dict]:
        sign = None
        if self.tools_enabled:  # a sign ends in the new text: look back a line's worth only
            sign = _CALL_SIGN.search(self.text, max(0, self.signs_seen - SIGN_LOOKBACK))
            self.signs_seen = len(self.text)
        if sign is not None:  # from here on the parser may read calls: nothing more is content
            self._enter_tools(sign.start())
        body = self.text[: self.content_end] if self.mode == "tools" else self.text
        for s in self.stop:  # never send a complete stop string (the engine trims it)
            if s in body:
                body = body[: body.index(s)]
        if self.mode == "content":
            needles = self.stop + ([TAG_OPEN, TOOLS_ECHO] if self.tools_enabled else [])
            body = body[: len(body) - _held_suffix(body, needles)]
            if self.tools_enabled:  # a doubled call's head may be growing (mid-line too)
                body = body[: partial_sign(body)]
        if self.tools_enabled:  # wrappers a call may yet follow (the parser drops them with it)
            body = body[: held_while_streaming(body)]
        # with tools the parsed content is stripped (a completion's leading space is its text)
        body = body.strip() if self.tools_enabled else body.rstrip()
        if len(body) > len(self.content_sent) and body.startswith(self.content_sent):
            delta, self.content_sent = body[len(self.content_sent):], body
            return [{"content": delta}]
        return []

    def _tools_step(self) -> list[dict]:
        out: list[dict] = []
        while True:
            if self.calls and self.calls[-1].value_end is None:
                call = self.calls[-1]
                out += self._stream_args(call)
                if call.value_end is None:
                    return out
                self.scan = self._after_call(call)
                continue
            if self.max_calls is not None and len(self.calls) >= self.max_calls:
                return out
            pos = self._skip_to_object(self.scan)
            if pos is None:
                return out
            call = self._head_at(pos)
            if call is None:
                return out  # incomplete head (or not a call: finish() sorts it out)
            self.calls.append(call)
            out.append({"tool_calls": [{"index": call.index, "id": self.call_id(call.index),
                                        "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}]})

    def _head_at(self, pos: int) -> _Call | None:
        """The call whose head (single or doubled braces) is complete at `pos`, else None."""
        m = _CALL_HEAD.match(self.text, pos)
        if m is not None:
            return _Call(len(self.calls), json.loads('"' + m.group(1) + '"'), m.end())
        # a doubled call is announced once the parser would read it whole (closing braces too):
        # `{{'name': 'f', 'arguments': {'city': ...}}}` or a cut one is no call to the parser
        whole = read_doubled(self.text, pos)
        if whole is None:
            return None
        m = DOUBLED_HEAD.match(self.text, pos)
        return _Call(len(self.calls), whole.obj["name"], m.end(), "}}>" if m.group(1) else "}}")

    def _skip_to_object(self, pos: int) -> int | None:
        """Position of the next `{` after whitespace and tags, or None if not there yet."""
        text = self.text
        while pos < len(text):
            tag = _TAG.match(text, pos)
            if text[pos].isspace():
                pos += 1
            elif tag is not None:
                pos = tag.end()
            elif text[pos] == "{" or text.startswith("<{", pos):  # `<{{name"` (doubled_calls)
                return pos
            else:
                return None
        return None

    def _after_call(self, call: _Call) -> int:
        """Skip the outer object's closing after a call's arguments (braces, a doubled call's `>`)."""
        pos, text = call.value_end, self.text
        for i, ch in enumerate(call.closing):
            while ch == "}" and pos < len(text) and text[pos] in (" \t" if i else " \t\n\r"):
                pos += 1
            if pos < len(text) and text[pos] == ch:
                pos += 1
        return pos

    def _stream_args(self, call: _Call) -> list[dict]:
        sub = self.text[call.args_start:]
        if not call.sent_args and sub[:1].isspace():  # the head regex may end before a space
            call.args_start += len(sub) - len(sub.lstrip())
            sub = sub.lstrip()
        if sub.startswith('"'):
            return []  # arguments as a JSON string: the parser decodes them; sent by finish()
        try:
            value, end = _DECODER.raw_decode(sub)
            call.value_end = call.args_start + end
            # the parser's serialisation exactly (json_canon's docstring)
            ready = json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else ""
        except json.JSONDecodeError:  # trailing braces may close the outer object
            ready = canonical_prefix(sub.rstrip().rstrip("}"))
        return self._args_delta(call, ready)

    def _args_delta(self, call: _Call, ready: str) -> list[dict]:
        if len(ready) > len(call.sent_args) and ready.startswith(call.sent_args):
            frag, call.sent_args = ready[len(call.sent_args):], ready
            return [{"tool_calls": [{"index": call.index, "function": {"arguments": frag}}]}]
        return []

    # -- end of generation ----------------------------------------------------------------------
    def finish(self, result) -> list[dict]:
        """Release everything held back, reconciled with the engine's ChatResult."""
        out: list[dict] = []
        text = result.text or ""
        if len(text) > len(self.content_sent) and text.startswith(self.content_sent):
            out.append({"content": text[len(self.content_sent):]})
            self.content_sent = text
        final_calls = list(result.tool_calls or [])[: self.max_calls]
        for i, tc in enumerate(final_calls):
            args = tc["function"]["arguments"]
            if not isinstance(args, str):
                args = json.dumps(args)
            if i < len(self.calls):
                call = self.calls[i]
                if args.startswith(call.sent_args):
                    out += self._args_delta(call, args)
                elif call.value_end is not None:
                    out += self._args_delta(call, self.text[call.args_start:call.value_end])
                continue
            out.append({"tool_calls": [{"index": i, "id": tc.get("id") or self.call_id(i),
                                        "type": "function",
                                        "function": {"name": tc["function"]["name"],
                                                     "arguments": args}}]})
        # Calls the client saw a name for but the engine could not parse: send the raw rest.
        for call in self.calls[len(final_calls):]:
            if call.value_end is not None:  # its arguments were whole JSON: they, not the closing
                out += self._args_delta(call, self.text[call.args_start:call.value_end])
                continue
            raw = self.text[call.args_start:].rstrip()
            raw = raw[: -len(TAG_CLOSE)].rstrip() if raw.endswith(TAG_CLOSE) else raw
            raw = raw[:-1] if raw.endswith("}") and call.value_end is None else raw
            out += self._args_delta(call, raw)
        return out

    @property
    def sent_tool_calls(self) -> bool:
        return bool(self.calls)
