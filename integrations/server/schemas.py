"""Pydantic models for the OpenAI-compatible HTTP boundary: chat requests, responses, chunks, errors.

Requests are validated here so a bad request becomes a 400 with an OpenAI error body before it
reaches the engine (errors.py maps `RequestValidationError` to 400 and
names the offending field in `error.param`). Every request field is either implemented, refused
with a 400 naming it (`REFUSED`: what would change the answer but we cannot do), or, for the
few that cannot change an answer (`user`, `metadata`, `service_tier`, ...), accepted with no
effect; an unknown field is a 400 ("Unrecognized request argument"), as OpenAI answers.
docs/serving.md has the table of every field.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

from asymagent.chat.schema_refs import check_refs

from asymagent.integrations.server.fields import (ResponseFormat, SamplingFields,  # noqa: F401
                                                  StreamOptions, reasoning_effort, refuse,
                                                  verbosity)

MODES = ("full", "compressed", "spec", "asym")  # asymagent.spec_config.MODES (kept light here)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# What a dependency's error text may carry that a client must not see: log timestamps and
# source paths ("[10:27:10] /project/cpp/json_schema_converter.cc:5088: ").
_LOG_STAMP = re.compile(r"\[\d{2}:\d{2}:\d{2}\]\s*")
_SOURCE_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.+@~-]+)+\.(?:py|pyx|pxi|pyi|c|cc|cpp|cxx|h|hpp|"
                          r"cu|so|rs)(?::\d+)*:?\s*")


# ----------------------------------------------------------------------------- request side


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"  # a JSON string, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message; `role` is checked (an unknown role is a 400, not a silent drop)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, value):
        if isinstance(value, list):
            for part in value:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts ({'type': 'text', 'text': ...}) "
                                     "are supported")
        return value

    @model_validator(mode="after")
    def _role_rules(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs 'tool_call_id'")
        if self.role in ("system", "developer", "user") and self.content is None:
            raise ValueError(f"a '{self.role}' message needs 'content'")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("an 'assistant' message needs 'content' or 'tool_calls'")
        return self

    def text(self) -> str:
        """Content as plain text (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part["text"] for part in self.content)

    def to_engine(self) -> dict:
        """The OpenAI-style dict the engine's chat format renders."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _check_schema(schema: Any, path: str) -> None:
    """Structural JSON-schema check (enough to refuse what the tool-call grammar cannot compile)."""
    if not isinstance(schema, dict):
        raise ValueError(f"{path} must be a JSON schema object")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            raise ValueError(f"{path}.type {k!r} is not a JSON schema type")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ValueError(f"{path}.properties must be an object")
        for key, sub in props.items():
            _check_schema(sub, f"{path}.properties.{key}")
    required = schema.get("required")
    if required is not None:
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError(f"{path}.required must be a list of strings")
        missing = [r for r in required if props is None or r not in props]
        if missing:
            raise ValueError(f"{path}.required names undefined properties {missing}")
    if "items" in schema and not isinstance(schema["items"], (dict, bool)):
        raise ValueError(f"{path}.items must be a schema")
    if isinstance(schema.get("items"), dict):
        _check_schema(schema["items"], f"{path}.items")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{path}.enum must be a list")


class FunctionDef(BaseModel):
    name: str
    description: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                 "properties": {}})
    strict: Optional[bool] = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _TOOL_NAME.match(value):
            raise ValueError("function name must match ^[A-Za-z0-9_-]{1,64}$")
        return value

    @field_validator("parameters")
    @classmethod
    def _params(cls, value: dict) -> dict:
        if value.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON schema with type 'object'")
        check_refs(value)  # $ref targets exist, nesting is bounded, a finite instance exists
        _check_schema(value, "parameters")
        return value


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoiceFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedToolChoiceFunction


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions body (every field checked; docs/serving.md has the table)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    tools: Optional[list[ToolDef]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None  # false: at most one call is returned
    response_format: Optional[ResponseFormat] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    modalities: Optional[list[Literal["text"]]] = None  # only text
    store: Optional[bool] = None  # true is refused: nothing is stored
    # No effect on the answer (accepted so clients that always send them work):
    metadata: Optional[dict[str, str]] = None  # tags for stored completions; nothing is stored
    service_tier: Optional[str] = None  # one local tier
    safety_identifier: Optional[str] = None  # an end-user id for the caller's own records
    # Refused with a 400 naming the field (REFUSED says why):
    functions: Optional[Any] = None
    function_call: Optional[Any] = None
    audio: Optional[Any] = None
    prediction: Optional[Any] = None
    reasoning_effort: Optional[Any] = None  # only "none" (fields.reasoning_effort)
    web_search_options: Optional[Any] = None
    # Accepted, no effect (fields.verbosity): the served model has no verbosity setting
    verbosity: Optional[Any] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # vLLM's: extra template variables

    @field_validator("functions", "function_call", "audio", "prediction", "web_search_options")
    @classmethod
    def _refused(cls, value, info):
        return refuse(info.field_name, value)

    @field_validator("reasoning_effort")
    @classmethod
    def _reasoning_effort(cls, value):
        return reasoning_effort(value)

    @field_validator("verbosity")
    @classmethod
    def _verbosity(cls, value):
        return verbosity(value)

    @field_validator("store")
    @classmethod
    def _store(cls, value):
        if value:
            raise ValueError("store=true is not supported: this server stores no completions")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value, info):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return value

    def top_logprobs_count(self) -> int | None:
        """None without logprobs, else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value):
        names = [t.function.name for t in value or []]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_in_tools(cls, value, info: ValidationInfo):
        if "tools" not in info.data:  # tools itself was invalid (reported on its own)
            return value
        names = [t.function.name for t in info.data["tools"] or []]
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise ValueError(f"tool_choice names function {value.function.name!r}, which is "
                             "not in 'tools'")
        if value == "required" and not names:
            raise ValueError("tool_choice 'required' needs 'tools'")
        return value

    def engine_tool_choice(self):
        """tool_choice in the engine's terms ("auto" default when tools are given)."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.model_dump()
        return self.tool_choice

    def max_new_tokens(self, default: int | None) -> int | None:
        """The completion cap: the request's, else the server's (None: none, the context bounds it)."""
        return self.max_completion_tokens or self.max_tokens or default


# ---------------------------------------------------------------------------- response side


class Usage(BaseModel):
    """OpenAI usage plus extra speculation fields (allowed by the contract)."""

    model_config = ConfigDict(extra="allow")
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    refusal: Optional[str] = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    logprobs: Optional[dict[str, Any]] = None  # {"content": [...], "refusal": None}
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletion(BaseModel):
    model_config = ConfigDict(extra="allow")  # `asymagent` extension key carries StepStats
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[Choice]
    usage: Usage


class ChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, Any]
    logprobs: Optional[dict[str, Any]] = None
    finish_reason: Optional[Literal["stop", "length", "tool_calls"]] = None


class ChatCompletionChunk(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChunkChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "asymagent"
    max_model_len: Optional[int] = None  # vLLM's field: the context limit (prompt + completion)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None

    @field_validator("message")
    @classmethod
    def _no_internals(cls, value: str) -> str:
        """Strip log stamps and source paths a dependency's error text may carry."""
        return _SOURCE_PATH.sub("", _LOG_STAMP.sub("", value)).strip() or "error"


def lone_surrogate_at(value, path: str = "") -> str | None:
    """Dotted path of the first string holding a lone UTF-16 surrogate (JSON allows the escape
    `\\ud800`, but it is not Unicode text: it cannot be encoded, tokenised or hashed), else None."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return where or "body"
        elif isinstance(item, dict):
            stack += [(v, f"{where}.{k}" if where else str(k)) for k, v in item.items()]
            stack += [(k, where or "body") for k in item if isinstance(k, str)]
        elif isinstance(item, (list, tuple)):
            stack += [(v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(item)]
    return None


def body_parse_error(cause: BaseException) -> str:
    """What was wrong with a request body FastAPI could not decode (it says only 'There was an
    error parsing the body' and keeps the reason as the exception's cause)."""
    if isinstance(cause, UnicodeDecodeError):
        return (f"the request body is not valid UTF-8 ({cause.reason} at byte {cause.start}); "
                "JSON bodies must be UTF-8")
    if isinstance(cause, RecursionError):
        return "the request body's JSON is nested too deeply to parse"
    return f"the request body could not be read as JSON ({type(cause).__name__})"


class ErrorBody(BaseModel):
    error: ErrorDetail


# ------------------------------------------------------------- building response payloads


def _jsonable(value):
    """StepStats dicts as strict JSON (NaN/inf -> None, tensors/numpy -> Python numbers)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def usage_for(result, prompt_tokens: int) -> dict:
    """OpenAI usage: `prompt_tokens_details.cached_tokens` is the verifier's prefix reused from
    its KV cache; speculation appears as OpenAI's predicted-output counts (accepted / rejected
    draft tokens) and as our extension fields."""
    stats = result.stats
    completion = len(result.token_ids)
    return {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": int(stats.cached_tokens), "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": int(stats.accepted),
            "rejected_prediction_tokens": int(stats.drafted - stats.accepted)},
        "drafted_tokens": int(stats.drafted), "accepted_tokens": int(stats.accepted),
        "acceptance_rate": stats.accepted / stats.drafted if stats.drafted else 0.0,
        "mean_accepted_len": float(stats.mean_accepted_len),
        "compression_ratio": float(stats.compression_ratio),
        "verifier_context_tokens": int(stats.verifier_context_tokens),
    }


def extension_for(result, mode: str) -> dict:
    return {"mode": mode, "stats": _jsonable(result.stats.to_dict()),
            "invalid_tool_calls": _jsonable(list(getattr(result, "invalid_tool_calls", None) or []))}


def finish_reason_for(result, streamed_calls: bool = False) -> str:
    """OpenAI finish_reason: tool_calls for parsed calls, length when cut by max_tokens, else stop
    (a stream that already sent a call's name reports tool_calls, as the client saw one)."""
    if getattr(result, "tool_calls", None):  # a GenerationResult (/v1/completions) has none
        return "tool_calls"
    if result.finish_reason == "length":
        return "length"
    return "tool_calls" if streamed_calls else "stop"
