"""ToolCallConstraint: xgrammar-backed TokenConstraint that only admits schema-valid tool calls.

Grammar (one call): a JSON object `{"name": <tool name>, "arguments": <that tool's parameters>}`,
an anyOf over the tools (or only the named one), written with json.dumps' default separators
(`", "` and `": "`, no other whitespace) so that what the model emits looks exactly like the
history `chat_format` renders. Models whose chat template takes tools (Hermes style) get the
object wrapped as `<tool_call>\n{...}\n</tool_call>`; the embedded SmolLM2 emits the bare object.
When the object closes (`is_completed()`) only the stop tokens (`<|im_end|>`, EOS) may follow;
a single stop token is forced, and `is_terminated()` turns true once it is accepted.

Why xgrammar (vs outlines-core, llguidance, lm-format-enforcer): it installs from PyPI as a CPU
wheel, builds its tokenizer info from a local HF tokenizer without downloads, compiles JSON
schema into a grammar in ~0.15 s, and its matcher has the two operations speculation needs:
unlimited `rollback` (drafts that get rejected) and jump-forward strings. Measured overhead per
token (mask fill + [V] bool unpack + advance, vocab 49152): see docs/agent.md and
`measure_overhead` below.

Jump-forward: `forced_tokens()` returns only tokens whose encoding is unambiguous: the common
prefix of the model tokenizer's encoding of the forced string and xgrammar's greedy longest-match
tokenisation, minus the last token of the string (the text that follows might merge with it).
While forced tokens exist, `allowed_mask()` admits only the first of them. So forced text has one
tokenisation whether the engine jumps forward or a model decodes it (e.g. a draft spanning the
forced region in a speculative round): greedy speculation under the constraint stays
token-identical to the verifier alone.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from asymagent.chat.schema_refs import ToolSchemaError, check_refs, has_refs, rebase_refs

TOOL_CHOICES = ("required", "any")
_XGRAMMAR_LOG_HEAD = re.compile(r"\[[0-9:]+\] \S+:[0-9]+: ")  # "[10:27:10] /project/cpp/x.cc:88: "
_LOOSE_CHARS = r'[^\"\\\r\n]'  # EBNF char class xgrammar uses for bounded strings
_STRICT_CHARS = r'[^\0-\x1f\"\\\r\n]'  # the same without control characters


def _tool_function(tool: dict) -> dict:
    """Accept OpenAI tools ({"type": "function", "function": {...}}) or bare function dicts."""
    if not isinstance(tool, dict):
        raise ValueError(f"a tool must be a dict (OpenAI function tool), got {type(tool).__name__}")
    fn = tool.get("function", tool) if tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"tool has no function name: {json.dumps(tool)[:200]}")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ValueError(f"tool {fn['name']!r}: parameters must be a JSON schema object")
    check_refs(params, f"tool {fn['name']!r} parameters")
    return {"name": fn["name"], "parameters": params}


def selected_tools(tools: list, tool_choice) -> list[dict]:
    """The tools a forced call may use: all of them, or the one `tool_choice` names."""
    if not tools:
        raise ValueError("a constrained tool call needs at least one tool")
    fns = [_tool_function(t) for t in tools]
    if tool_choice in TOOL_CHOICES:
        return fns
    if isinstance(tool_choice, str):
        name = tool_choice
    elif isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    else:
        name = None
    if not name or tool_choice in ("auto", "none"):
        raise ValueError(
            f"tool_choice must be 'required', 'any' or a named function, got {tool_choice!r}"
        )
    chosen = [f for f in fns if f["name"] == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools "
                         f"{[f['name'] for f in fns]}")
    return chosen


def tool_call_schema(functions: list[dict]) -> dict:
    """JSON schema of one call object, anyOf over the functions.

    Parameters that use `$ref` (pydantic's `$defs`, recursion) move whole under the call
    schema's `$defs` with their pointers re-rooted there (asymagent/chat/schema_refs.py), so
    `#/$defs/Name` written for the parameters' root still finds its target."""
    defs: dict = {}
    branches = []
    for i, f in enumerate(functions):
        arguments = f["parameters"]
        if has_refs(arguments):
            key = f"asymagent_args_{i}"
            defs[key] = rebase_refs(arguments, f"#/$defs/{key}")
            arguments = {"$ref": f"#/$defs/{key}"}
        branches.append({
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return {**schema, "$defs": defs} if defs else schema


def uses_hermes_format(tokenizer) -> bool:
    """True when the tokenizer's chat template renders `tools` (Hermes `<tool_call>` style)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    return "tools" in template and "tool_call" in template


@lru_cache(maxsize=8)
def _tokenizer_info(tokenizer, vocab_size: int, stop_ids: tuple):
    import xgrammar as xg

    return xg.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                             stop_token_ids=list(stop_ids))


@lru_cache(maxsize=8)
def _compiler(tokenizer, vocab_size: int, stop_ids: tuple):
    import xgrammar as xg

    return xg.GrammarCompiler(_tokenizer_info(tokenizer, vocab_size, stop_ids))


@lru_cache(maxsize=64)
def _compiled(tokenizer, vocab_size: int, stop_ids: tuple, schema_json: str, hermes: bool):
    import xgrammar as xg

    body = xg.Grammar.from_json_schema(schema_json, any_whitespace=False,
                                       separators=(", ", ": "), strict_mode=True)
    # xgrammar 0.2.9 writes length-bounded strings as [^"\\\r\n]{0,n}, which admits raw
    # control characters (invalid JSON: json.loads rejects them). Forbid them, as its
    # unbounded string rule already does.
    ebnf = str(body)
    if _LOOSE_CHARS in ebnf:
        body = xg.Grammar.from_ebnf(ebnf.replace(_LOOSE_CHARS, _STRICT_CHARS))
    if hermes:
        body = xg.Grammar.concat(xg.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), body,
                                 xg.Grammar.from_ebnf('root ::= "\\n</tool_call>"'))
    return _compiler(tokenizer, vocab_size, stop_ids).compile_grammar(body)


def stop_token_ids(tokenizer) -> tuple:
    """`<|im_end|>` (when the vocabulary has it) and EOS: what may follow a complete call."""
    ids = set()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
        ids.add(im_end)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("tokenizer has neither <|im_end|> nor an EOS token")
    return tuple(sorted(ids))


@dataclass
class _Counters:
    mask_s: float = 0.0  # time in allowed_mask (fill + unpack)
    masks: int = 0
    advance_s: float = 0.0  # time in advance
    advances: int = 0


class ToolCallConstraint:
    """TokenConstraint (asymagent/decoding/constraint.py) for one schema-valid tool call.

    tokenizer: the model's HF tokenizer; tools: OpenAI-style tools; tool_choice: "required",
    "any", a tool name, or {"type": "function", "function": {"name": ...}}; vocab_size: the
    model's logits size (may exceed len(tokenizer); extra ids are never allowed);
    hermes: wrap in <tool_call> tags (default: detected from the chat template).
    """

    def __init__(self, tokenizer, tools: list, tool_choice="required", *,
                 vocab_size: int | None = None, hermes: bool | None = None):
        import xgrammar as xg

        self.tokenizer = tokenizer
        self.functions = selected_tools(tools, tool_choice)
        self.vocab_size = int(vocab_size or len(tokenizer))
        if self.vocab_size < len(tokenizer):
            raise ValueError(f"vocab_size {self.vocab_size} is smaller than the tokenizer "
                             f"({len(tokenizer)} tokens)")
        self.hermes = uses_hermes_format(tokenizer) if hermes is None else bool(hermes)
        self.stop_ids = stop_token_ids(tokenizer)
        self.schema = tool_call_schema(self.functions)
        try:
            compiled = _compiled(tokenizer, self.vocab_size, self.stop_ids,
                                 json.dumps(self.schema), self.hermes)
        except RuntimeError as exc:  # xgrammar refuses the schema (e.g. a `pattern` it cannot parse)
            detail = _XGRAMMAR_LOG_HEAD.sub("", str(exc)).strip()
            raise ToolSchemaError(f"a tool's parameters schema cannot be compiled into a "
                                  f"grammar: {detail}") from None
        self._matcher = xg.GrammarMatcher(compiled)
        self._bitmask = xg.allocate_token_bitmask(1, self.vocab_size)  # [1, ceil(V/32)] int32
        self._history: list[int] = []  # accepted token ids, for rollback bookkeeping
        self._forced: list[int] | None = None  # forced tokens at the current state (cache)
        self.counters = _Counters()

    # --- TokenConstraint protocol -------------------------------------------------------
    def allowed_mask(self) -> torch.Tensor:
        """[V] bool: tokens the grammar admits next (stop tokens once the call is complete)."""
        t0 = time.perf_counter()
        forced = self.forced_tokens()
        if forced or self._matcher.is_terminated():
            # Forced text has one canonical tokenisation, whoever decodes it. After the stop
            # token nothing may follow; engines may still read a mask there (a K+1 position).
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
            mask[forced[:1] if forced else list(self.stop_ids)] = True
            self.counters.mask_s += time.perf_counter() - t0
            self.counters.masks += 1
            return mask
        self._matcher.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask[0].numpy().astype("<i4", copy=False)  # [W], bit j of w <-> 32w+j
        # Little-endian words (forced above): byte b of word w holds tokens 32w+8b .. 32w+8b+7, low bit first.
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")  # [32W] uint8
        mask = torch.from_numpy(bits[: self.vocab_size].view(np.bool_))  # [V]
        self.counters.mask_s += time.perf_counter() - t0
        self.counters.masks += 1
        return mask

    def advance(self, token_id: int) -> bool:
        t0 = time.perf_counter()
        token_id = int(token_id)
        self._forced = None
        if self._matcher.is_terminated():
            # Extra stop tokens after the end are absorbed (a speculative round may emit one
            # at its bonus position); recorded as -1 so rollback stays exact.
            ok = token_id in self.stop_ids
            if ok:
                self._history.append(-1)
        else:
            ok = 0 <= token_id < self.vocab_size and self._matcher.accept_token(token_id)
            if ok:
                self._history.append(token_id)
        self.counters.advance_s += time.perf_counter() - t0
        self.counters.advances += 1
        return bool(ok)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens > len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens; "
                             f"{len(self._history)} were accepted")
        if num_tokens:
            self._forced = None
            real = sum(1 for t in self._history[-num_tokens:] if t >= 0)
            if real:
                self._matcher.rollback(real)
            del self._history[-num_tokens:]

    def forced_tokens(self) -> list[int]:
        if self._forced is None:  # computed once per matcher state (advance/rollback reset it)
            self._forced = self._compute_forced()
        return list(self._forced)

    def _compute_forced(self) -> list[int]:
        if self._matcher.is_terminated():
            return []
        if self._matcher.is_completed():
            # The call is closed: only stop tokens may follow. With a single stop token it is
            # forced too, so every decoding mode ends the call with the same token.
            return [self.stop_ids[0]] if len(self.stop_ids) == 1 else []
        forced = self._matcher.find_jump_forward_string()
        if not forced:
            return []
        ours = self.tokenizer.encode(forced, add_special_tokens=False)
        theirs = self._matcher.find_jump_forward_tokens()
        common: list[int] = []
        for a, b in zip(ours, theirs):
            if a != b:
                break
            common.append(int(a))
        if len(common) == len(ours):  # the string's last token could merge with what follows
            common = common[:-1]
        # Final check: every token must be accepted in sequence (then undo).
        accepted = 0
        for tok in common:
            if not self._matcher.accept_token(tok):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return common[:accepted]

    def is_terminated(self) -> bool:
        """The call is complete and the stop token after it accepted (nothing more may follow)."""
        return bool(self._matcher.is_terminated())

    def is_completed(self) -> bool:
        """The call object is closed (only stop tokens may follow)."""
        return bool(self._matcher.is_completed())

    # --- helpers ------------------------------------------------------------------------
    @property
    def num_accepted(self) -> int:
        return len(self._history)

    def text(self) -> str:
        return self.tokenizer.decode([t for t in self._history if t >= 0],
                                     skip_special_tokens=True)

    def overhead_us_per_token(self) -> float:
        """Mean microseconds spent in mask + advance per advanced token so far."""
        n = max(self.counters.advances, 1)
        return 1e6 * (self.counters.mask_s + self.counters.advance_s) / n

    def reset(self) -> None:
        self._matcher.reset()
        self._history.clear()
        self._forced = None


def parse_call(text: str, hermes: bool = False) -> dict:
    """Parse a constrained call's text back to {"name", "arguments"} (raises ValueError)."""
    body = text.strip()
    if hermes:
        if not (body.startswith("<tool_call>") and body.endswith("</tool_call>")):
            raise ValueError("not wrapped in <tool_call> tags")
        body = body[len("<tool_call>"): -len("</tool_call>")].strip()
    obj = json.loads(body)
    if not isinstance(obj, dict) or set(obj) != {"name", "arguments"}:
        raise ValueError(f"call object must have exactly name and arguments: {body[:200]}")
    return obj


def measure_overhead(tokenizer, tools: list, *, vocab_size: int | None = None,
                     calls: int = 20, seed: int = 0) -> dict:
    """Per-token cost of the constraint alone, on random grammar-valid calls (no model).

    Walks `calls` calls choosing uniformly among allowed tokens (a worst case for the
    matcher: many distinct states), timing mask + advance. Returns microseconds per token.
    """
    gen = torch.Generator().manual_seed(seed)
    mask_s = adv_s = 0.0
    tokens = 0
    for _ in range(calls):
        c = ToolCallConstraint(tokenizer, tools, "required", vocab_size=vocab_size)
        while not c.is_terminated() and c.num_accepted < 256:
            mask = c.allowed_mask()
            ids = mask.nonzero().flatten()  # [A]
            tok = int(ids[torch.randint(len(ids), (1,), generator=gen)])
            c.advance(tok)
        mask_s += c.counters.mask_s
        adv_s += c.counters.advance_s
        tokens += c.counters.advances
    return {"tokens": tokens, "mask_us": 1e6 * mask_s / max(tokens, 1),
            "advance_us": 1e6 * adv_s / max(tokens, 1),
            "total_us": 1e6 * (mask_s + adv_s) / max(tokens, 1)}
