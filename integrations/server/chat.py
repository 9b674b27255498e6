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
from asymagent.integrations.server import schemas as S
from asymagent.integrations.server.deltas import DeltaStreamer
from asymagent.integrations.server.errors import Failed
from asymagent.integrations.server.logprobs import chat_content, visible
from asymagent.integrations.server.schemas import extension_for, finish_reason_for, usage_for
from asymagent.integrations.server.streaming import DONE, SSE_HEADERS, error_lines, relay
from asymagent.integrations.server.worker import count_prompt_tokens


def cache_key_for(messages: list[dict], tools: list | None, mode: str) -> str:
    """Conversation identity: tools, mode and every message up to and including the first user
    message. Later turns of the same agent conversation keep that prefix, so they share a session."""
    head = []
    for message in messages:
        head.append(message)
        if message.get("role") == "user":
            break
    blob = json.dumps({"m": head, "t": tools, "mode": mode}, sort_keys=True, ensure_ascii=False)
    return "conv-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclass
class ChatTask:
    """One chat turn for the engine worker: `Engine.chat` on the messages and tools."""

    messages: list[dict]
    tools: list[dict] | None
    max_new_tokens: int
    cache_key: str
    options: dict = field(default_factory=dict)  # Engine.chat's other keywords
    where: str = "messages"

    @property
    def mode(self) -> str:
        return self.options["mode"]

    def prompt_tokens(self, engine, chat_format) -> int:
        return count_prompt_tokens(chat_format, self.messages, self.tools)

    def run(self, engine, callback):
        return engine.chat(messages=self.messages, tools=self.tools, max_new_tokens=self.max_new_tokens,
                           cache_key=self.cache_key, callback=callback, **self.options)

    def record(self, trace_writer, engine, result) -> None:
        trace_writer.record(engine, self.messages, self.tools, result, source="serve",
                            mode=self.mode, temperature=self.options.get("temperature") or 0.0)


def chat_task(req: S.ChatCompletionRequest, limits, recorder) -> ChatTask:
    """The worker's task for a chat request (the server's defaults where the request is silent)."""
    mode = req.mode or limits.default_mode
    messages = [m.to_engine() for m in req.messages]
    tool_choice = req.engine_tool_choice()
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    engine_tools = tools if tool_choice != "none" else None
    temperature = limits.default_temperature if req.temperature is None else req.temperature
    options = dict(mode=mode, temperature=temperature, seed=req.seed, top_p=req.top_p,
                   stop=req.stop, tool_choice=tool_choice if engine_tools else "auto",
                   response_format=req.response_format.to_engine() if req.response_format
                   else None, logprobs=recorder, **req.sampling())
    return ChatTask(messages, engine_tools, req.max_new_tokens(limits.default_max_tokens),
                    cache_key_for(messages, engine_tools, mode), options)


class ChatCompletions:
    """The handler of POST /v1/chat/completions (one per app)."""

    def __init__(self, ctx):
        self.ctx = ctx

    async def create(self, req: S.ChatCompletionRequest, request: Request):
        ctx = self.ctx
        refused = ctx.check_request(req)
        if refused is not None:
            return ctx.respond(refused)
        top = req.top_logprobs_count()
        recorder = None if top is None else LogprobRecorder(top)
        task = chat_task(req, ctx.limits, recorder)
        max_calls = 1 if req.parallel_tool_calls is False else None
        job = ctx.new_job(task)
        first = await ctx.start(job, request)
        if isinstance(first, Failed):
            return ctx.respond(first)
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        if req.stream:
            encoder = ChatChunks(ctx, cid, task, first.prompt_tokens, recorder=recorder,
                                 include_usage=bool(req.stream_options and
                                                    req.stream_options.include_usage),
                                 max_calls=max_calls, stop=req.stop)
            return StreamingResponse(encoder.stream(job, request), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        ev = await ctx.finished(job, request)
        if isinstance(ev, Failed):
            return ctx.respond(ev)
        return JSONResponse(self.body(cid, task, ev.result, first.prompt_tokens, recorder,
                                      max_calls))

    def body(self, cid: str, task: ChatTask, result, prompt_tokens: int, recorder,
             max_calls: int | None) -> dict:
        ctx = self.ctx
        calls = [S.ToolCall.model_validate(c) for c in (result.tool_calls or [])[:max_calls]]
        message = S.ResponseMessage(content=(result.text or None) if calls else (result.text or ""),
                                    tool_calls=calls or None)
        logprobs = None if recorder is None else {
            "content": chat_content(ctx.texts, visible(result.logprobs, ctx.stop_ids)),
            "refusal": None}
        body = S.ChatCompletion(
            id=cid, model=ctx.model_name, system_fingerprint=f"asymagent-{task.mode}",
            choices=[S.Choice(message=message, finish_reason=finish_reason_for(result),
                              logprobs=logprobs)],
            usage=S.Usage(**usage_for(result, prompt_tokens)))
        out = body.model_dump(exclude_none=False)
        out["asymagent"] = extension_for(result, task.mode)
        return out


class ChatChunks:
    """The SSE chunks of one streamed chat completion (an Encoder for streaming.relay)."""

    def __init__(self, ctx, cid: str, task: ChatTask, prompt_tokens: int, *, recorder,
                 include_usage: bool, max_calls: int | None, stop: list[str] | None):
        self.ctx, self.cid, self.mode = ctx, cid, task.mode
        self.prompt_tokens, self.recorder, self.include_usage = prompt_tokens, recorder, \
            include_usage
        self.tools_enabled = task.tools is not None
        self.streamer = DeltaStreamer(tools_enabled=self.tools_enabled, stop=stop,
                                      max_calls=max_calls)
        self.created = int(time.time())
        self.sent = 0  # log-prob entries sent so far
        self.covered = 0  # tokens the text sent so far covers
        self.closed = False

    async def stream(self, job, request):
        try:
            # OpenAI opens with content "" for text and null when the answer may be a tool call.
            yield self.sse({"role": "assistant", "content": None if self.tools_enabled else ""})
            async for line in relay(self.ctx, job, request, self):
                yield line
        finally:
            job.cancel.set()  # a no-op once finished; stops generation if the client left

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
                     {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
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
        reason = finish_reason_for(result, self.streamer.sent_tool_calls)
        lines.append(self.sse({}, reason, final_logprobs=final,
                              asymagent=extension_for(result, self.mode)))
        if self.include_usage:
            lines.append(self.sse(None, usage=usage_for(result, self.prompt_tokens)))
        return lines + [DONE]

    def error(self, failed: Failed) -> list[str]:
        return error_lines(failed)
