"""Model output -> final text + OpenAI-shape tool calls + invalid calls; never raises.

Accepted call forms (docs/architecture.md "Chat format"): a JSON object `{"name": ...,
"arguments": {...}}` (also `"parameters"`, or an OpenAI-shaped `{"function": {...}}`), several
objects one per line, a JSON list of them, or Hermes `<tool_call>{json}</tool_call>` blocks (and
such objects between and after the blocks: with parallel calls the auto grammar holds them too). A
call object doubled in braces, `{{"name": ..., "arguments": {...}}}`, is a call too, wherever in a
line it starts and in any spelling of its keys (`{{'name': 'get_weather', 'arguments': {...}}}`,
`<{{name": ...}}}>`, `{{name: ...}}}`; asymagent/chat/doubled_calls.py, the auto grammar holds
the same forms): Qwen2.5's chat template shows the call form that way in its tool instructions (a
Jinja string escaped as if for str.format), and its models copy it, e.g. Qwen2.5-Coder-1.5B calling
a tool again after the tool's result (docs/serving.md, "Under auto on the reference pair"); a
template expression such as `{{ name }}` is text. Text outside the calls is the content. A tool *definition* is never a call: an echo of the tool list (`<tools>...</tools>`,
what Qwen2.5's template shows the model) is dropped whole, wrapper and all, and an object whose
arguments (or parameters) are a JSON Schema, or that carries a definition's `description` or
`strict`, is dropped as an echoed definition. Given the offered tools' names (`tool_names`), an
object naming no tool is no call either (an `invalid_tool_calls` entry). An empty
`<tool_call></tool_call>` wrapper is dropped, and so are the wrappers a model puts around or beside
a call of its own accord (`<json>\n{call}\n</json>`, an empty tag pair, a code fence: the rules
are asymagent/chat/call_wrappers.py's, which the server's streamer shares); with tools offered a
message of nothing but such wrappers has no content. A call object may follow a line's leading
tags (`<json>{"name": ...}`), where the auto grammar holds it too. Malformed JSON that looks like
a call stays in the content and adds an `invalid_tool_calls` entry in LangChain's shape (name,
args, id, error), so nothing the model wrote is lost and no exception reaches the caller.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from asymagent.chat.call_wrappers import join_around_calls
from asymagent.chat.doubled_calls import find_doubled, read_doubled


@dataclass
class ParsedOutput:
    """Model output split into final text and tool calls (OpenAI shape) plus invalid calls."""

    content: str
    tool_calls: list = field(default_factory=list)  # [{"id","type":"function","function":{...}}]
    invalid_tool_calls: list = field(default_factory=list)  # [{"name","args","id","error"}]


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id, `call_` + 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_LOOKS_LIKE_CALL = re.compile(r'^\s*(?:\{\s*"(?:name|function)"|<?\{\{\s*["\']?(?:name|function)["\']?\s*(?=:)|<?\{\{\s*name\s*(?==))\s*[:=]',
                              re.S)
_CALL_KEYS = ({"name", "arguments"}, {"name", "parameters"})  # what a doubled call object holds
_DECODER = json.JSONDecoder()
_AT_CALL = None  # in the kept text: where a call (or a dropped definition) was taken out
_LEADING_TAGS = re.compile(r"(?:<[A-Za-z][\w:.-]*(?:\s[^<>\n]*)?>[ \t]*)+")  # `<json>{"name"...`
_TOOLS_ECHO = re.compile(r"<tools>.*?(?:</tools>|$)|</tools>", re.S)  # the tool list, echoed
_DEFINITION_KEYS = {"description", "strict"}  # what a tool definition holds and a call never
DEFINITION = "an echoed tool definition"  # _call_from_obj's error for one: dropped, not invalid


def _schema_like(value) -> bool:
    """A JSON Schema of an object (`properties` with `type: object` or a `required` list), as a
    tool's parameters are, not the arguments of a call."""
    return isinstance(value, dict) and isinstance(value.get("properties"), dict) and \
        (value.get("type") == "object" or isinstance(value.get("required"), list))


def _is_definition(obj: dict) -> bool:
    """An echoed tool definition rather than a call (module docstring); OpenAI's tool shape
    `{"type": "function", "function": {...}}` is looked into."""
    inner = obj["function"] if isinstance(obj.get("function"), dict) else obj
    return bool(_DEFINITION_KEYS & set(inner)) or \
        _schema_like(inner.get("arguments")) or _schema_like(inner.get("parameters"))


def _call_from_obj(obj, names=None) -> tuple[dict | None, str | None]:
    """(OpenAI tool call, None) for a call-shaped dict, (None, error) for a broken one, (None,
    DEFINITION) for an echoed tool definition; `names`: the tools a call may name (None: any)."""
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    if _is_definition(obj):
        return None, DEFINITION
    if isinstance(obj.get("function"), dict) and "name" in obj["function"]:
        obj = obj["function"]  # an OpenAI-shaped call echoed back
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "tool call has no string 'name'"
    if names is not None and name not in names:
        return None, f"no tool is named {name!r} (tools: {', '.join(names)})"[:300]
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"arguments are not valid JSON: {exc.msg}"
    if not isinstance(args, dict):
        return None, f"arguments must be a JSON object, got {type(args).__name__}"
    return {"id": new_call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}, None


def _add_call(obj: dict, raw: str, out: ParsedOutput, keep: list, names=None) -> None:
    """One call object into `out` (an invalid entry, its text kept, when it is broken; nothing
    for an echoed definition)."""
    call, err = _call_from_obj(obj, names)
    if call is not None:
        out.tool_calls.append(call)
    if err != DEFINITION and call is None:
        out.invalid_tool_calls.append(_invalid(raw, err))
        keep.append(raw)
    else:
        keep.append(_AT_CALL)


def _invalid(raw: str, error: str) -> dict:
    match = re.search(r'"name"\s*:\s*"([^"]*)"', raw)
    return {"name": match.group(1) if match else None, "args": raw.strip(), "id": new_call_id(),
            "error": error}


def _doubled_call(chunk: str, start: int) -> tuple[dict, int] | None:
    """(call object, end) for a doubled call at `start`, else None: in a spelling of
    doubled_calls.read_doubled, or `{{` + a JSON object that is exactly a call (name and
    arguments, or parameters, in any order) + `}`, so no other text is read as one."""
    spelled = read_doubled(chunk, start)
    if spelled is not None:
        return spelled.obj, spelled.end
    if not chunk.startswith("{{", start):
        return None
    try:
        obj, end = _DECODER.raw_decode(chunk, start + 1)
    except json.JSONDecodeError:
        return None
    close = len(chunk[end:]) - len(chunk[end:].lstrip(" \t"))
    if not isinstance(obj, dict) or set(obj) not in _CALL_KEYS or \
            not chunk.startswith("}", end + close):
        return None
    return obj, end + close + 1


def _parse_json_calls(chunk: str, out: ParsedOutput, keep: list, names=None) -> None:
    """Scan `chunk` for call objects starting at line starts; text around them goes to `keep`."""
    pos = 0
    while pos < len(chunk):
        line_end = chunk.find("\n", pos)
        line_end = len(chunk) if line_end < 0 else line_end + 1
        stripped = chunk[pos:line_end].lstrip()
        start = pos + (line_end - pos - len(stripped))
        tags = _LEADING_TAGS.match(chunk, start, line_end)  # a call inside a tag of the model's
        if tags is not None and chunk.startswith("{", tags.end()):
            stripped, start = chunk[tags.end():line_end], tags.end()
        found = find_doubled(chunk, pos, line_end)  # a doubled call, wherever in the line
        if found is not None and (found.start <= start or not stripped.startswith(("{", "["))):
            keep.append(chunk[pos:found.start] if chunk[pos:found.start].strip() else "")
            _add_call(found.obj, chunk[found.start:found.end], out, keep, names)
            pos = found.end
            continue
        doubled = _doubled_call(chunk, start)
        if doubled is not None:
            obj, end = doubled
            keep.append(chunk[pos:start] if chunk[pos:start].strip() else "")
            _add_call(obj, chunk[start:end], out, keep, names)
            pos = end
            continue
        if stripped.startswith("{") or stripped.startswith("["):
            try:
                obj, end = _DECODER.raw_decode(chunk, start)
            except json.JSONDecodeError as exc:
                obj, end = None, None
                if _LOOKS_LIKE_CALL.match(chunk[start:]):
                    raw = chunk[start:]
                    out.invalid_tool_calls.append(_invalid(raw, f"malformed JSON: {exc.msg}"))
                    keep.append(chunk[pos:])
                    return
            if end is not None:
                objs = obj if isinstance(obj, list) else [obj]
                calls = [_call_from_obj(o, names) for o in objs]
                callish = all(isinstance(o, dict) and ("name" in o or "function" in o) for o in objs)
                if objs and callish:
                    keep.append(chunk[pos:start] if chunk[pos:start].strip() else "")
                    for (call, err), o in zip(calls, objs):
                        if call is not None:
                            out.tool_calls.append(call)
                        elif err != DEFINITION:
                            raw = chunk[start:end] if len(objs) == 1 else json.dumps(o)
                            out.invalid_tool_calls.append(_invalid(raw, err))
                            keep.append(raw)
                            continue
                        keep.append(_AT_CALL)
                    pos = end
                    continue
        keep.append(chunk[pos:line_end])
        pos = line_end


def _parse_hermes_blocks(text: str, out: ParsedOutput, keep: list, names=None) -> None:
    """`<tool_call>...</tool_call>` blocks of `text` into `out`; text around them into `keep`."""
    last = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        _parse_json_calls(text[last:match.start()], out, keep, names)  # calls between blocks too
        last = match.end()
        inner = match.group(1).strip()
        if not inner:
            keep.append(_AT_CALL)  # an empty wrapper: nothing of the turn
            continue
        doubled = _doubled_call(inner, 0)
        if doubled is not None and not inner[doubled[1]:].strip():
            inner = inner[1:doubled[1] - 1]  # a doubled call inside the tags
        try:
            obj = json.loads(inner)
        except json.JSONDecodeError as exc:
            out.invalid_tool_calls.append(_invalid(inner, f"malformed JSON: {exc.msg}"))
            keep.append(match.group(0))
            continue
        for o in obj if isinstance(obj, list) else [obj]:
            call, err = _call_from_obj(o, names)
            if call is not None:
                out.tool_calls.append(call)
            elif err != DEFINITION:
                out.invalid_tool_calls.append(_invalid(inner, err))
                keep.append(match.group(0))
                continue
            keep.append(_AT_CALL)
    _parse_json_calls(text[last:], out, keep, names)


def content_of(keep: list) -> str:
    """The message content: the kept text, split where calls were taken out, with each call's
    wrappers (asymagent/chat/call_wrappers.py) removed, stripped."""
    segments, current = [], []
    for piece in keep:
        if piece is _AT_CALL:
            segments.append("".join(current))
            current = []
        else:
            current.append(piece)
    return join_around_calls(segments + ["".join(current)]).strip()


def parse_output(text, tool_names: list | None = None) -> ParsedOutput:
    """Model output -> ParsedOutput(content, tool_calls, invalid_tool_calls); never raises.

    tool_names: the offered tools (a call must name one of them, and an echo of the tool list is
    dropped); None: any name is taken."""
    try:
        text = "" if text is None else str(text)
        names = None if tool_names is None else list(tool_names)
        if names is not None:
            text = _TOOLS_ECHO.sub("", text)
        out = ParsedOutput(content="")
        keep: list = []
        if "<tool_call>" in text:
            _parse_hermes_blocks(text, out, keep, names)
        else:
            _parse_json_calls(text, out, keep, names)
        out.content = content_of(keep) if names is not None or out.tool_calls else \
            "".join(k for k in keep if k is not _AT_CALL).strip()
        return out
    except Exception as exc:  # pragma: no cover - belt and braces: parsing must never raise
        return ParsedOutput(content=str(text), invalid_tool_calls=[
            {"name": None, "args": str(text), "id": new_call_id(), "error": f"parser error: {exc}"}])
