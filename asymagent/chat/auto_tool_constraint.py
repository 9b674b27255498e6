"""AutoToolConstraint: tool_choice "auto" as a grammar: free text, or a call held to the tools from its marker on.

The structural-tag idea of xgrammar and vLLM: under "auto" the model writes free text, and when it
opens its family's own call marker the call is decoded under the tools' grammar until it closes.
The markers (asymagent/context/rendering.py writes calls the same way):
- templates that take `tools` (Hermes style, Qwen2.5/Qwen3): `<tool_call>\\n{"name": ...,
  "arguments": ...}\\n</tool_call>`; a bare call object `{"name"` is held the same way;
- templates that ignore `tools` (the embedded SmolLM2): the bare object `{"name": ...}`.
A call object opens the grammar wherever it starts, in free text or inside a tag the model opened
of its own accord (`<json>\\n{"name"`), compact or pretty-printed: `{` then no whitespace, a
space, or a line break with no, 2 or 4 spaces or a tab of indent, then `"name"` (OPENINGS; the
object then keeps that layout for its keys and may close with `}`, ` }` or `\\n}`).
Once the marker is written, the name must be one of the tools and the arguments valid against
that tool's parameters schema, written compact as json.dumps writes them (the forced grammar's form,
asymagent/chat/tool_constraint.py), so the text parses back to exactly one call. What the family
never writes in an answer cannot start in the free text: an echo of the tool list (`<tools>`), a
tool response (`<tool_response>`), a stray `</tool_call>`. A call doubled in braces, the form
Qwen2.5's template shows and its models copy (`{{'name': ...}}}`, `<{{name": ...}}}>`), is a call
marker too under Hermes templates: from `{{` + a name key in any spelling + `:` on
(asymagent/chat/doubled_calls.py) the rest is held, in that spelling, to a tool's name and
schema-valid JSON arguments, closed by `}}`; `{{ name }}` in an answer stays free text. Under
templates that ignore `tools` a doubled call `{{"` cannot start.
One call, then only the stop token (the turn ends, as under "required"); with `parallel`, free
text and further calls may follow. The matcher plumbing (masks, rollback, jump-forward, stop
tokens) is GrammarConstraint's, so speculation, batching and seeded sampling work as for a
forced call: drafts are masked and verified against the masked target.
"""

from __future__ import annotations

import json

from asymagent.chat.grammar_constraint import (GrammarConstraint, json_schema_grammar,
                                               uses_hermes_format, xgrammar_error)
from asymagent.chat.doubled_calls import CLOSINGS as DOUBLED_CLOSINGS
from asymagent.chat.doubled_calls import TRIGGERS as DOUBLED_TRIGGERS
from asymagent.chat.doubled_calls import call_head as doubled_head
from asymagent.chat.schema_refs import ToolSchemaError
from asymagent.chat.tool_constraint import selected_tools

HERMES_OPEN, HERMES_CLOSE = "<tool_call>\n", "\n</tool_call>"
BARE_TRIGGER = '{"name"'
# the whitespace a call object may open with, `{` + W + `"name"`: compact (json.dumps), one
# space, and pretty-printed with no, 2, 4 spaces or a tab of indent. The reference pair writes
# its calls pretty-printed inside a tag of its own (`<json>\n{\n  "name": ...`, 2026-12-07): with
# `{"name"` alone as the trigger such a call was never held
OPENINGS = ("", " ", "\n", "\n  ", "\n    ", "\n\t")
CLOSINGS = ["}", " }", "\n}"]  # how the call object may close (its arguments are compact)
# a call doubled in braces: held under Hermes templates (DOUBLED_TRIGGERS), refused otherwise
DOUBLED = ('{{"', '{{ "')
# prefixes, not whole tags: on the reference pair the 1.5B, kept from `<tools>`, wrote `<tools/>`
# over and over (2026-12-07, `serve --pair`): any `<tools...` / `<tool_response...` is refused
HERMES_EXCLUDES = ("<tools", "</tools", "<tool_response", "</tool_response", "</tool_call>")


def call_head(name: str, opening: str = "") -> str:
    """What a call to `name` starts with, up to its arguments: json.dumps' separators, or with
    the whitespace `opening` after `{` and between the keys (a pretty-printed object)."""
    between = opening or " "
    return "{" + opening + '"name": ' + json.dumps(name, ensure_ascii=False) + "," + between + \
        '"arguments": '


def auto_tool_structure(functions: list[dict], hermes: bool, parallel: bool) -> dict:
    """xgrammar structural tag (JSON-able): free text with triggered call tags, one tag per tool
    and form (Hermes block, bare object, doubled-brace object), arguments under the tool's
    parameters grammar."""
    tags, triggers = [], ["{" + w + '"name"' for w in OPENINGS]
    forms = [("", "")]
    if hermes:
        forms.insert(0, (HERMES_OPEN, HERMES_CLOSE))
        triggers[:0] = [HERMES_OPEN.strip(), *DOUBLED_TRIGGERS]
    for f in functions:
        args = {"type": "grammar", "grammar": str(json_schema_grammar(f["parameters"]))}
        for before, after in forms:
            for opening in OPENINGS:
                tags.append({"type": "tag", "begin": before + call_head(f["name"], opening),
                             "content": args, "end": [close + after for close in CLOSINGS]})
        for trigger in DOUBLED_TRIGGERS if hermes else ():
            tags.append({"type": "tag", "begin": doubled_head(trigger, f["name"]),
                         "content": args, "end": list(DOUBLED_CLOSINGS)})
    return {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": triggers, "tags": tags, "at_least_one": False,
        "stop_after_first": not parallel,
        "excludes": list(HERMES_EXCLUDES if hermes else DOUBLED)}}


class AutoToolConstraint(GrammarConstraint):
    """TokenConstraint (asymagent/decoding/constraint.py) for tool_choice "auto": free text, or a
    schema-valid call from its marker on (module docstring).

    tokenizer: the model's HF tokenizer; tools: OpenAI-style tools; vocab_size: the model's logits
    size; hermes: the call wrapping (default: detected from the chat template); parallel: further
    calls (and text) may follow a call (default: the turn ends after one).
    A tool schema xgrammar cannot compile is a ToolSchemaError.
    """

    @classmethod
    def build_grammar(cls, structure_json: str):
        import xgrammar as xg

        return xg.Grammar.from_structural_tag(structure_json)

    def __init__(self, tokenizer, tools: list, *, vocab_size: int | None = None,
                 hermes: bool | None = None, parallel: bool = False):
        self.functions = selected_tools(tools, "required")
        self.hermes = uses_hermes_format(tokenizer) if hermes is None else bool(hermes)
        self.parallel = bool(parallel)
        structure = auto_tool_structure(self.functions, self.hermes, self.parallel)
        try:
            super().__init__(tokenizer, (json.dumps(structure, sort_keys=True),),
                             vocab_size=vocab_size)
        except (RuntimeError, ValueError) as exc:  # xgrammar refuses a schema or the structure
            raise ToolSchemaError(f"the tools cannot be compiled into a call grammar: "
                                  f"{xgrammar_error(exc)}"[:500]) from None

    @property
    def tool_names(self) -> list[str]:
        return [f["name"] for f in self.functions]
