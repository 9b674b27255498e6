"""The Responses API's request model and its input items in the engine's chat terms (POST /v1/responses).

`input` is a string (one user message) or a list of items: messages (`role` user / system /
developer / assistant, content a string or `input_text` / `output_text` parts), `function_call`
(an earlier call of the model: becomes an assistant message's tool call, consecutive calls
merge into one message) and `function_call_output` (becomes a `tool` message). `instructions`
becomes a leading system message. Function tools are flat (`{"type": "function", "name",
"parameters", ...}`) and map to chat's nested shape; `text.format` maps to chat's
`response_format`. Anything else that would change the answer is refused with a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from asymagent.integrations.server.fields import (JsonSchemaFormat, SamplingFields,
                                                  reasoning_effort, verbosity)
from asymagent.integrations.server.schemas import ChatMessage, FunctionDef

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesTool(FunctionDef):
    """A function tool as the Responses API writes it (flat, no `function` wrapper)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, value):
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError(f"tool type {value.get('type')!r} is not supported (function "
                             "tools only)")
        return value

    def to_chat(self) -> dict:
        """The chat completions tool for this one, field for field as the chat path dumps its
        `ToolDef` (name, description, parameters, strict; None left out, in that order): the
        template renders the same prompt from either endpoint."""
        return {"type": "function",
                "function": self.model_dump(exclude_none=True, exclude={"type"})}


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: text, json_object, or json_schema (name, schema, strict, description)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None

    @model_validator(mode="after")
    def _schema(self):
        if self.type == "json_schema":
            if self.name is None or self.schema_ is None:
                raise ValueError("a json_schema format needs 'name' and 'schema'")
            JsonSchemaFormat(name=self.name, schema=self.schema_)  # the name's rules
        return self

    def to_engine(self) -> dict | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {
            "name": self.name, "schema": self.schema_, "strict": self.strict,
            "description": self.description}}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Optional[TextFormat] = None
    verbosity: Optional[str] = None  # accepted and echoed, no effect (fields.verbosity)

    @field_validator("verbosity")
    @classmethod
    def _verbosity(cls, value):
        return verbosity(value)


class ReasoningConfig(BaseModel):
    """Responses' `reasoning`: only what asks for no reasoning (the served model has none)."""

    model_config = ConfigDict(extra="forbid")
    effort: Optional[str] = None  # None or "none" (fields.reasoning_effort)
    summary: Optional[str] = None  # None or "auto": a summary of reasoning there is none of
    generate_summary: Optional[str] = None  # the deprecated name of `summary`

    @field_validator("effort")
    @classmethod
    def _effort(cls, value):
        return reasoning_effort(value)

    @field_validator("summary", "generate_summary")
    @classmethod
    def _summary(cls, value):
        if value not in (None, "auto"):
            raise ValueError(f"reasoning summary {value!r} asks for a summary of reasoning: "
                             "the served model has no reasoning mode")
        return value

    def echo(self) -> dict:
        """What the response object carries (as OpenAI echoes a request's reasoning)."""
        return {"effort": self.effort, "summary": self.summary or self.generate_summary}


class ResponseRequest(SamplingFields):
    """POST /v1/responses body (docs/serving.md, "Responses")."""

    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[ResponsesTool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedFunction]] = None
    parallel_tool_calls: Optional[bool] = None
    max_tool_calls: Optional[int] = Field(default=None, ge=1)
    text: Optional[TextConfig] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    store: Optional[bool] = None  # default true, as OpenAI: kept in a bounded in-memory store
    previous_response_id: Optional[str] = None
    # No effect on the answer (accepted so clients that always send them work):
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_retention: Optional[str] = None
    truncation: Optional[Literal["auto", "disabled"]] = None  # nothing is dropped: over -> 400
    include: Optional[list[str]] = None  # none of the includables exists here
    reasoning: Optional[ReasoningConfig] = None  # only what asks for no reasoning; echoed
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=0)  # log-probs: chat only
    background: Optional[bool] = None  # only false
    conversation: Optional[Any] = None  # refused: use previous_response_id
    prompt: Optional[Any] = None  # refused: no stored prompt templates

    @field_validator("n")
    @classmethod
    def _one_output(cls, value):
        if value != 1:
            raise ValueError("n is not a Responses API field: one output per response")
        return value

    @field_validator("background")
    @classmethod
    def _background(cls, value):
        if value:
            raise ValueError("background responses are not supported")
        return value

    @field_validator("conversation", "prompt")
    @classmethod
    def _refused(cls, value, info):
        if value is not None:
            why = {"conversation": "conversations are not supported; use previous_response_id",
                   "prompt": "stored prompt templates are not supported"}
            raise ValueError(why[info.field_name])
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value):
        names = [t.name for t in value or []]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        return value

    @model_validator(mode="after")
    def _choice_in_tools(self):
        names = [t.name for t in self.tools or []]
        if isinstance(self.tool_choice, NamedFunction) and self.tool_choice.name not in names:
            raise ValueError(f"tool_choice names function {self.tool_choice.name!r}, which is "
                             "not in 'tools'")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs 'tools'")
        return self

    def chat_tools(self) -> list[dict] | None:
        return [t.to_chat() for t in self.tools] if self.tools else None

    def engine_tool_choice(self):
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        if isinstance(self.tool_choice, NamedFunction):
            return {"type": "function", "function": {"name": self.tool_choice.name}}
        return self.tool_choice

    def max_calls(self) -> int | None:
        one = 1 if self.parallel_tool_calls is False else None
        caps = [c for c in (one, self.max_tool_calls) if c is not None]
        return min(caps) if caps else None


class InputError(ValueError):
    """An input item the server cannot read; `param` names it (`input.3.content.0.type`)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _text_of(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(where, "content must be a string or a list of text parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal":
            out.append(str(part.get("refusal", "")))
        elif kind in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:
            raise InputError(f"{where}.{j}.type", f"content part {kind!r} is not supported "
                                                  "(text parts only)")
    return "".join(out)


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise InputError(f"{where}.role", f"role must be one of {list(ROLES)}, got {role!r}")
    return {"role": "system" if role == "developer" else role,  # as chat's messages
            "content": _text_of(item.get("content", ""), f"{where}.content")}


def _call(item: dict, where: str) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise InputError(f"{where}.{key}", f"a function_call item needs a string {key!r}")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def input_messages(req: ResponseRequest) -> list[dict]:
    """The request's input as chat messages (checked like a chat request's messages)."""
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise InputError(where, "an input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(_call(item, where))
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InputError(f"{where}.call_id", "a function_call_output needs 'call_id'")
            output = item.get("output", "")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text_of(output, f"{where}.output")})
        elif kind == "reasoning":
            continue  # never produced here; a client replaying one loses nothing
        else:
            raise InputError(f"{where}.type", f"input item type {kind!r} is not supported "
                                              "(message, function_call, function_call_output)")
    for m in messages:  # the chat request's rules (roles, tool_call_id, non-empty)
        ChatMessage.model_validate(m)
    return messages
