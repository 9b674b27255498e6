"""Chat format: OpenAI-style messages + tools -> append-stable token segments; model text -> calls.

`ChatFormat` is the context layer's `MessageRenderer` (asymagent/context/rendering.py: every
message its own token segment rendered with the tokenizer's chat template, tools listed or
passed to the template, assistant calls written as the model is asked to write them) plus
`parse_output` (asymagent/chat/output_parsing.py: model text -> content + tool calls + invalid
calls, never raises). The rendering helpers are re-exported here under their old names.
"""

from __future__ import annotations

from asymagent.chat.output_parsing import ParsedOutput, new_call_id, parse_output  # noqa: F401 (re-exported)
from asymagent.context.rendering import (  # noqa: F401 (re-exported)
    TOOL_INSTRUCTION,
    TOOL_INSTRUCTION_NAME_SIG,
    MessageRenderer,
    Segment,
    call_json,
    function_of,
    message_text,
    name_signature,
    strip_descriptions,
    tool_prompt,
)


class ChatFormat(MessageRenderer):
    """How messages and tools render to tokens (MessageRenderer) and how output parses."""

    def parse_output(self, text: str, tool_names: list | None = None) -> ParsedOutput:
        """Split model output into content and tool calls; never raises (see `parse_output`);
        `tool_names`: the offered tools a call must name (None: any)."""
        return parse_output(text, tool_names)
