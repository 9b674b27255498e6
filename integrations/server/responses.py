"""POST /v1/responses (the OpenAI Responses API) on the chat path: a Responses request is a chat turn.

The input items become chat messages (response_items.py) and run as a `ChatTask`, so the
engine, caches, tool-call grammar and structured output are chat's. The answer's `output` holds
a `message` item (one `output_text` part) and/or one `function_call` item per call; `status` is
`incomplete` (`incomplete_details.reason` `max_output_tokens`) when the length cut it. A stream
sends OpenAI's events, each with a `sequence_number`: response.created, response.in_progress,
then per output item response.output_item.added, (text) response.content_part.added,
response.output_text.delta..., response.output_text.done, response.content_part.done, (call)
response.function_call_arguments.delta..., response.function_call_arguments.done, then
response.output_item.done, and last response.completed (or response.incomplete); an error after
the start is an `error` event. Responses are kept (`store`, default true as OpenAI's) in a
bounded in-memory store (`ResponseStore`, the last 256), so `previous_response_id` continues a
conversation and GET /v1/responses/{id} reads one back; a restart forgets them.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict

from fastapi import Request  # module level: FastAPI resolves the handler's annotations here
from fastapi.responses import JSONResponse, StreamingResponse

from asymagent.integrations.server.chat import ChatTask, Turn, chat_task
from asymagent.integrations.server.deltas import DeltaStreamer
from asymagent.integrations.server.errors import Failed
from asymagent.integrations.server.response_items import InputError, ResponseRequest, input_messages
from asymagent.integrations.server.schemas import extension_for
from asymagent.integrations.server.streaming import SSE_HEADERS, relay
from asymagent.request import RequestError

STORE_SIZE = 256  # responses kept for previous_response_id (least recently used dropped)


class ResponseStore:
    """Bounded, thread-safe LRU of finished responses: id -> (conversation messages, body)."""

    def __init__(self, size: int = STORE_SIZE):
        self.size = size
        self.items: OrderedDict[str, tuple[list, dict]] = OrderedDict()
        self.lock = threading.Lock()

    def put(self, rid: str, messages: list, body: dict) -> None:
        with self.lock:
            self.items[rid] = (messages, body)
            self.items.move_to_end(rid)
            while len(self.items) > self.size:
                self.items.popitem(last=False)

    def get(self, rid: str) -> tuple[list, dict] | None:
        with self.lock:
            hit = self.items.get(rid)
            if hit is not None:
                self.items.move_to_end(rid)
            return hit


def response_not_found(rid: str, param: str | None = None) -> Failed:
    return Failed(404, f"Response with id '{rid}' not found (this server keeps the last "
                       f"{STORE_SIZE} stored responses in memory).", "not_found_error",
                  param=param, code="response_not_found")


def response_usage(result, prompt_tokens: int) -> dict:
    stats, output = result.stats, len(result.token_ids)
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": int(stats.cached_tokens)},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output}


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [] if status == "in_progress" else [output_text(text)]}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Responses:
    """The handler of POST /v1/responses and GET /v1/responses/{id} (one per app)."""

    def __init__(self, ctx, store: ResponseStore | None = None):
        self.ctx = ctx
        self.store = store or ResponseStore()

    async def retrieve(self, response_id: str):
        hit = self.store.get(response_id)
        if hit is None:
            return self.ctx.respond(response_not_found(response_id))
        return hit[1]

    def turn(self, req: ResponseRequest) -> Turn | Failed:
        """The request as a chat turn, or the 400/404 for input the server cannot read."""
        history: list[dict] = []
        if req.previous_response_id is not None:
            hit = self.store.get(req.previous_response_id)
            if hit is None:
                return response_not_found(req.previous_response_id, "previous_response_id")
            history = list(hit[0])
        try:
            messages = input_messages(req)
        except InputError as exc:
            return Failed(400, str(exc), param=exc.param, code="invalid_value")
        except ValueError as exc:  # a message the chat rules refuse
            return Failed(400, f"input: {exc}", param="input", code="invalid_value")
        head = [{"role": "system", "content": req.instructions}] if req.instructions else []
        fmt = req.text.format.to_engine() if req.text and req.text.format else None
        return Turn(head + history + messages, req.chat_tools(), req.engine_tool_choice(), fmt,
                    req.max_output_tokens or self.ctx.limits.default_max_tokens,  # None: no cap
                    req.prompt_cache_key, req.parallel_tool_calls)

    async def create(self, req: ResponseRequest, request: Request):
        ctx = self.ctx
        refused = ctx.check_request(req)
        turn = self.turn(req) if refused is None else refused
        if isinstance(turn, Failed):
            return ctx.respond(turn)
        try:
            task = chat_task(turn, req, ctx.limits, None, req.seed, ctx.stop_ids)
        except RequestError as exc:
            return ctx.respond(Failed(400, str(exc), param=exc.field, code="invalid_value"))
        job = ctx.new_job(task)
        first = await ctx.start(job, request)
        if isinstance(first, Failed):
            return ctx.respond(first)
        shell = ResponseShell(ctx, req, task)
        if req.stream:
            events = ResponseEvents(shell, req.max_calls(), first.prompt_tokens, self.keep)
            return StreamingResponse(events.stream(job, request), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        ev = await ctx.finished(job, request)
        if isinstance(ev, Failed):
            return ctx.respond(ev)
        result = ev.result
        output = shell.output_items(result.text or "", (result.tool_calls or [])[:req.max_calls()])
        body = shell.body(output, result, first.prompt_tokens)
        self.keep(req, task, body)
        return JSONResponse(body)

    def keep(self, req: ResponseRequest, task: ChatTask, body: dict) -> None:
        """Store a finished response (unless `store` is false) with its conversation so far."""
        if req.store is False:
            return
        said = body["output"]
        text = "".join(p["text"] for i in said if i["type"] == "message" for p in i["content"])
        calls = [{"id": i["call_id"], "type": "function",
                  "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in said if i["type"] == "function_call"]
        reply = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
        history = task.messages[1:] if req.instructions else task.messages  # not carried on
        self.store.put(body["id"], history + [reply], body)


class ResponseShell:
    """The Response object around one turn: its id, the echoed request fields, its output."""

    def __init__(self, ctx, req: ResponseRequest, task: ChatTask):
        self.ctx, self.req, self.task = ctx, req, task
        self.id = new_id("resp")
        self.created = int(time.time())

    def output_items(self, text: str, calls: list[dict]) -> list[dict]:
        items = [message_item(new_id("msg"), text)] if text or not calls else []
        for call in calls:
            args = call["function"]["arguments"]
            items.append(call_item(new_id("fc"), call["id"], call["function"]["name"],
                                   args if isinstance(args, str) else json.dumps(args)))
        return items

    def body(self, output: list[dict], result=None, prompt_tokens: int = 0,
             status: str | None = None) -> dict:
        req, cut = self.req, result is not None and result.finish_reason == "length"
        status = status or ("incomplete" if cut else "completed")
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) \
            if req.text and req.text.format else {"type": "text"}
        body = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "error": None, "model": self.ctx.model_name,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": req.instructions, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": self.task.request.sampling.temperature, "top_p": req.top_p,
            "tool_choice": req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump")
            else (req.tool_choice or "auto"),
            "tools": [{"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters, "strict": t.strict} for t in req.tools or []],
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": req.max_tool_calls,
            "previous_response_id": req.previous_response_id, "metadata": req.metadata or {},
            "store": req.store is not False,
            "text": {"format": fmt, "verbosity": (req.text and req.text.verbosity) or "medium"},
            "truncation": req.truncation or "disabled", "user": req.user,
            "prompt_cache_key": req.prompt_cache_key,
            "reasoning": req.reasoning.echo() if req.reasoning else None,
            "usage": None if result is None else response_usage(result, prompt_tokens),
        }
        if result is not None:
            body["asymagent"] = extension_for(result, self.task.mode)
        return body


class ResponseEvents:
    """The SSE events of one streamed response (an Encoder for streaming.relay)."""

    def __init__(self, shell: ResponseShell, max_calls: int | None, prompt_tokens: int, keep):
        self.shell, self.prompt_tokens, self.keep = shell, prompt_tokens, keep
        task = shell.task
        self.streamer = DeltaStreamer(tools_enabled=task.tools is not None,
                                      stop=list(task.request.stop), max_calls=max_calls,
                                      call_id=task.call_id)
        self.seq = 0
        self.items: list[dict] = []  # output items in order (their state as streamed)
        self.text_item: dict | None = None  # the open message item
        self.calls: dict[int, dict] = {}  # tool-call index -> its item
        self.closed = False

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    async def stream(self, job, request):
        try:
            snapshot = self.shell.body([], status="in_progress")
            yield self.event("response.created", response=snapshot)
            yield self.event("response.in_progress", response=snapshot)
            async for line in relay(self.shell.ctx, job, request, self):
                yield line
        finally:
            job.cancel.set()  # a no-op once finished; stops generation if the client left

    # -- items ------------------------------------------------------------------------------------
    def open_text(self) -> list[str]:
        item = message_item(new_id("msg"), "", "in_progress")
        item["text"] = ""
        self.text_item, index = item, len(self.items)
        self.items.append(item)
        return [self.event("response.output_item.added", output_index=index,
                           item=message_item(item["id"], "", "in_progress")),
                self.event("response.content_part.added", item_id=item["id"],
                           output_index=index, content_index=0, part=output_text(""))]

    def close_text(self) -> list[str]:
        item, self.text_item = self.text_item, None
        if item is None:
            return []
        index, text = self.items.index(item), item.pop("text")
        item.update(message_item(item["id"], text))
        return [self.event("response.output_text.done", item_id=item["id"], output_index=index,
                           content_index=0, text=text, logprobs=[]),
                self.event("response.content_part.done", item_id=item["id"],
                           output_index=index, content_index=0, part=output_text(text)),
                self.event("response.output_item.done", output_index=index,
                           item=message_item(item["id"], text))]

    def on_delta(self, delta: dict) -> list[str]:
        lines: list[str] = []
        if delta.get("content"):
            if self.text_item is None:
                lines += self.open_text()
            self.text_item["text"] += delta["content"]
            lines.append(self.event("response.output_text.delta", item_id=self.text_item["id"],
                                    output_index=self.items.index(self.text_item),
                                    content_index=0, delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls") or []:
            lines += self.on_call(call)
        return lines

    def on_call(self, call: dict) -> list[str]:
        fn, lines = call.get("function") or {}, []
        if "id" in call:  # the call's first delta
            lines += self.close_text()
            item = call_item(new_id("fc"), call["id"], fn["name"], "", "in_progress")
            self.calls[call["index"]] = item
            self.items.append(item)
            lines.append(self.event("response.output_item.added",
                                    output_index=len(self.items) - 1, item=dict(item)))
        item = self.calls[call["index"]]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            lines.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                    output_index=self.items.index(item), delta=fn["arguments"]))
        return lines

    # -- Encoder ----------------------------------------------------------------------------------
    def text(self, event) -> list[str]:
        lines = []
        for delta in self.streamer.push(event.text):
            lines += self.on_delta(delta)
        return lines

    def finish(self, result, timed_out: bool) -> list[str]:
        lines = []
        for delta in self.streamer.finish(result):
            lines += self.on_delta(delta)
        lines += self.close_text()
        for item in self.calls.values():
            index = self.items.index(item)
            item["status"] = "completed"
            lines += [self.event("response.function_call_arguments.done", item_id=item["id"],
                                 output_index=index, arguments=item["arguments"]),
                      self.event("response.output_item.done", output_index=index,
                                 item=dict(item))]
        if timed_out:
            return lines
        if not self.items:  # an empty answer is still one (empty) message
            lines += self.open_text() + self.close_text()
        body = self.shell.body(self.items, result, self.prompt_tokens)
        self.keep(self.shell.req, self.shell.task, body)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return lines + [self.event(kind, response=body)]

    def error(self, failed: Failed) -> list[str]:
        return [self.event("error", code=failed.code or failed.type, message=failed.message,
                           param=failed.param)]
