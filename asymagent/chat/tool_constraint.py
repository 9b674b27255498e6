"""ToolCallConstraint: the grammar constraint that only admits schema-valid tool calls.

Grammar (one call): a JSON object `{"name": <tool name>, "arguments": <that tool's parameters>}`,
an anyOf over the tools (or only the named one), written with json.dumps' default separators
(`", "` and `": "`, no other whitespace) so that what the model emits looks exactly like the
history `chat_format` renders. Models whose chat template takes tools (Hermes style) get the
object wrapped as `<tool_call>\n{...}\n</tool_call>`; the embedded SmolLM2 emits the bare object.
Parallel calls (`parallel=True`, OpenAI's `parallel_tool_calls`): 1..MAX_PARALLEL_CALLS call
objects (or Hermes blocks) joined by `\n`, as chat_format renders an assistant message with
several `tool_calls`; the model ends the turn after any of them.
The matcher plumbing (masks, rollback, jump-forward, stop tokens, why xgrammar) is
`asymagent/chat/grammar_constraint.py`.
"""

from __future__ import annotations

import json

import torch

from asymagent.chat.grammar_constraint import (  # noqa: F401  (re-exported: old import paths)
    GrammarConstraint, json_schema_grammar, stop_token_ids, uses_hermes_format, xgrammar_error)
from asymagent.chat.ebnf_text import repeated_root
from asymagent.chat.schema_refs import ToolSchemaError, check_refs, has_refs, rebase_refs

TOOL_CHOICES = ("required", "any")
MAX_PARALLEL_CALLS = 8  # call objects one turn may hold when parallel tool calls are on


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


def hermes_wrapped(body):
    """`<tool_call>\n` + body + `\n</tool_call>` (the Hermes form of a call)."""
    import xgrammar as xg

    return xg.Grammar.concat(xg.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), body,
                             xg.Grammar.from_ebnf('root ::= "\\n</tool_call>"'))


def tool_call_grammar(schema_json: str, hermes: bool, max_calls: int = 1):
    """Grammar of one call object (`tool_call_schema`), Hermes-wrapped when `hermes`; with
    `max_calls` > 1, of 1..max_calls of them joined by `\n` (parallel calls)."""
    import xgrammar as xg

    body = json_schema_grammar(json.loads(schema_json))
    if max_calls == 1:
        return hermes_wrapped(body) if hermes else body
    before, after = ("<tool_call>\n", "\n</tool_call>") if hermes else ("", "")
    return xg.Grammar.from_ebnf(repeated_root(str(body), max_calls, separator="\n",
                                              before=before, after=after))


class ToolCallConstraint(GrammarConstraint):
    """TokenConstraint (asymagent/decoding/constraint.py) for one schema-valid tool call.

    tokenizer: the model's HF tokenizer; tools: OpenAI-style tools; tool_choice: "required",
    "any", a tool name, or {"type": "function", "function": {"name": ...}}; vocab_size: the
    model's logits size (may exceed len(tokenizer); extra ids are never allowed);
    hermes: wrap in <tool_call> tags (default: detected from the chat template); parallel:
    admit 1..MAX_PARALLEL_CALLS calls joined by newlines (default: exactly one).
    """

    @classmethod
    def build_grammar(cls, schema_json: str, hermes: bool, max_calls: int = 1):
        return tool_call_grammar(schema_json, hermes, max_calls)

    def __init__(self, tokenizer, tools: list, tool_choice="required", *,
                 vocab_size: int | None = None, hermes: bool | None = None,
                 parallel: bool = False):
        self.functions = selected_tools(tools, tool_choice)
        self.hermes = uses_hermes_format(tokenizer) if hermes is None else bool(hermes)
        self.schema = tool_call_schema(self.functions)
        self.max_calls = MAX_PARALLEL_CALLS if parallel else 1
        try:
            super().__init__(tokenizer, (json.dumps(self.schema), self.hermes, self.max_calls),
                             vocab_size=vocab_size)
        except RuntimeError as exc:  # xgrammar refuses the schema (e.g. a `pattern` it cannot parse)
            raise ToolSchemaError(f"a tool's parameters schema cannot be compiled into a "
                                  f"grammar: {xgrammar_error(exc)}") from None


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
