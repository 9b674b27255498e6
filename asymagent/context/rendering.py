"""Message rendering: OpenAI-style messages + tools -> append-stable token segments (`MessageRenderer`).

Rendering. Every message renders to its own token segment and the prompt is the concatenation
of the segments (then the generation prompt), so the tokens of history n are a prefix of the
tokens of history n+1 by construction: the engine and the verifier's KV cache rely on that (one
tail excepted, as in the template itself: the close of a trailing run of tool messages, below).
A message is rendered with the tokenizer's own chat template, isolated by difference:
`render([anchor, msg]) - render([anchor])` where `anchor` is a fixed system message, which gives
exactly what the template writes for `msg` in the middle of a conversation (SmolLM2:
`<|im_start|>{role}\\n{content}<|im_end|>\\n`). What the template writes before the first message
when that one is not a system message (SmolLM2 injects a default system prompt there) becomes a
separate *preamble* segment, so a conversation without a system message still renders exactly
as the template renders it.

Runs of tool messages (the results of one turn of parallel calls). How the template writes two
tool messages in a row is detected once per template (`tool_runs`, from probe messages):
- "separate": each tool message is a turn of its own (SmolLM2, Llama 3): its isolated segment.
- "merged": the run is one turn, closed after its last message only (Qwen2.5's template, tested;
  Qwen3's writes runs the same way: one `<|im_start|>user` turn holding one `<tool_response>` block
  per message, then `<|im_end|>\\n`). A tool message renders by difference in its real context, the
  tool messages of its run before it, in the *open* form (the template's text when another tool
  message follows: the common prefix of the run rendered with and without a probe tool message
  appended); the run's close is a segment of its own (source "close"), written before the next
  message, or at the end when the conversation ends with the run (then before the generation
  prompt). A tool message's segment never changes when messages are appended, so the segments of
  history n are a prefix of those of history n+1; the one tail that changes is the close of a
  trailing run, which moves behind a tool message appended to that run, exactly as the template
  itself writes it (the generation prompt is such a tail too). Token boundaries: where the
  tokenizer would read the end of one result and what follows it as one token (Qwen2.5's vocabulary
  has `>\\n`, and `</tool_response>` is no added token there), the last characters of the
  template's text after a result's content (`>`) move into the next piece, the next result's
  segment or the close: the fewest characters for which tokenising the pieces apart gives the
  tokens of the whole text (`_find_carry`). Detection checks the pieces put back together against
  the template for probe runs of 1-3 messages followed by a user, an assistant and another tool
  message, that each tool message's piece holds its content, and that tokenising the pieces one by
  one gives the tokens of the whole text (`tool_run_tokens_exact`; where no split does, e.g.
  results written back to back, each piece keeps its own tokens, logged once).
- "unsupported": neither (logged once at construction): tool messages render isolated, which
  is not the template's text for a run of two or more.

Tools (docs/architecture.md "Chat format"). A template that reads `tools` (detected once by
rendering with and without a dummy tool) gets them, and tool calls are written Hermes-style,
`<tool_call>\\n{json}\\n</tool_call>`. A template that ignores `tools` (the embedded SmolLM2) gets
them listed in the system message: a one-line instruction, then one JSON schema per line; the
model answers a call as one JSON object `{"name": ..., "arguments": {...}}` per line. Assistant
messages with `tool_calls` render in exactly the form the model is asked to emit; `tool`
messages render with role `tool` and string content (other values are JSON-dumped).

The chat layer's `ChatFormat` (asymagent/chat/chat_format.py) is this renderer plus output
parsing; the context views (asymagent/context/views.py) need only the rendering, so it lives here
and context/ imports nothing from chat/.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass


_ANCHOR = {"role": "system", "content": "\x00anchor\x00"}
_PROBE_USER = {"role": "user", "content": "\x00probe\x00"}
_PROBE_TOOLS = tuple({"role": "tool", "content": f"\x00result{i}\x00"} for i in range(3))
_PROBE_NEXT = {"role": "tool", "content": "\x00next\x00"}  # what an open run is rendered against
_PROBE_REPLY = {"role": "assistant", "content": "\x00reply\x00"}
_TOKEN_PROBE = '{"ok": true}'  # realistic tool output for the token-boundary check
_PROBE_TOOL = {"type": "function", "function": {
    "name": "zz_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}

TOOL_INSTRUCTION = (
    "You can call the tools listed below, one JSON schema per line. To call a tool, answer with "
    'one JSON object per line, {"name": <tool name>, "arguments": {<argument>: <value>}}, and '
    "nothing else; otherwise answer in plain text."
)
TOOL_INSTRUCTION_NAME_SIG = (
    "You can call the tools listed below, one signature per line (`?` marks an optional "
    'argument). To call a tool, answer with one JSON object per line, {"name": <tool name>, '
    '"arguments": {<argument>: <value>}}, and nothing else; otherwise answer in plain text.'
)
_TOOL_STYLES = ("full", "name_sig")
TOOL_RUNS = ("separate", "merged", "unsupported")  # MessageRenderer.tool_runs

log = logging.getLogger(__name__)


@dataclass
class Segment:
    """One rendered piece of a prompt. `source` is a message index, "preamble", "close" (the
    close of a run of tool messages, merged templates) or "generation"."""

    source: int | str
    text: str
    ids: list  # list[int], this segment's tokens


def message_text(content) -> str:
    """Content of an OpenAI message as text: None -> "", list of parts -> joined text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type", "text") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ValueError(f"unsupported content part {part!r}: only text parts are supported")
        return "".join(parts)
    raise ValueError(f"message content must be a string, a list of text parts or None, got "
                     f"{type(content).__name__}")


def function_of(tool: dict) -> dict:
    """The `function` object of an OpenAI tool (also accepts a bare function schema)."""
    if not isinstance(tool, dict):
        raise ValueError(f"a tool must be a dict, got {type(tool).__name__}")
    fn = tool.get("function", tool) if tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"tool {tool!r} has no function name")
    return fn


def _type_sig(schema: dict) -> str:
    """Compact type of a JSON schema property: string, integer, "a"|"b", array[string], ..."""
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = "|".join(str(k) for k in kind)
    if kind == "array":
        return f"array[{_type_sig(schema.get('items', {}))}]"
    return str(kind)


def name_signature(tool: dict) -> str:
    """`name(arg: type, opt?: type)`, the paper's name_sig form of one tool."""
    fn = function_of(tool)
    params = fn.get("parameters") or {}
    required = set(params.get("required") or [])
    args = [f"{name}{'' if name in required else '?'}: {_type_sig(prop)}"
            for name, prop in (params.get("properties") or {}).items()]
    return f"{fn['name']}({', '.join(args)})"


def strip_descriptions(schema):
    """A JSON schema without `description` fields (the name_sig form for tool-aware templates)."""
    if isinstance(schema, dict):
        return {k: strip_descriptions(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [strip_descriptions(v) for v in schema]
    return schema


def tool_prompt(tools: list, style: str = "full") -> str:
    """The tool block of the system message for templates without tool support.

    `full`: the instruction line, then one JSON function schema per line.
    `name_sig`: the instruction line, then one `name(arg: type, ...)` signature per line.
    """
    if style not in _TOOL_STYLES:
        raise ValueError(f"tool style must be one of {_TOOL_STYLES}, got {style!r}")
    if style == "full":
        lines = [json.dumps(function_of(t), ensure_ascii=False) for t in tools]
        return "\n".join([TOOL_INSTRUCTION, *lines])
    return "\n".join([TOOL_INSTRUCTION_NAME_SIG, *(name_signature(t) for t in tools)])


def call_json(call: dict) -> str:
    """One OpenAI tool call as the JSON object the model emits: {"name":..,"arguments":{..}}."""
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict) or "name" not in fn:
        raise ValueError(f"tool call {call!r} has no function name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):  # malformed, or nested past Python's limit
            pass  # keep the raw string: the history shows what the model actually produced
    return json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)


def _as_written(obj) -> str:
    """A cache key for what a template renders: JSON in the object's own key order. The template
    writes a tool with `tojson`, which keeps that order, so two tools that differ only in key order
    render to different tokens and must not share a cached segment (keys made with sort_keys did:
    the first request's order was then served to every later one)."""
    return json.dumps(obj, ensure_ascii=False, default=str)


NO_TEMPLATE = ("the model has no chat template, which chat needs (text completions and generate do "
               "not): give one (asymagent serve --chat-template FILE|STRING; in Python "
               "tokenizer.chat_template = ...)")


class NoChatTemplate(ValueError):
    """The tokenizer has no chat template: chat cannot render messages (NO_TEMPLATE says how to
    give one); token-level generation and text completions still work."""


def chat_template_text(value: str) -> str:
    """A chat template given as a file or as the template itself (vLLM's `--chat-template`): a
    value holding `{`, `}` or a newline is the template; anything else must name a readable file
    (a ValueError otherwise, so a mistyped path is not served as a template)."""
    if any(c in value for c in "{}\n"):
        return value
    import os

    if not os.path.isfile(value):
        raise ValueError(f"--chat-template {value}: no such file, and not a template (a template "
                         "holds {{ }} or {% %})")
    with open(value, encoding="utf-8") as fh:
        text = fh.read()
    if not text.strip():
        raise ValueError(f"--chat-template {value}: the file is empty")
    return text


class MessageRenderer:
    """Renders OpenAI-style conversations to append-stable token segments for one tokenizer."""

    def __init__(self, tokenizer, cache_size: int = 4096, template_kwargs: dict | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise NoChatTemplate(NO_TEMPLATE)
        self.tokenizer = tokenizer
        # extra variables for the template (vLLM's chat_template_kwargs, e.g. enable_thinking)
        self.template_kwargs = dict(template_kwargs or {})
        self._cache: OrderedDict = OrderedDict()  # (key) -> Segment, bounded LRU
        self._cache_size = cache_size
        self._affixes: dict = {}  # role -> (text before, text after) the content
        anchor_text = self._render([_ANCHOR])
        self._anchor_text = anchor_text
        with_gen = self._render([_ANCHOR, _PROBE_USER], add_generation_prompt=True)
        without = self._render([_ANCHOR, _PROBE_USER])
        if not with_gen.startswith(without):
            raise ValueError("the chat template's generation prompt does not extend the prompt")
        self.generation_prompt_text = with_gen[len(without):]
        self.generation_prompt_ids = self.encode(self.generation_prompt_text)
        try:
            probe = self._render([_PROBE_USER], tools=[_PROBE_TOOL])
        except ValueError:  # a template that chokes on tools cannot use them
            probe = self._render([_PROBE_USER])
        self.template_tools = "zz_probe_tool" in probe
        # What the template writes before a first message that is not a system message.
        user_text = self._isolated_text(_PROBE_USER)
        alone = self._render([_PROBE_USER])
        if not alone.endswith(user_text):
            raise ValueError("the chat template renders a first user message differently from "
                             "later ones; it cannot be rendered append-stably")
        self.preamble_text = alone[: len(alone) - len(user_text)]
        self.default_system = self._default_system_content()
        self.tool_run_tokens_exact = True
        self._run_carry = 0  # characters a tool message's open form hands on to the next piece
        self.tool_runs = self._detect_tool_runs()

    # -- low level -------------------------------------------------------------------------
    def _render(self, messages, tools=None, add_generation_prompt=False) -> str:
        kwargs = {**self.template_kwargs, **({"tools": tools} if tools else {})}
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as exc:  # jinja2 TemplateError / raise_exception() in the template
            roles = [m.get("role") for m in messages]
            raise ValueError(f"the chat template cannot render messages with roles {roles}: "
                             f"{exc}") from exc

    def encode(self, text: str) -> list:
        """Token ids of `text`, no special tokens added (the template wrote them as text)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _isolated_text(self, message: dict) -> str:
        """What the template writes for `message` in the middle of a conversation."""
        both = self._render([_ANCHOR, message])
        if not both.startswith(self._anchor_text):
            raise ValueError("the chat template rewrites earlier messages when one is appended; "
                             "it cannot be rendered append-stably")
        return both[len(self._anchor_text):]

    def _default_system_content(self) -> str | None:
        """The system prompt the template injects when none is given (SmolLM2 has one)."""
        if not self.preamble_text:
            return None
        rendered = self._render([{"role": "system", "content": "\x00sys\x00"}])
        before, _, after = rendered.partition("\x00sys\x00")
        pre = self.preamble_text
        if pre.startswith(before) and pre.endswith(after) and len(pre) >= len(before) + len(after):
            return pre[len(before): len(pre) - len(after)]
        return None

    def content_span(self, segment_text: str, role: str, content: str, run: list = ()) -> tuple | None:
        """(start, end) characters of `content` inside the segment of a `role` message (rendered
        after the tool messages `run`, see `render_message`), or None when the segment is not
        `before + content + after` for that role there."""
        run = self._run_of(role, run)
        key = (role, tuple(m["content"] for m in run))
        if key not in self._affixes:
            probe = {"role": role, "content": "\x00c\x00"}
            text = self._run_piece(run, probe) if role == "tool" and self.tool_runs == "merged" \
                else self._isolated_text(probe)
            self._affixes[key] = text.partition("\x00c\x00")[::2]
            if len(self._affixes) > self._cache_size:
                self._affixes.pop(next(iter(self._affixes)))
        before, after = self._affixes[key]
        if segment_text == before + content + after:
            return len(before), len(before) + len(content)
        return None

    # -- runs of tool messages (module docstring) ----------------------------------------------------
    def _detect_tool_runs(self) -> str:
        """"separate", "merged" or "unsupported": how the template writes tool messages in a row."""
        t1, t2 = _PROBE_TOOLS[:2]
        try:
            one, two = self._render([_ANCHOR, t1]), self._render([_ANCHOR, t1, t2])
        except ValueError:  # the template refuses a tool message here: rendering one will say so
            return "separate"
        if two.startswith(one):
            return "separate"
        try:
            self._run_carry = self._find_carry()
            self._check_merged()
        except ValueError as exc:
            log.warning("the chat template writes consecutive tool messages in a form that cannot be "
                        "split into append-stable segments (%s); each tool message renders as its own "
                        "turn, which is NOT the template's text for two or more in a row", exc)
            self._run_carry = 0
            return "unsupported"
        self.tool_run_tokens_exact = self._run_tokens_exact()
        if not self.tool_run_tokens_exact:
            log.warning("the tokenizer merges tokens across the boundary between two tool messages "
                        "of one turn: each keeps its own tokens (append-stable); the prompt's text is "
                        "the template's, its tokens are not those of tokenising the whole text")
        return "merged"

    def _check_merged(self) -> None:
        """The merged pieces, put back together, equal the template's text for probe runs of 1-3
        tool messages followed by a user, an assistant and a tool message, and each tool message's
        piece holds its content (ValueError if not)."""
        def pieces(msgs: list) -> str:
            text, run = self._anchor_text, []
            for m in msgs:
                if m["role"] != "tool" and run:
                    text, run = text + self._close_piece(run), []
                if m["role"] == "tool":
                    piece = self._run_piece(run, m)
                    if m["content"] not in piece:
                        raise ValueError("a tool message's text moves when another one follows it")
                    text, run = text + piece, run + [m]
                else:
                    text += self._isolated_text(m)
            return text + (self._close_piece(run) if run else "")

        for n in (1, 2, 3):
            for after in ((), (_PROBE_USER,), (_PROBE_REPLY,), (_PROBE_USER, _PROBE_NEXT)):
                msgs = [*_PROBE_TOOLS[:n], *after]
                if pieces(msgs) != self._render([_ANCHOR, *msgs]):
                    raise ValueError(f"roles {[m['role'] for m in msgs]} do not render as their pieces")

    def _run_tokens_exact(self) -> bool:
        """Tokenising the pieces of a two-message run (and what follows it) one by one gives the
        tokens of tokenising their text whole."""
        t1, t2 = ({"role": "tool", "content": _TOKEN_PROBE} for _ in range(2))
        texts = [self._run_piece([], t1), self._run_piece([t1], t2),
                 self._close_piece([t1, t2]), self._isolated_text({"role": "user", "content": "Thanks."})]
        return [t for x in texts for t in self.encode(x)] == self.encode("".join(texts))

    def _find_carry(self) -> int:
        """How many characters at the end of a tool message's open form (template text after its
        content, never the content) move into the next piece so that no token spans a boundary:
        the fewest for which tokenising the two sides apart gives the tokens of the whole text, both
        when the run closes there and when another tool message follows (Qwen2.5's tokenizer reads
        `>\\n` as one token, so `>` of `</tool_response>` moves: it ends the message only when the
        next piece is known). 0 when no such split exists (`_run_tokens_exact` then says so)."""
        t1, t2 = ({"role": "tool", "content": _TOKEN_PROBE} for _ in range(2))
        first = self._run_segment_text([], t1)
        rests = (self._close_text([t1]), self._run_segment_text([t1], t2))
        at = first.rfind(_TOKEN_PROBE)
        room = len(first) - (at + len(_TOKEN_PROBE)) if at >= 0 else 0
        for carry in range(room + 1):
            head, tail = first[: len(first) - carry], first[len(first) - carry:]
            if all(self.encode(head) + self.encode(tail + rest) == self.encode(first + rest)
                   for rest in rests):
                return carry
        return 0

    def _run_piece(self, run: list, message: dict) -> str:
        """The segment text of tool `message` after the tool messages `run` of its turn: its open
        form, less the carry it hands on, after the carry of the message before it."""
        text = self._run_segment_text(run, message)
        return self._carry_in(run) + text[: len(text) - self._run_carry]

    def _close_piece(self, run: list) -> str:
        """The close segment's text: the last message's carry, then the template's close."""
        return self._carry_in(run) + self._close_text(run)

    def _carry_in(self, run: list) -> str:
        """The carry the last message of `run` hands on ("" for no run or no carry)."""
        if not run or not self._run_carry:
            return ""
        text = self._run_segment_text(run[:-1], run[-1])
        return text[len(text) - self._run_carry:]

    def _run_open(self, run: list) -> str:
        """The text of [anchor, *run] as the template writes it while the run goes on (another tool
        message follows): the common prefix of the run rendered without and with a probe tool
        message appended."""
        if not run:
            return self._anchor_text
        closed, more = self._render([_ANCHOR, *run]), self._render([_ANCHOR, *run, _PROBE_NEXT])
        n = 0
        while n < min(len(closed), len(more)) and closed[n] == more[n]:
            n += 1
        return closed[:n]

    def _run_segment_text(self, run: list, message: dict) -> str:
        """What a merged template writes for tool `message` after the tool messages `run` of its
        turn, in the open form (without the run's close)."""
        before, after = self._run_open(run), self._run_open([*run, message])
        if not after.startswith(before):
            raise ValueError("the chat template rewrites a tool message's text when another one "
                             "follows it; it cannot be rendered append-stably")
        return after[len(before):]

    def _close_text(self, run: list) -> str:
        """What a merged template writes after the last tool message of `run` (Qwen2.5:
        `<|im_end|>\\n`)."""
        closed, open_ = self._render([_ANCHOR, *run]), self._run_open(run)
        return closed[len(open_):]

    def _run_of(self, role: str, run) -> list:
        """The template messages of `run` that matter for a `role` message: all of them for a tool
        message under a merged template, none otherwise."""
        if role != "tool" or self.tool_runs != "merged" or not run:
            return []
        return [self.template_message(m) for m in run]

    def close_segment(self, run: list) -> Segment | None:
        """The close of the tool run `run` (the messages of one turn; OpenAI dicts), written before
        the next non-tool message or at the end; None when the template writes none (not merged)."""
        if self.tool_runs != "merged" or not run:
            return None
        msgs = [self.template_message(m) for m in run]
        key = ("close", tuple(m["content"] for m in msgs))
        seg = self._segment("close", key, lambda: self._close_piece(msgs))
        return seg if seg.text else None

    # -- message normalisation ---------------------------------------------------------------
    def template_message(self, message: dict) -> dict:
        """The plain {role, content} message the template renders for an OpenAI message."""
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"a message must be a dict with a 'role', got {message!r}")
        role = message["role"]
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise ValueError(f"unknown message role {role!r}")
        if role == "developer":
            role = "system"
        if role == "function":
            role = "tool"
        content = message.get("content")
        if role == "tool" and not isinstance(content, (str, list, type(None))):
            content = json.dumps(content, ensure_ascii=False)
        text = message_text(content)
        calls = message.get("tool_calls") or []
        if calls:
            if role != "assistant":
                raise ValueError(f"only assistant messages carry tool_calls, got role {role!r}")
            if self.template_tools:
                blocks = [f"<tool_call>\n{call_json(c)}\n</tool_call>" for c in calls]
            else:
                blocks = [call_json(c) for c in calls]
            text = "\n".join(([text] if text else []) + blocks)
        return {"role": role, "content": text}

    def system_with_tools(self, system: dict | None, tools, tool_style: str = "full") -> dict | None:
        """The system message to render: with the tool block appended when the template ignores
        tools (and the template's default system prompt kept when the conversation has none)."""
        if not tools or self.template_tools:
            return system
        base = message_text(system.get("content")) if system else (self.default_system or "")
        block = tool_prompt(tools, tool_style)
        return {"role": "system", "content": f"{base}\n\n{block}" if base else block}

    def template_tools_for(self, tools, tool_style: str = "full"):
        """Tools passed to a tool-aware template (descriptions stripped for name_sig)."""
        if not tools or not self.template_tools:
            return None
        if tool_style not in _TOOL_STYLES:
            raise ValueError(f"tool style must be one of {_TOOL_STYLES}, got {tool_style!r}")
        fns = [function_of(t) for t in tools]
        if tool_style == "name_sig":
            fns = [strip_descriptions(fn) for fn in fns]
        return [{"type": "function", "function": fn} for fn in fns]

    # -- segments ------------------------------------------------------------------------------
    def _segment(self, source, key, make_text) -> Segment:
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return Segment(source, hit.text, hit.ids)
        text = make_text()
        seg = Segment(source, text, self.encode(text))
        self._cache[key] = seg
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return seg

    def render_message(self, message: dict, index: int, tools=None, tool_style: str = "full",
                       first: bool = False, run: list = ()) -> Segment:
        """The segment of one message. `first` marks message 0 (a system message there carries
        the tools; a non-system first message is preceded by `preamble_segment`). `run`: the tool
        messages right before this one (its turn's earlier results); a tool message of a merged
        template renders after them in the open form (its run's close is `close_segment`)."""
        msg = self.template_message(message)
        prior = self._run_of(msg["role"], run)
        if msg["role"] == "tool" and self.tool_runs == "merged":
            key = ("run", tuple(m["content"] for m in prior), msg["content"])
            return self._segment(index, key, lambda: self._run_piece(prior, msg))
        if first and msg["role"] == "system":
            msg = self.system_with_tools(msg, tools, tool_style)
            ttools = self.template_tools_for(tools, tool_style)
            key = ("first", _as_written(msg), _as_written(ttools) if ttools else None)
            return self._segment(index, key, lambda: self._render([msg], tools=ttools))
        key = ("msg", msg["role"], msg["content"])
        return self._segment(index, key, lambda: self._isolated_text(msg))

    def preamble_segment(self, tools=None, tool_style: str = "full") -> Segment | None:
        """What precedes a first message that is not a system message (None if nothing)."""
        if tools and not self.template_tools:
            system = self.system_with_tools(None, tools, tool_style)
            key = ("first", _as_written(system), None)
            return self._segment("preamble", key, lambda: self._render([system]))
        ttools = self.template_tools_for(tools, tool_style)
        if not ttools:
            if not self.preamble_text:
                return None
            return self._segment("preamble", ("preamble",), lambda: self.preamble_text)
        key = ("preamble", _as_written(ttools))

        def make() -> str:
            alone = self._render([_PROBE_USER], tools=ttools)
            user_text = self._isolated_text(_PROBE_USER)
            if not alone.endswith(user_text):
                raise ValueError("the chat template renders a first user message differently "
                                 "when tools are given; it cannot be rendered append-stably")
            return alone[: len(alone) - len(user_text)]

        return self._segment("preamble", key, make)

    def rendered(self, messages: list, tools=None, add_generation_prompt: bool = True,
                 tool_style: str = "full") -> list:
        """All segments of a conversation, in order, as `Segment`s (see `segments`)."""
        if not isinstance(messages, list):
            raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"tools must be a list of OpenAI tool dicts, got {type(tools).__name__}")
        out = []
        first_is_system = bool(messages) and self.template_message(messages[0])["role"] == "system"
        if not first_is_system:
            pre = self.preamble_segment(tools, tool_style)
            if pre is not None:
                out.append(pre)
        run: list = []  # the tool messages of the turn being written
        for i, message in enumerate(messages):
            is_tool = self.template_message(message)["role"] == "tool"
            if not is_tool and run:
                out.extend(s for s in [self.close_segment(run)] if s is not None)
                run = []
            out.append(self.render_message(message, i, tools, tool_style, first=(i == 0), run=run))
            run = run + [message] if is_tool else run
        out.extend(s for s in [self.close_segment(run)] if s is not None)
        if add_generation_prompt:
            out.append(Segment("generation", self.generation_prompt_text,
                               list(self.generation_prompt_ids)))
        return out

    def segments(self, messages: list, tools=None, add_generation_prompt: bool = True,
                 tool_style: str = "full") -> list:
        """Token segments: [preamble?] + one per message + [generation prompt?] (list[list[int]])."""
        return [s.ids for s in self.rendered(messages, tools, add_generation_prompt, tool_style)]

    def render_ids(self, messages: list, tools=None, add_generation_prompt: bool = True,
                   tool_style: str = "full") -> list:
        """The prompt's token ids: the concatenation of `segments` (append-stable)."""
        return [t for seg in self.segments(messages, tools, add_generation_prompt, tool_style)
                for t in seg]

    def render_text(self, messages: list, tools=None, add_generation_prompt: bool = True,
                    tool_style: str = "full") -> str:
        """The prompt as text (the concatenation of the segments' texts)."""
        return "".join(s.text for s in self.rendered(messages, tools, add_generation_prompt,
                                                      tool_style))
