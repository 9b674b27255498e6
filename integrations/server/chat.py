"""POST /v1/chat/completions: the request as a ChatTask for the worker, the answer, its SSE chunks.

Tools (tool_choice none/auto/required/named), response_format, logprobs, every sampling field
(fields.py), stream with stream_options.include_usage, the extension field `mode`. Each
conversation gets its own engine cache session (`cache_key_for`: a hash of the tools, the mode
and the messages up to the first user message), so an agent resending a growing conversation
reuses its KV prefix. The answer carries the engine's StepStats under the extension key
`asymagent`; `usage` the speculation counts (schemas.usage_for).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field

from fastapi import Request  # module level: FastAPI resolves the handler's annotations here
from fastapi.responses import JSONResponse, StreamingResponse

from asymagent.decoding.logprobs import LogprobRecorder
from asymagent.request import GenerationRequest, RequestError
from asymagent.integrations.server import schemas as S
from asymagent.integrations.server.deltas import DeltaStreamer
from asymagent.integrations.server.errors import Failed
from asymagent.integrations.server.logprobs import chat_content, visible
from asymagent.integrations.server.schemas import extension_for, finish_reason_for, usage_for
from asymagent.integrations.server.streaming import DONE, SSE_HEADERS, error_lines, relay
from asymagent.chat.session import verifier_view_tokens
from asymagent.integrations.server.worker import count_prompt_tokens

# A request without a completion cap (OpenAI's and vLLM's default) runs to the end token or the
# context limit: the worker caps it at the room the context leaves once it knows the prompt
# (ChatTask.cap); this bound holds only where the model declares no context limit.
UNCAPPED = 32768


def cache_key_for(messages: list[dict], tools: list | None, mode: str,
                  prompt_cache_key: str | None = None, template_kwargs: dict | None = None) -> str:
    """Conversation identity: tools, mode and every message up to and including the first user
    message. Later turns of the same agent conversation keep that prefix, so they share a session.
    A client's `prompt_cache_key` (OpenAI's name for a conversation) replaces the messages;
    chat-template variables render other tokens, so they are part of it."""
    head = []
    for message in messages:
        head.append(message)
        if message.get("role") == "user":
            break
    ident = {"m": head} if prompt_cache_key is None else {"k": prompt_cache_key}
    if template_kwargs:
        ident["ct"] = template_kwargs
    blob = json.dumps({**ident, "t": tools, "mode": mode}, sort_keys=True, ensure_ascii=False,
                      default=str)
    return "conv-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclass
class ChatTask:
    """One chat turn for the engine worker: `Engine.chat` on the messages with its typed request."""

    messages: list[dict]
    request: GenerationRequest  # built once from the HTTP body (chat_task)
    where: str = "messages"
    call_prefix: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:22])
    uncapped: bool = False  # no cap asked: the worker sets the room the context leaves (`cap`)

    @property
    def mode(self) -> str:
        return self.request.mode

    @property
    def tools(self) -> list[dict] | None:
        return self.request.tools

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def cache_key(self) -> str:
        return self.request.cache_key

    def cap(self, max_new_tokens: int) -> None:
        """Bound the completion (the worker, once it knows the prompt's length)."""
        self.request = self.request.replace(max_new_tokens=max_new_tokens)

    def call_id(self, index: int) -> str:
        """The id of this turn's tool call at `index`: the same in the stream, the answer and
        the trace (the engine's own ids are replaced with these)."""
        return f"{self.call_prefix}{index:02d}"

    def prompt_tokens(self, engine, chat_format) -> int:
        kwargs = self.request.chat_template_kwargs
        if kwargs:  # rendered as the engine will render it
            chat_format = engine.chat_format_for(kwargs)
        return count_prompt_tokens(chat_format, self.messages, self.tools)

    def verifier_tokens(self, engine) -> int | None:
        return verifier_view_tokens(engine, self.messages, self.request)

    def run(self, engine, callback):
        result = engine.chat(messages=self.messages,
                             request=self.request.replace(callback=callback))
        for index, call in enumerate(getattr(result, "tool_calls", None) or []):
            call["id"] = self.call_id(index)
        return result

    def record(self, trace_writer, engine, result) -> None:
        trace_writer.record(engine, self.messages, self.tools, result, source="serve",
                            mode=self.mode, temperature=self.request.sampling.temperature)


@dataclass
class Turn:
    """What a chat-shaped request asks the engine for, in the engine's terms (chat.py builds it
    from a chat completion request, responses.py from a Responses request)."""

    messages: list[dict]
    tools: list[dict] | None  # OpenAI chat tool dicts
    tool_choice: object  # "none" | "auto" | "required" | {"type": "function", "function": ...}
    response_format: dict | None
    max_new_tokens: int | None  # None: no cap asked (the worker bounds it by the context)
    prompt_cache_key: str | None = None
    parallel_tool_calls: bool | None = None  # the request's; OpenAI's default (None) is true
    chat_template_kwargs: dict | None = None  # vLLM's: extra variables for the chat template


def chat_task(turn: Turn, sampling: S.SamplingFields, limits, recorder,
              seed: int | None = None, eos_ids=()) -> ChatTask:
    """The worker's task for a turn: its GenerationRequest, built once (the server's defaults
    where the request is silent); `seed` the choice's (SamplingFields.choice_seeds), `eos_ids`
    the engine's end tokens. Raises RequestError (-> 400) for a field the request refuses."""
    mode = sampling.mode or limits.default_mode
    engine_tools = turn.tools if turn.tool_choice != "none" else None
    request = GenerationRequest(
        mode=mode, max_new_tokens=turn.max_new_tokens or UNCAPPED,
        sampling=sampling.sampling_params(limits.default_temperature, seed, eos_ids),
        stop=sampling.stop or (), tools=engine_tools,
        tool_choice=turn.tool_choice if engine_tools else "auto",
        response_format=turn.response_format, logprobs=recorder,
        cache_key=cache_key_for(turn.messages, engine_tools, mode, turn.prompt_cache_key,
                                turn.chat_template_kwargs),
        parallel_tool_calls=turn.parallel_tool_calls is not False,
        chat_template_kwargs=turn.chat_template_kwargs or None)
    return ChatTask(turn.messages, request, uncapped=turn.max_new_tokens is None)


def chat_turn(req: S.ChatCompletionRequest, limits) -> Turn:
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    return Turn([m.to_engine() for m in req.messages], tools, req.engine_tool_choice(),
                req.response_format.to_engine() if req.response_format else None,
                req.max_new_tokens(limits.default_max_tokens), req.prompt_cache_key,
                req.parallel_tool_calls, req.chat_template_kwargs)


def choices_usage(results: list, prompt_tokens: int) -> dict:
    """OpenAI's usage over n choices of one prompt: the prompt once, the completions added."""
    usage = usage_for(results[0], prompt_tokens)
    for result in results[1:]:
        more = usage_for(result, prompt_tokens)
        for key in ("completion_tokens", "drafted_tokens", "accepted_tokens"):
            usage[key] += more[key]
        for key in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
            usage["completion_tokens_details"][key] += more["completion_tokens_details"][key]
    usage["total_tokens"] = prompt_tokens + usage["completion_tokens"]
    drafted = usage["drafted_tokens"]
    usage["acceptance_rate"] = usage["accepted_tokens"] / drafted if drafted else 0.0
    return usage


class ChatCompletions:
    """The handler of POST /v1/chat/completions (one per app). `n` choices run one after
    another on the conversation's cache session, choice i with seed `seed + i`."""

    def __init__(self, ctx):
        self.ctx = ctx

    def tasks(self, req: S.ChatCompletionRequest) -> list[ChatTask] | Failed:
        turn, top = chat_turn(req, self.ctx.limits), req.top_logprobs_count()
        try:
            return [chat_task(turn, req, self.ctx.limits,
                              None if top is None else LogprobRecorder(top), seed,
                              self.ctx.stop_ids)
                    for seed in req.choice_seeds()]
        except RequestError as exc:
            return Failed(400, str(exc), param=exc.field, code="invalid_value")

    async def create(self, req: S.ChatCompletionRequest, request: Request):
        ctx = self.ctx
        refused = ctx.check_request(req)
        if refused is not None:
            return ctx.respond(refused)
        max_calls = 1 if req.parallel_tool_calls is False else None
        tasks = self.tasks(req)
        if isinstance(tasks, Failed):
            return ctx.respond(tasks)
        jobs = [ctx.new_job(task) for task in tasks]
        first = await ctx.start(jobs[0], request)  # its errors get their own status
        if isinstance(first, Failed):
            return ctx.respond(first)
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        if req.stream:
            encoder = ChatChunks(ctx, cid, first.prompt_tokens, max_calls=max_calls,
                                 include_usage=bool(req.stream_options and
                                                    req.stream_options.include_usage))
            return StreamingResponse(encoder.stream(jobs, request),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        results = []
        for index, job in enumerate(jobs):
            started = first if index == 0 else await ctx.start(job, request)
            ev = started if isinstance(started, Failed) else await ctx.finished(job, request)
            if isinstance(ev, Failed):
                return ctx.respond(ev)
            results.append(ev.result)
        return JSONResponse(self.body(cid, [job.task for job in jobs], results,
                                      first.prompt_tokens, max_calls))

    def choice(self, index: int, task: ChatTask, result, max_calls: int | None) -> S.Choice:
        ctx = self.ctx
        calls = [S.ToolCall.model_validate(c) for c in (result.tool_calls or [])[:max_calls]]
        message = S.ResponseMessage(content=(result.text or None) if calls else (result.text or ""),
                                    tool_calls=calls or None)
        logprobs = None if task.request.logprobs is None else {
            "content": chat_content(ctx.texts, visible(result.logprobs, ctx.stop_ids)),
            "refusal": None}
        return S.Choice(index=index, message=message, finish_reason=finish_reason_for(result),
                        logprobs=logprobs)

    def body(self, cid: str, tasks: list[ChatTask], results: list, prompt_tokens: int,
             max_calls: int | None) -> dict:
        mode = tasks[0].mode
        body = S.ChatCompletion(
            id=cid, model=self.ctx.model_name, system_fingerprint=f"asymagent-{mode}",
            choices=[self.choice(i, task, result, max_calls)
                     for i, (task, result) in enumerate(zip(tasks, results))],
            usage=S.Usage(**choices_usage(results, prompt_tokens)))
        out = body.model_dump(exclude_none=False)
        exts = [extension_for(result, mode) for result in results]
        out["asymagent"] = exts[0] if len(exts) == 1 else exts
        return out


class ChatChunks:
    """The SSE chunks of one streamed chat completion, its choices one after another (an
    Encoder for streaming.relay, reset by `begin` for each choice)."""

    def __init__(self, ctx, cid: str, prompt_tokens: int, *, include_usage: bool,
                 max_calls: int | None):
        self.ctx, self.cid, self.prompt_tokens = ctx, cid, prompt_tokens
        self.include_usage, self.max_calls = include_usage, max_calls
        self.created = int(time.time())
        self.results: list = []
        self.closed = False

    async def stream(self, jobs: list, request):
        try:
            for index, job in enumerate(jobs):
                if index:
                    started = await self.ctx.start(job, request)
                    if isinstance(started, Failed):
                        if started.status != 499:  # the client is still there: tell it
                            self.ctx.count_error(started)
                            for line in self.error(started):
                                yield line
                        return
                yield self.begin(index, job.task)
                async for line in relay(self.ctx, job, request, self):
                    yield line
                if self.closed:
                    return
        finally:
            for job in jobs:
                job.cancel.set()  # a no-op once finished; stops generation if the client left
        if self.include_usage:
            yield self.sse(None, usage=choices_usage(self.results, self.prompt_tokens))
        yield DONE

    def begin(self, index: int, task: ChatTask) -> str:
        """Start choice `index`: OpenAI opens with content "" for text and null when the answer
        may be a tool call."""
        self.index, self.mode, self.recorder = index, task.mode, task.request.logprobs
        self.tools_enabled = task.tools is not None
        self.streamer = DeltaStreamer(tools_enabled=self.tools_enabled,
                                      stop=list(task.request.stop), max_calls=self.max_calls,
                                      call_id=task.call_id)
        self.sent = 0  # log-prob entries sent so far
        self.covered = 0  # tokens the text sent so far covers
        return self.sse({"role": "assistant", "content": None if self.tools_enabled else ""})

    def take_logprobs(self, entries: list | None = None) -> dict | None:
        """Entries not sent yet, up to the tokens covered (all of `entries` at the end)."""
        if self.recorder is None:
            return None
        pool = self.recorder.entries[: self.covered] if entries is None else entries
        fresh, self.sent = pool[self.sent:], max(self.sent, len(pool))
        return {"content": chat_content(self.ctx.texts, fresh), "refusal": None}

    def sse(self, delta: dict | None, finish: str | None = None, final_logprobs=None,
            **extra) -> str:
        lp = self.take_logprobs(final_logprobs) if delta is not None else None
        chunk = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.ctx.model_name, "system_fingerprint": f"asymagent-{self.mode}",
                 "choices": [] if delta is None else [
                     {"index": self.index, "delta": delta, "logprobs": lp,
                      "finish_reason": finish}]}
        if self.include_usage:
            chunk["usage"] = None
        chunk.update(extra)
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    # -- Encoder ------------------------------------------------------------------------------
    def text(self, event) -> list[str]:
        self.covered = event.tokens
        return [self.sse(delta) for delta in self.streamer.push(event.text)]

    def finish(self, result, timed_out: bool) -> list[str]:
        final = visible(result.logprobs, self.ctx.stop_ids) if self.recorder is not None else None
        lines = [self.sse(delta, final_logprobs=final) for delta in self.streamer.finish(result)]
        if timed_out:
            return lines
        self.results.append(result)
        reason = finish_reason_for(result, self.streamer.sent_tool_calls)
        return lines + [self.sse({}, reason, final_logprobs=final,
                                 asymagent=extension_for(result, self.mode))]

    def error(self, failed: Failed) -> list[str]:
        return error_lines(failed)
