"""The typed request: `SamplingParams` inside a `GenerationRequest`, validated once, carried to the Decoder.

Every face builds one `GenerationRequest` (the server's request model, ChatAsymSpec, Agent, the
CLI, or `Engine.chat` / `Engine.generate` from their keyword arguments) and the engine carries it
unchanged to the decode loop and the Decoder. Both dataclasses are frozen and check their fields
when built: a bad field raises `RequestError` (a ValueError) whose message names the field, so
each mistake has exactly one check and one message. What needs the engine (the vocabulary for
`logit_bias`, a drafter for a speculative mode, a tokenizer for stop strings) is checked by
`GenerationRequest.check_engine`, which the engine calls once per request.

    req = GenerationRequest(mode="asym", max_new_tokens=128,
                            sampling=SamplingParams(temperature=0.7, seed=1))
    engine.chat(messages, request=req)        # or engine.generate(prompt_ids, request=req)
    req.replace(max_new_tokens=16)            # a changed copy (validated again)

New knobs are added as fields with defaults (never by renaming one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from asymagent.spec_config import mode_of

MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs bound (asymagent/decoding/logprobs.py MAX_TOP)
TOOL_CHOICE_WORDS = (None, "auto", "none")  # tool_choice values that force no call


class RequestError(ValueError):
    """A bad request field; `field` names it and the message says what is wrong."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


def _number(name: str, value, kind=float):
    """`kind(value)` or a RequestError naming `name` (bools are not numbers here)."""
    if isinstance(value, bool) or value is None:
        raise RequestError(name, f"{name} must be a number, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise RequestError(name, f"{name} must be a number, got {value!r}") from None


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from the (fused) target row: every sampling knob of a request.

    temperature 0 is greedy (the argmax); at temperature > 0 the token at output position t is
    the Gumbel-max of the filtered row under noise keyed by (seed, t) (asymagent/decoding/noise.py):
    same seed, same output. top_p, top_k, min_p truncate softmax(row / T) (only when sampling);
    frequency/presence penalties and logit_bias ({token id: bias}) act on the verifier's rows
    as OpenAI defines them (asymagent/decoding/logit_processors.py). seed None: a fresh seed.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    seed: int | None = None
    frequency_penalty: float = 0.0  # OpenAI range -2..2
    presence_penalty: float = 0.0  # OpenAI range -2..2
    logit_bias: dict | None = None  # {token id: bias}, bias in -100..100
    repetition_penalty: float = 1.0  # vLLM's: > 0, 1 off (decoding/logit_processors.py)

    def __post_init__(self) -> None:
        put = object.__setattr__
        temperature = _number("temperature", self.temperature)
        if not temperature >= 0:
            raise RequestError("temperature", f"temperature must be >= 0, got {self.temperature!r}")
        put(self, "temperature", temperature)
        top_p = _number("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise RequestError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        put(self, "top_p", top_p)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError("top_k", f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        min_p = _number("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise RequestError("min_p", f"min_p must be in [0, 1], got {self.min_p!r}")
        put(self, "min_p", min_p)
        if self.seed is not None:
            put(self, "seed", _number("seed", self.seed, int))
        for name in ("frequency_penalty", "presence_penalty"):
            value = _number(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise RequestError(name, f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
            put(self, name, value)
        if self.logit_bias is not None:
            put(self, "logit_bias", self._bias(self.logit_bias))
        repetition = _number("repetition_penalty", self.repetition_penalty)
        if not repetition > 0:
            raise RequestError("repetition_penalty", f"repetition_penalty must be > 0, got "
                                                     f"{self.repetition_penalty!r}")
        put(self, "repetition_penalty", repetition)

    @staticmethod
    def _bias(logit_bias) -> dict:
        if not isinstance(logit_bias, dict):
            raise RequestError("logit_bias", f"logit_bias must be a {{token id: bias}} dict, "
                                             f"got {type(logit_bias).__name__}")
        out = {}
        for key, bias in logit_bias.items():
            try:  # JSON bodies carry the ids as strings
                token = None if isinstance(key, bool) else int(key)
            except (TypeError, ValueError):
                token = None
            if token is None or token < 0:
                raise RequestError("logit_bias", f"logit_bias token {key!r} is not a token id")
            value = _number("logit_bias", bias)
            if not -100.0 <= value <= 100.0:
                raise RequestError("logit_bias", f"logit_bias for token {token} must be in "
                                                 f"[-100, 100], got {bias!r}")
            out[token] = value
        return out

    @property
    def sampled(self) -> bool:
        """True at temperature > 0 (the Gumbel noise is read)."""
        return self.temperature > 0.0

    def check_vocab(self, vocab_size: int) -> None:
        """RequestError when a logit_bias token is outside [0, vocab_size)."""
        for token in self.logit_bias or {}:
            if token >= vocab_size:
                raise RequestError("logit_bias", f"logit_bias token {token!r} is not a token id "
                                                 f"in [0, {vocab_size})")


def _stops(stop) -> tuple:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not isinstance(s, str) or not s for s in stops):
        raise RequestError("stop", f"stop must be non-empty strings, got {list(stops)!r}")
    return stops


@dataclass(frozen=True)
class GenerationRequest:
    """What one request asks the engine for, besides its input (messages or prompt ids).

    `mode`: full | compressed | spec | asym. `stop`: strings that end the response (cut before
    them). Chat: `tools` (OpenAI function tools), `tool_choice` (auto | none | required | a named
    function: a forced call is decoded under a schema constraint), `response_format` (OpenAI
    json_object / json_schema). Token level: `constraint` (a TokenConstraint, decoding/constraint.py;
    chat builds its own from the three above). `logprobs`: None (off), how many top alternatives
    to keep per token (0..20), or a LogprobRecorder to read while streaming. `cache_key`: the
    conversation (its KV caches and views are reused by the next request with the same key).
    `callback(new_ids)`: called with each batch of emitted tokens while the request holds the
    engine's lock (streaming); returning False cancels. `parallel_tool_calls` (OpenAI's field):
    True lets a constrained turn hold 1..8 calls, False keeps at most one call (the first); None
    constrains to one call and keeps every call an unconstrained turn wrote.
    """

    mode: str = "asym"
    max_new_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple = ()
    tools: list | None = None
    tool_choice: Any = "auto"
    response_format: dict | None = None
    constraint: Any = None
    logprobs: Any = None
    cache_key: str = "default"
    callback: Callable | None = None
    parallel_tool_calls: bool | None = None  # OpenAI's: True 1..8 calls, False at most one
    chat_template_kwargs: dict | None = None  # extra chat-template variables (vLLM's), chat only
    # tokens a drafter that read the full view expects the response to be (attention keep's
    # look-ahead, asymagent/chat/session.py): offered as copied drafts by the suffix drafter,
    # so they change speed only, never the output
    draft_hint: tuple = ()

    def __post_init__(self) -> None:
        mode_of(self.mode)  # a ValueError naming the modes
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RequestError("max_new_tokens", f"max_new_tokens must be an integer >= 1, got {n!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise RequestError("sampling", f"sampling must be a SamplingParams, got "
                                           f"{type(self.sampling).__name__}")
        object.__setattr__(self, "stop", _stops(self.stop))
        if self.tool_choice not in TOOL_CHOICE_WORDS and not self.tools:
            raise RequestError("tool_choice", f"tool_choice={self.tool_choice!r} needs tools")
        lp = self.logprobs
        if lp is not None and not hasattr(lp, "record"):  # an int, or a LogprobRecorder
            if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS:
                raise RequestError("logprobs", f"top logprobs must be an integer in "
                                               f"[0, {MAX_TOP_LOGPROBS}], got {lp!r}")
        if self.parallel_tool_calls not in (None, True, False):
            raise RequestError("parallel_tool_calls", f"parallel_tool_calls must be true, false "
                                                      f"or null, got {self.parallel_tool_calls!r}")
        kw = self.chat_template_kwargs
        if kw is not None and (not isinstance(kw, dict) or not all(isinstance(k, str) for k in kw)):
            raise RequestError("chat_template_kwargs", f"chat_template_kwargs must be a dict with "
                                                       f"string keys, got {kw!r}")
        if not isinstance(self.cache_key, str):
            raise RequestError("cache_key", f"cache_key must be a string, got {self.cache_key!r}")

    @classmethod
    def build(cls, *, temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0,
              top_k: int = 0, min_p: float = 0.0, frequency_penalty: float = 0.0,
              presence_penalty: float = 0.0, logit_bias: dict | None = None,
              repetition_penalty: float = 1.0, **fields) -> "GenerationRequest":
        """A request from flat keywords (the sampling knobs beside the request's fields), as
        `Engine.chat` / `Engine.generate` and OpenAI-style bodies spell them."""
        sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                  seed=seed, frequency_penalty=frequency_penalty,
                                  presence_penalty=presence_penalty, logit_bias=logit_bias,
                                  repetition_penalty=repetition_penalty)
        return cls(sampling=sampling, **fields)

    def replace(self, **changes) -> "GenerationRequest":
        """A copy with `changes` (request fields, or sampling knobs by their own names)."""
        knobs = {f.name for f in dataclasses.fields(SamplingParams)}
        sampling = {k: changes.pop(k) for k in list(changes) if k in knobs}
        if sampling:
            changes["sampling"] = dataclasses.replace(changes.get("sampling", self.sampling),
                                                      **sampling)
        return dataclasses.replace(self, **changes)

    def check_engine(self, *, vocab_size: int, has_drafter: bool, has_tokenizer: bool) -> None:
        """What only the engine knows: a drafter for speculation, the vocabulary, a tokenizer."""
        if mode_of(self.mode).speculative and not has_drafter:
            raise RequestError("mode", f"mode {self.mode!r} needs a drafter; this engine has none "
                                       "(use mode 'full' or 'compressed', or pass drafter=)")
        self.sampling.check_vocab(vocab_size)
        if self.stop and not has_tokenizer:
            raise RequestError("stop", "stop strings need a tokenizer; this engine has none")
