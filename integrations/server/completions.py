"""POST /v1/completions: OpenAI's text-completion endpoint (prompt string or token ids, streaming).

For eval harnesses that score and continue raw text (lm-evaluation-harness `local-completions`):
`prompt` is a string, a list of token ids, or a batch of either (served one after another, one
choice per prompt, `index` in order). The prompt is encoded with the tokenizer's defaults (special
tokens added as the tokenizer adds them) and decoded with `Engine.generate` in the request's mode;
there are no messages here, so nothing is compressed (the verifier reads the full prompt, ratio
1.0 in every mode). `echo` prepends the prompt text; `echo` with `logprobs` also scores the prompt
(`Engine.score`: the verifier's log-probability of each prompt token, the first `null`), and
`max_tokens: 0` with `echo` scores without generating (log-likelihood requests). Every sampling
field acts as in chat (fields.py); `suffix` and `best_of` > 1 are refused with a 400.
Every prompt runs on its own cache session per mode, "completions-<mode>", so prompts sharing a
prefix (few-shot examples) reuse its KV.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from fastapi import Request  # module level: FastAPI resolves the handler's annotations here
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field, field_validator, model_validator

from asymagent.decoding.logprobs import LogprobRecorder
from asymagent.request import GenerationRequest, RequestError
from asymagent.integrations.server.deltas import DeltaStreamer
from asymagent.integrations.server.errors import Failed
from asymagent.integrations.server.fields import SamplingFields, refuse
from asymagent.integrations.server.logprobs import completion_logprobs, visible
from asymagent.integrations.server.schemas import extension_for, finish_reason_for, usage_for
from asymagent.integrations.server.streaming import DONE, SSE_HEADERS, error_lines, relay

MAX_PROMPTS = 64  # prompts per request (served one after another)


class CompletionRequest(SamplingFields):
    """POST /v1/completions body (docs/serving.md has the table of every field)."""

    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: int = Field(default=16, ge=0)  # OpenAI's default; 0 only with echo
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: Optional[Any] = None
    best_of: Optional[int] = None

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, value):
        return refuse("suffix", value)

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value):
        return refuse("best_of", None if value == 1 else value)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        prompts = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) \
            else value
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise ValueError(f"give 1 to {MAX_PROMPTS} prompts")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("a prompt is empty")
        return value

    @model_validator(mode="after")
    def _zero_tokens(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be >= 1 (0 only with echo, to score the prompt)")
        return self

    def prompts(self) -> list:
        p = self.prompt
        return [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)


@dataclass
class CompletionTask:
    """One prompt for the engine worker: encode, score (echo + logprobs), generate."""

    prompt: Union[str, list]
    max_new_tokens: int
    request: GenerationRequest  # built once from the HTTP body (completion_task)
    echo: bool = False
    score_top: int | None = None  # echo + logprobs: score the prompt with this many alternatives
    recorder: LogprobRecorder | None = None
    ids: list = field(default_factory=list)
    prompt_text: str = ""
    prompt_logprobs: list = field(default_factory=list)
    where: str = "prompt"

    @property
    def cache_key(self) -> str:
        return self.request.cache_key

    def prompt_tokens(self, engine, chat_format=None) -> int:
        if isinstance(self.prompt, str):
            self.ids = list(engine.tokenizer.encode(self.prompt))
        else:
            bad = [t for t in self.prompt if not 0 <= t < engine.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids outside the vocabulary [0, "
                                 f"{engine.vocab_size}): {bad[:5]}")
            self.ids = list(self.prompt)
        if not self.ids:
            raise ValueError("the prompt encodes to no tokens")
        return len(self.ids)

    def verifier_tokens(self, engine) -> int | None:
        return None  # a completion's prompt has one view (the verifier reads all of it)

    def run(self, engine, callback):
        from asymagent.results import GenerationResult
        from asymagent.stats import StepStats

        if self.echo:
            self.prompt_text = self.prompt if isinstance(self.prompt, str) else \
                engine.tokenizer.decode(self.ids)
            if self.score_top is not None:
                self.prompt_logprobs = engine.score(self.ids, self.score_top)
        if self.max_new_tokens == 0:  # echo only: nothing generated
            return GenerationResult(token_ids=[], text="", stats=StepStats(
                mode=self.request.mode, full_context_tokens=len(self.ids),
                verifier_context_tokens=len(self.ids)), finish_reason="length", logprobs=[])
        return engine.run(self.ids, self.request.replace(callback=callback))

    def record(self, trace_writer, engine, result) -> None:
        """Text completions are not captured (a trace is a chat conversation)."""


def completions_cache_key(mode: str, prompt_cache_key: str | None) -> str:
    """The cache session of text completions: one per mode, or per mode and `prompt_cache_key`."""
    if prompt_cache_key is None:
        return f"completions-{mode}"
    return f"completions-{mode}-" + hashlib.sha256(prompt_cache_key.encode()).hexdigest()[:24]


def completion_task(req: CompletionRequest, prompt, mode: str, limits,
                    seed: int | None = None, eos_ids=()) -> CompletionTask:
    """The worker's task for one prompt and choice: its GenerationRequest, built once. Raises
    RequestError (-> 400) for a field the request refuses."""
    recorder = None if req.logprobs is None else LogprobRecorder(req.logprobs)
    request = GenerationRequest(
        mode=mode, max_new_tokens=max(req.max_tokens, 1),  # 0 (echo only) generates nothing
        sampling=req.sampling_params(limits.default_temperature, seed, eos_ids),
        stop=req.stop or (), logprobs=recorder,
        cache_key=completions_cache_key(mode, req.prompt_cache_key))
    return CompletionTask(prompt, req.max_tokens, request, echo=req.echo,
                          score_top=req.logprobs if req.echo else None, recorder=recorder)


def _sum_usage(usages: list[dict]) -> dict:
    """OpenAI's usage over several prompts: counts added (our per-prompt speculation
    extension fields stay in each choice's `asymagent` entry)."""
    out = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
           "prompt_tokens_details": {"cached_tokens": 0}}
    for u in usages:
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            out[key] += u[key]
        out["prompt_tokens_details"]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]
    return usages[0] if len(usages) == 1 else out


class Completions:
    """The handler of POST /v1/completions (one per app)."""

    def __init__(self, ctx):
        self.ctx = ctx

    async def create(self, req: CompletionRequest, request: Request):
        ctx = self.ctx
        refused = ctx.check_request(req)
        if refused is not None:
            return ctx.respond(refused)
        mode = req.mode or ctx.limits.default_mode
        cid = "cmpl-" + uuid.uuid4().hex[:24]
        # choices: each prompt's n samples in a row (index = prompt * n + i), as OpenAI orders them
        try:
            jobs = [ctx.new_job(completion_task(req, prompt, mode, ctx.limits, seed, ctx.stop_ids))
                    for prompt in req.prompts() for seed in req.choice_seeds()]
        except RequestError as exc:
            return ctx.respond(Failed(400, str(exc), param=exc.field, code="invalid_value"))
        # The first prompt starts before the answer does, so its errors get their own status.
        first = await ctx.start(jobs[0], request)
        if isinstance(first, Failed):
            return ctx.respond(first)
        if req.stream:
            stream = CompletionChunks(ctx, cid, mode, req)
            return StreamingResponse(stream.stream(jobs, first, request),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        choices, usages, exts = [], [], []
        for index, job in enumerate(jobs):
            if index:
                first = await ctx.start(job, request)
                if isinstance(first, Failed):
                    return ctx.respond(first)
            ev = await ctx.finished(job, request)
            if isinstance(ev, Failed):
                return ctx.respond(ev)
            choices.append(self.choice(index, job.task, ev.result))
            usages.append(usage_for(ev.result, first.prompt_tokens if index % req.n == 0 else 0))
            exts.append(extension_for(ev.result, mode))
        return JSONResponse({"id": cid, "object": "text_completion", "created": int(time.time()),
                             "model": ctx.model_name, "system_fingerprint": f"asymagent-{mode}",
                             "choices": choices, "usage": _sum_usage(usages),
                             "asymagent": exts[0] if len(exts) == 1 else exts})

    def choice(self, index: int, task: CompletionTask, result) -> dict:
        text = (task.prompt_text if task.echo else "") + result.text
        logprobs = None
        if task.recorder is not None:
            entries = (task.prompt_logprobs if task.echo else []) + \
                visible(result.logprobs, self.ctx.stop_ids)
            logprobs = completion_logprobs(self.ctx.texts, entries, 0)
        return {"index": index, "text": text, "logprobs": logprobs,
                "finish_reason": finish_reason_for(result)}


class CompletionChunks:
    """The SSE chunks of a streamed text completion, one prompt after another (an Encoder for
    streaming.relay, reset for each prompt)."""

    def __init__(self, ctx, cid: str, mode: str, req: CompletionRequest):
        self.ctx, self.cid, self.mode, self.stop, self.n = ctx, cid, mode, req.stop, req.n
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.created = int(time.time())
        self.usages: list[dict] = []
        self.closed = False

    def sse(self, index: int | None, text: str = "", finish: str | None = None,
            logprobs: dict | None = None, **extra) -> str:
        chunk = {"id": self.cid, "object": "text_completion", "created": self.created,
                 "model": self.ctx.model_name, "system_fingerprint": f"asymagent-{self.mode}",
                 "choices": [] if index is None else [
                     {"index": index, "text": text, "logprobs": logprobs,
                      "finish_reason": finish}]}
        chunk.update(extra)
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    async def stream(self, jobs: list, first, request):
        try:
            for index, job in enumerate(jobs):
                if index:
                    first = await self.ctx.start(job, request)
                    if isinstance(first, Failed):
                        if first.status != 499:  # the client is still there: tell it
                            self.ctx.count_error(first)
                            for line in error_lines(first):
                                yield line
                        return
                for line in self.begin(index, job.task, first.prompt_tokens):
                    yield line
                async for line in relay(self.ctx, job, request, self):
                    yield line
                if self.closed:
                    return
        finally:
            for job in jobs:
                job.cancel.set()  # a no-op once finished; stops generation if the client left
        if self.include_usage:
            yield self.sse(None, usage=_sum_usage(self.usages))
        yield DONE

    def begin(self, index: int, task: CompletionTask, prompt_tokens: int) -> list[str]:
        """Start the prompt `index`: its echo (with the prompt's log-probs) if asked for."""
        self.index, self.task, self.prompt_tokens = index, task, prompt_tokens
        self.streamer = DeltaStreamer(tools_enabled=False, stop=self.stop)
        self.offset, self.sent = 0, 0
        if not task.echo:
            return []
        logprobs = None if task.recorder is None else \
            completion_logprobs(self.ctx.texts, task.prompt_logprobs, 0)
        self.offset = len(task.prompt_text)
        return [self.sse(index, task.prompt_text, logprobs=logprobs)]

    def take(self, entries: list) -> dict | None:
        if self.task.recorder is None:
            return None
        out = completion_logprobs(self.ctx.texts, entries[self.sent:], self.offset)
        self.sent = max(self.sent, len(entries))
        self.offset += sum(len(t) for t in out["tokens"])
        return out

    # -- Encoder ------------------------------------------------------------------------------
    def text(self, event) -> list[str]:
        recorder, lines = self.task.recorder, []
        for delta in self.streamer.push(event.text):
            pool = [] if recorder is None else \
                visible(recorder.entries[: event.tokens], self.ctx.stop_ids)
            lines.append(self.sse(self.index, delta["content"], logprobs=self.take(pool)))
        return lines

    def finish(self, result, timed_out: bool) -> list[str]:
        if timed_out:
            return []
        rest = "".join(d.get("content", "") for d in self.streamer.finish(_AsText(result.text)))
        final = [] if self.task.recorder is None else visible(result.logprobs, self.ctx.stop_ids)
        self.usages.append(usage_for(result, self.prompt_tokens if self.index % self.n == 0
                                     else 0))
        return [self.sse(self.index, rest, finish_reason_for(result), self.take(final),
                         asymagent=extension_for(result, self.mode))]

    def error(self, failed: Failed) -> list[str]:
        return error_lines(failed)


@dataclass
class _AsText:
    """What DeltaStreamer.finish reads from a result: the text, no tool calls."""

    text: str
    tool_calls: list = field(default_factory=list)
