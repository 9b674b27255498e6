"""Who answers an AgentDojo step: the engine under one mode label (or, in tests, a script).

A *responder* is `respond(messages, tools) -> Turn`: OpenAI-format history and tool schemas in,
one assistant turn out. `EngineResponder` is `Engine.chat` under a mode label as the other evals
write them (`asym`, `asym:acceptance=cda,strict_prefix=16`) plus an optional `@PRESET` (a
CompressionConfig preset for the verifier's view, as the frontier's `asym@id_keep_192`), greedy,
`tool_choice="auto"` (the model decides between a call and an answer, in its own call format),
one cache session per responder (prefix reuse from step to step, as an agent loop has it).
A view over the model's window raises `OverWindow`, which the episode records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class OverWindow(Exception):
    """The verifier's view of this step is longer than the model's context window."""


@dataclass
class Turn:
    """One assistant turn: its text, its OpenAI tool calls, and what it cost."""

    text: str
    tool_calls: list = field(default_factory=list)  # OpenAI shape
    token_ids: list = field(default_factory=list)
    stats: object = None  # asymagent.stats.StepStats (None for a scripted responder)
    call_s: float = 0.0
    invalid_tool_calls: list = field(default_factory=list)  # calls the engine's parser could not read


def split_label(label: str) -> tuple:
    """'asym:k=4@id_keep_192' -> ('asym:k=4', 'id_keep_192'); no '@' -> (label, None)."""
    mode_label, at, preset = label.rpartition("@")
    return (mode_label, preset) if at else (label, None)


def check_label(label: str) -> None:
    """ValueError for a bad mode label or an unknown preset (before any model loads)."""
    from asymagent.context.views import CompressionConfig
    from asymagent.evals.running.runner import parse_mode

    mode_label, preset = split_label(label)
    parse_mode(mode_label)
    if preset is not None:
        CompressionConfig.preset(preset)


class EngineResponder:
    """`Engine.chat` under `label` on the cache session `cache_key` (dropped by `reset`)."""

    def __init__(self, engine, label: str, cache_key: str, max_new_tokens: int = 256) -> None:
        from asymagent.context.views import CompressionConfig
        from asymagent.evals.running.runner import parse_mode

        self.engine, self.label, self.cache_key, self.max_new_tokens = engine, label, cache_key, max_new_tokens
        mode_label, preset = split_label(label)
        self.mode, self.overrides = parse_mode(mode_label)
        self.compression = CompressionConfig.preset(preset) if preset else None

    def reset(self) -> None:
        """Cold session: no prefix reuse from an earlier episode, an empty suffix store."""
        from asymagent.evals.running.engine_setup import use_suffix_store

        self.engine.caches.drop(self.cache_key)
        use_suffix_store(self.engine, self.cache_key)
        self.engine.suffix_store.clear()

    def __call__(self, messages: list, tools: list) -> Turn:
        from asymagent.engine import ContextLengthError
        from asymagent.evals.running.engine_setup import use_suffix_store
        from asymagent.evals.running.runner import spec_overrides
        from asymagent.request import GenerationRequest

        engine = self.engine
        use_suffix_store(engine, self.cache_key)  # each label copies only its own earlier responses
        saved = engine.compression
        if self.compression is not None:
            engine.compression = self.compression  # read when the session's views are created
        request = GenerationRequest(mode=self.mode, max_new_tokens=self.max_new_tokens, tools=tools or None,
                                    tool_choice="auto", cache_key=self.cache_key)
        try:
            with spec_overrides(engine, self.overrides):
                t0 = time.perf_counter()
                r = engine.chat(messages, request=request)
                secs = time.perf_counter() - t0
        except ContextLengthError as exc:
            raise OverWindow(str(exc)) from exc
        finally:
            engine.compression = saved
        return Turn(r.text or "", list(r.tool_calls), list(r.token_ids), r.stats, secs,
                    list(r.invalid_tool_calls))
