"""ResponseFormatConstraint: OpenAI `response_format` (json_object, json_schema) as a grammar constraint.

`response_format` is OpenAI's dict: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
(any JSON object) or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (a
JSON value valid against `schema`). The answer is decoded under an xgrammar grammar (the
machinery of tool calls, asymagent/chat/grammar_constraint.py), so it is valid JSON whatever the
model, and speculation and jump-forward (keys, punctuation) apply as for tool calls. The grammar
is strict whether or not `strict` is set: no property the schema does not name is generated
(`additionalProperties` true in the schema allows them), so the output always validates.

With tools under tool_choice "auto", the grammar is the union of the format and one tool call
(1..MAX_PARALLEL_CALLS calls with `parallel`), so the model may still call tools (`split_output`
tells which it wrote); a forced call
(tool_choice "required"/named) is decoded under `ToolCallConstraint` instead.
"""

from __future__ import annotations

import json

from asymagent.chat.grammar_constraint import (GrammarConstraint, json_schema_grammar,
                                               uses_hermes_format, xgrammar_error)
from asymagent.chat.output_parsing import ParsedOutput, parse_output
from asymagent.chat.schema_refs import ToolSchemaError, check_refs
from asymagent.chat.tool_constraint import (MAX_PARALLEL_CALLS, selected_tools, tool_call_grammar,
                                            tool_call_schema)

FORMAT_TYPES = ("text", "json_object", "json_schema")
_ANY_OBJECT = {"type": "object"}


def format_schema(response_format) -> dict | None:
    """The JSON schema `response_format` asks for; None for text (or no format). Raises a
    ValueError naming what is wrong with a malformed format."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or response_format.get("type") not in FORMAT_TYPES:
        raise ValueError(f"response_format must be a dict with type one of {FORMAT_TYPES}, "
                         f"got {response_format!r}"[:300])
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return _ANY_OBJECT
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("response_format type 'json_schema' needs 'json_schema': "
                         "{'name': ..., 'schema': {...}}")
    schema = spec.get("schema", {})  # OpenAI: an absent schema means any JSON value
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be a JSON schema object")
    return schema


class ResponseFormatConstraint(GrammarConstraint):
    """TokenConstraint for an answer in `response_format` (or, with `tools`, one tool call).

    tokenizer: the model's HF tokenizer; response_format: OpenAI's dict (not text); tools:
    OpenAI tools the model may call instead (tool_choice "auto"), or None; vocab_size: the
    model's logits size; hermes: the call wrapping (default: detected from the chat template);
    parallel: the calls may be 1..MAX_PARALLEL_CALLS (default: one).
    A schema xgrammar cannot compile is a ValueError.
    """

    @classmethod
    def build_grammar(cls, schema_json: str, strict: bool, calls_json: str | None, hermes: bool,
                      max_calls: int = 1):
        import xgrammar as xg

        body = json_schema_grammar(json.loads(schema_json), strict=strict)
        if calls_json is None:
            return body
        return xg.Grammar.union(body, tool_call_grammar(calls_json, hermes, max_calls))

    def __init__(self, tokenizer, response_format: dict, *, tools: list | None = None,
                 vocab_size: int | None = None, hermes: bool | None = None,
                 parallel: bool = False):
        schema = format_schema(response_format)
        if schema is None:
            raise ValueError("response_format type 'text' needs no constraint")
        try:  # refs that resolve, a finite instance: xgrammar loops forever on some others
            check_refs(schema, "response_format schema")
        except ToolSchemaError as exc:  # the format's fault, not a tool's
            raise ValueError(str(exc)) from None
        self.schema = schema
        # json_object is any object (xgrammar's non-strict mode); a given schema is strict
        strict = schema is not _ANY_OBJECT
        self.functions = selected_tools(tools, "required") if tools else []
        self.hermes = uses_hermes_format(tokenizer) if hermes is None else bool(hermes)
        calls = json.dumps(tool_call_schema(self.functions)) if self.functions else None
        self.max_calls = MAX_PARALLEL_CALLS if parallel else 1
        try:
            super().__init__(tokenizer, (json.dumps(schema), strict, calls, self.hermes,
                                         self.max_calls), vocab_size=vocab_size)
        except RuntimeError as exc:  # xgrammar's error for a schema it cannot compile
            raise ValueError(f"response_format schema cannot be compiled into a grammar: "
                             f"{xgrammar_error(exc)}"[:500]) from None


def split_output(text: str, tool_names: list[str], max_calls: int = 1) -> ParsedOutput:
    """What a model decoding under a ResponseFormatConstraint wrote: 1..max_calls calls to
    tools in `tool_names`, or else the answer (the whole text as content, never an invalid call:
    a format object whose first key happens to be "name" is an answer, not a broken call)."""
    if tool_names:
        parsed = parse_output(text)
        if 1 <= len(parsed.tool_calls) <= max_calls and not parsed.content and \
                not parsed.invalid_tool_calls and \
                all(c["function"]["name"] in tool_names for c in parsed.tool_calls):
            return parsed
    return ParsedOutput(content=text.strip())
