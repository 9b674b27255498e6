"""Request fields shared by /v1/chat/completions and /v1/completions: sampling, stream options,
response_format, and the fields we refuse.

The policy (docs/serving.md has the table of every field): a field is implemented, or refused
with a 400 naming it (`REFUSED`, the reason in the message), or, where it cannot change an
answer, accepted with no effect; unknown fields are a 400 (`extra="forbid"`).
"""

from __future__ import annotations

import secrets
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from asymagent.request import SamplingParams

MIN_SAMPLING_TEMPERATURE = 1e-4  # smaller positive temperatures decode greedily (see below)
MIN_TOP_P = 1e-6
MAX_CHOICES = 8  # n: choices are generated one after another on one CPU worker


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    include_obfuscation: Optional[bool] = None  # no effect: nothing pads our chunks


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: Optional[str] = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    """OpenAI response_format: text, json_object, or json_schema (decoded under a grammar)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _needs_schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' is required with type 'json_schema' and only then")
        return self

    def to_engine(self) -> dict | None:
        """The engine's response_format dict (None for text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": self.json_schema.model_dump(by_alias=True)}


# Fields OpenAI defines that would change the answer but that we do not implement: a 400 naming
# the field (never accepted and ignored). Value: why.
REFUSED = {
    "functions": "the legacy 'functions' API is not supported; use 'tools'",
    "function_call": "the legacy 'function_call' is not supported; use 'tool_choice'",
    "audio": "audio output is not supported (text only)",
    "prediction": "predicted outputs are not supported (speculation drafts are the engine's own)",
    "reasoning_effort": "the served model has no reasoning mode (only 'none' is accepted)",
    "web_search_options": "web search is not supported",
    "best_of": "best_of > 1 is not supported: one completion per request",
    "suffix": "suffix (insertion) is not supported",
}


# Values that ask the served model for nothing it lacks (accepted, ignored, echoed where the API
# echoes them): a reasoning effort of "none" (OpenAI's value for "do not reason"; the openai-agents
# SDK sends it by default) and any text verbosity (a length hint; OpenAI's default is "medium").
NEUTRAL_EFFORT = ("none",)
VERBOSITY = ("low", "medium", "high")


def reasoning_effort(value):
    """A reasoning effort the served model can honour: None or "none"; anything else asks for
    reasoning, which it has not (400 naming the field)."""
    if value is not None and value not in NEUTRAL_EFFORT:
        raise ValueError(f"reasoning effort {value!r} asks for reasoning: "
                         f"{REFUSED['reasoning_effort']}")
    return value


def verbosity(value):
    """A text verbosity: one of VERBOSITY (accepted and ignored) or None."""
    if value is not None and value not in VERBOSITY:
        raise ValueError(f"verbosity must be one of {list(VERBOSITY)}, got {value!r}")
    return value


def refuse(name: str, value):
    """Raise the 400 of a REFUSED field that was given a value that would matter."""
    if value is not None:
        raise ValueError(REFUSED[name])
    return value


def token_bias(value: dict | None) -> dict | None:
    """logit_bias keys are token ids as strings (OpenAI); values in [-100, 100]."""
    if value is None:
        return None
    out = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        if token < 0 or not -100.0 <= float(bias) <= 100.0:
            raise ValueError(f"logit_bias {key!r}: {bias!r} needs a token id >= 0 and a bias "
                             "in [-100, 100]")
        out[token] = float(bias)
    return out


class SamplingFields(BaseModel):
    """Sampling fields shared by /v1/chat/completions and /v1/completions (see docs/serving.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    # OpenAI's range; None -> the server's default (greedy 0.0 unless --temperature says otherwise)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=-1)  # vLLM extension; -1 or 0: off
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)  # vLLM extension
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)  # choice i samples with seed + i
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    mode: Optional[Literal["full", "compressed", "spec", "asym"]] = None  # extension
    user: Optional[str] = None  # no effect: an end-user id for the caller's own records
    # OpenAI's name for a conversation: the engine cache session (and a router's affinity key)
    prompt_cache_key: Optional[str] = Field(default=None, max_length=1024)
    ignore_eos: bool = False  # vLLM extension: the end tokens are masked, so it runs to max_tokens
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0, le=10.0)  # vLLM extension

    @field_validator("temperature")
    @classmethod
    def _tiny_temperature_is_greedy(cls, value):
        # Below 1e-4 softmax(logits / T) is the argmax to float precision, and dividing by T
        # overflows float32 (NaN probabilities): decode greedily, the same distribution.
        return 0.0 if value is not None and value < MIN_SAMPLING_TEMPERATURE else value

    @field_validator("top_p")
    @classmethod
    def _tiny_top_p_keeps_the_top_token(cls, value):
        # A nucleus of mass 1e-6 is already the top token alone; smaller values round to 0 in
        # float32, and a zero nucleus would drop every token.
        return max(value, MIN_TOP_P)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        if isinstance(value, str):
            value = [value]
        if value is not None:
            if len(value) > 4:
                raise ValueError("at most 4 stop sequences")
            if any(not s for s in value):
                raise ValueError("stop sequences must be non-empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value):
        token_bias(value)
        return value

    @field_validator("stream_options")
    @classmethod
    def _options_need_stream(cls, value, info: ValidationInfo):
        # a field validator (after `stream`), so that the error's `param` names the field
        if value is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def choice_seeds(self) -> list[int | None]:
        """The seed of each of the n choices: `seed + i` (a random base without a seed), so
        choice 0 is the n=1 answer and a seeded request repeats; n=1 keeps `seed` as given."""
        if self.n == 1:
            return [self.seed]
        base = self.seed if self.seed is not None else secrets.randbits(62)
        return [base + i for i in range(self.n)]

    def sampling_params(self, default_temperature: float, seed: int | None,
                        eos_ids=()) -> SamplingParams:
        """The engine's SamplingParams (asymagent/request.py), built once per choice: the
        server's temperature when the request has none, the choice's `seed`; with `ignore_eos`
        the end tokens `eos_ids` get a bias of -100 (never chosen unless a grammar forces one)."""
        bias = token_bias(self.logit_bias)
        if self.ignore_eos and eos_ids:
            bias = {**(bias or {}), **{int(t): -100.0 for t in eos_ids}}
        return SamplingParams(
            temperature=default_temperature if self.temperature is None else self.temperature,
            top_p=self.top_p, top_k=max(self.top_k or 0, 0), min_p=self.min_p or 0.0,
            seed=seed, frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty, logit_bias=bias,
            repetition_penalty=1.0 if self.repetition_penalty is None
            else self.repetition_penalty)
