"""What `Engine.generate` and `Engine.chat` return (GenerationResult, ChatResult)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asymagent.stats import StepStats


@dataclass
class GenerationResult:
    """What `Engine.generate` returns."""

    token_ids: list  # list[int], new tokens only (a final EOS included, cut at a stop string)
    text: str
    stats: StepStats
    finish_reason: str  # stop | length | tool_calls | cancelled
    logprobs: list | None = None  # list[TokenLogprob] per token_ids entry, when asked for


@dataclass
class ChatResult(GenerationResult):
    """What `Engine.chat` returns: `text` is the content without the tool-call JSON."""

    tool_calls: list = field(default_factory=list)  # OpenAI shape
    invalid_tool_calls: list = field(default_factory=list)  # LangChain shape
