"""ChatAsymSpec: the asymagent Engine as a LangChain chat model (tools, streaming, usage, stats).

    from asymagent.integrations.langchain import ChatAsymSpec
    llm = ChatAsymSpec(model="default", mode="asym", max_tokens=128)   # or engine=Engine(...)
    llm.bind_tools([my_tool], tool_choice="any").invoke("...")   # schema-constrained call
    llm.with_structured_output(MyModel).invoke("...")            # grammar-constrained JSON

- Construction as ChatOllama/ChatOpenAI users expect: `model` ("default": the embedded
  SmolLM2 pair, or a model dir / .gguf / cached HF id) and `drafter` build the engine
  (integrations/engine_source.py; one engine per distinct source, shared); `engine=` uses yours.
  Unknown arguments warn and move into `model_kwargs`, exactly as ChatOpenAI does (LangChain's
  `_build_model_kwargs`); `model_kwargs` are sent with every call, so a misspelt one then fails
  with "unsupported generation arguments", as the OpenAI API answers a 400.
- `with_structured_output(schema, method=...)`: "json_schema" (default, as ChatOpenAI's) and
  "json_mode" decode under `ResponseFormatConstraint`, "function_calling" under
  `ToolCallConstraint`: the output is valid JSON for the schema whatever the model.
- Async (`ainvoke`, `astream`, `abatch`) runs the engine in a worker thread, never on the loop.
- `bind_tools(tools, tool_choice=...)`: "auto"/None lets the model choose; "any", "required",
  True (with one tool) or a tool name force a call, and the engine decodes it under
  `ToolCallConstraint` (always a schema-valid call, even from a 135M model).
- `_stream` runs the engine in a worker thread and turns its per-round token callback into
  chunks: text while the output is plain text, then one `tool_call_chunks` group per call
  (`index` on every chunk, `id` and `name` only on a call's first chunk), then a final chunk
  with `usage_metadata`, `response_metadata` and `chunk_position="last"`. Aggregated chunks
  equal the `invoke` message (up to tool call ids, which are fresh per call).
- `response_metadata["step_stats"]` is the engine's StepStats (latency, acceptance, compression).
- `trace_dir=DIR` captures every call (invoke or stream) as one JSONL trace line
  (asymagent/trace_capture.py), for `train-drafter --traces DIR` and `asymagent tune DIR`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import queue
import threading
import uuid
from typing import Any, AsyncIterator, Iterator, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.utils import _build_model_kwargs, get_pydantic_field_names
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from asymagent.request import GenerationRequest

DEFAULT_MODEL_NAME = "asymagent-smollm2-135m"
_ARGS_PIECE = 24  # characters of tool-call arguments per streamed chunk
# LangChain passes these through bind/with_structured_output; they need nothing from a local engine
# (one call per constrained step; schemas are always enforced when a call is forced).
_IGNORED_KWARGS = {"parallel_tool_calls", "strict", "stream_usage"}
# Per-call keywords handed to Engine.chat (the rest of its sampling interface).
_ENGINE_KWARGS = {"seed", "temperature", "max_tokens", "top_p", "mode", "response_format",
                  "top_k", "min_p", "frequency_penalty", "presence_penalty", "logit_bias",
                  "logprobs", "top_logprobs"}
_ENGINES: dict = {}  # (model, drafter, spec, compression) -> Engine built by the constructor


def normalize_tool_choice(tool_choice: Any, tools: list) -> Any:
    """LangChain tool_choice -> the engine's: "auto" | "none" | "required" | named dict."""
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice == "none":
        return "none"
    if tool_choice in ("any", "required"):
        return "required"
    if tool_choice is True:
        if len(tools) != 1:
            raise ValueError("tool_choice=True needs exactly one tool")
        return {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    if isinstance(tool_choice, str):
        names = [t["function"]["name"] for t in tools]
        if tool_choice not in names:
            raise ValueError(f"tool_choice {tool_choice!r} is not among the bound tools {names}")
        return {"type": "function", "function": {"name": tool_choice}}
    if isinstance(tool_choice, dict):
        return tool_choice
    raise ValueError(f"unsupported tool_choice {tool_choice!r}")


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict]:
    """LangChain messages -> OpenAI dicts with string content (text blocks joined)."""
    out = convert_to_openai_messages(list(messages))
    for m in out:
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "".join(b.get("text", "") if isinstance(b, dict) else str(b)
                                   for b in content)
        elif content is None:
            m["content"] = ""
    return out


def _lc_tool_calls(calls: list) -> list[dict]:
    out = []
    for c in calls or []:
        fn = c.get("function") or {}
        args = fn.get("arguments") or "{}"
        out.append({"name": fn.get("name", ""), "id": c.get("id"), "type": "tool_call",
                    "args": json.loads(args) if isinstance(args, str) else dict(args)})
    return out


def _lc_invalid_calls(calls: list) -> list[dict]:
    return [{"name": c.get("name"), "args": c.get("args"), "id": c.get("id"),
             "error": c.get("error"), "type": "invalid_tool_call"} for c in calls or []]


def _width(engine) -> int:
    """Requests `engine` decodes at once (its scheduler's max_num_seqs; 1 without one)."""
    return int(getattr(getattr(engine, "scheduler", None), "max_num_seqs", 1) or 1)


def engine_for(model: str, drafter: str | None, mode: str, spec, compression):
    """The engine `ChatAsymSpec(model=..., drafter=...)` builds: one per distinct source, kept
    for the process (several models over one source share its weights and caches)."""
    from asymagent.integrations.engine_source import open_engine

    source = "default" if model == DEFAULT_MODEL_NAME else model
    key = (source, drafter, mode if drafter is None else "", repr(spec), repr(compression))
    if key not in _ENGINES:
        _ENGINES[key] = open_engine(source, drafter, mode=mode, spec=spec, compression=compression)
    return _ENGINES[key]


class ChatAsymSpec(BaseChatModel):
    """LangChain chat model over an asymagent Engine (local, context-asymmetric speculation)."""

    engine: Any = Field(default=None, exclude=True)  # asymagent.Engine; built from model if None
    model_name: str = Field(default=DEFAULT_MODEL_NAME, alias="model")
    drafter: str | None = None  # with model: a drafter source (integrations/engine_source.py)
    spec: Any = Field(default=None, exclude=True)  # SpecConfig for a built engine
    compression: Any = Field(default=None, exclude=True)  # CompressionConfig for a built engine
    mode: str = "asym"  # full | compressed | spec | asym
    temperature: float = 0.0
    max_tokens: int | None = 256
    top_p: float = 1.0
    stop: list[str] | None = None
    seed: int | None = None
    cache_key: str = "langchain"  # engine cache session (prefix reuse across calls)
    streaming: bool = False
    timeout: float | None = None  # accepted for LangChain's standard params; local engine
    max_retries: int = 0  # accepted for LangChain's standard params; nothing to retry locally
    max_input_tokens: int | None = None  # context limit for `profile` (default: the model's)
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    logprobs: bool | None = None  # log-probs in response_metadata["logprobs"] (OpenAI's shape)
    top_logprobs: int | None = None
    model_kwargs: dict[str, Any] = Field(default_factory=dict)  # sent with every call
    trace_dir: str | None = None  # capture each call as a trace line here (off by default)
    _trace_writer: Any = PrivateAttr(default=None)

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    @property
    def model(self) -> str:
        """Same as model_name (ChatOpenAI's accessor)."""
        return self.model_name

    @model_validator(mode="before")
    @classmethod
    def build_extra(cls, values: dict[str, Any]) -> Any:
        """Unknown arguments -> model_kwargs with a warning (ChatOpenAI's behaviour)."""
        return _build_model_kwargs(values, get_pydantic_field_names(cls))

    @model_validator(mode="after")
    def _check(self) -> "ChatAsymSpec":
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        # the model's defaults as one request: mode, temperature, top_p, seed checked where every
        # face's are (asymagent/request.py), before any weights load
        GenerationRequest.build(mode=self.mode, max_new_tokens=self.max_tokens or 256,
                                temperature=self.temperature, top_p=self.top_p, seed=self.seed)
        if self.engine is None:
            self.engine = engine_for(self.model_name, self.drafter, self.mode, self.spec,
                                     self.compression)
        elif not hasattr(self.engine, "chat"):
            raise ValueError("engine must be an asymagent.Engine")
        if self.trace_dir is not None:
            from asymagent.trace_capture import TraceWriter

            self._trace_writer = TraceWriter(self.trace_dir)
        return self

    def _capture(self, call: dict, r) -> None:
        if self._trace_writer is not None:
            req = call["request"]
            self._trace_writer.record(self.engine, call["messages"], req.tools, r, source="langchain",
                                      mode=req.mode, temperature=req.sampling.temperature)

    @classmethod
    def from_default(cls, **kw) -> "ChatAsymSpec":
        """The embedded default engine (SmolLM2-135M verifier + project drafter, CPU); the same
        as ChatAsymSpec(model="default", ...) except that it loads a fresh engine. `spec=`,
        `compression=` or `config=` (a config file, e.g. from `asymagent tune`) set it up;
        `max_num_seqs=` lets `batch` / `abatch` decode their inputs at once."""
        from asymagent.engine import Engine

        engine_kw = {k: kw.pop(k) for k in ("spec", "compression", "config", "max_num_seqs",
                                            "max_num_batched_tokens") if k in kw}
        return cls(engine=Engine.from_default(**engine_kw), **kw)

    # --- LangChain plumbing -----------------------------------------------------------------
    @property
    def _llm_type(self) -> str:
        return "asymagent"

    @property
    def _identifying_params(self) -> dict:
        return {"model_name": self.model_name, "mode": self.mode,
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(ls_provider="asymagent", ls_model_name=kwargs.get("model", self.model_name),
                      ls_temperature=self.temperature, ls_max_tokens=self.max_tokens)
        if stop or self.stop:
            params["ls_stop"] = list(stop or self.stop)
        return params

    def _resolve_model_profile(self):
        limit = self.max_input_tokens
        if limit is None:
            limit = int(getattr(getattr(getattr(self.engine, "verifier", None), "config", None),
                                "max_position_embeddings", 0) or 0) or None
        profile = {"name": self.model_name, "open_weights": True, "text_inputs": True,
                   "text_outputs": True, "tool_calling": True, "tool_choice": True,
                   "tool_call_streaming": True, "structured_output": True, "temperature": True,
                   "mid_conversation_tools": True, "mid_conversation_system_messages": True}
        if limit:
            profile["max_input_tokens"] = limit
        if self.max_tokens:
            profile["max_output_tokens"] = self.max_tokens
        return profile

    def bind_tools(self, tools: Sequence[dict | type | Any], *, tool_choice: Any = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        choice = normalize_tool_choice(tool_choice, formatted)
        return super().bind(tools=formatted, tool_choice=choice, **kwargs)

    # --- generation -------------------------------------------------------------------------
    def _chat_kwargs(self, messages, stop, kwargs) -> dict:
        kwargs = {**self.model_kwargs, **kwargs}
        tools = kwargs.pop("tools", None) or None
        choice = kwargs.pop("tool_choice", "auto")
        if choice == "none":
            tools, choice = None, "auto"
        if tools is None:
            choice = "auto"
        ignored = {k for k in kwargs if k.startswith("ls_") or k in _IGNORED_KWARGS}
        unknown = set(kwargs) - ignored - _ENGINE_KWARGS
        if unknown:
            raise ValueError(f"unsupported generation arguments: {sorted(unknown)}")

        def pick(name: str, default=None):
            value = kwargs.get(name, getattr(self, name))
            return default if value is None else value

        max_new = kwargs.get("max_tokens", self.max_tokens) or 256
        logprobs = pick("logprobs", False)
        # one typed request per call (asymagent/request.py checks every field, naming it)
        request = GenerationRequest.build(
            tools=tools, tool_choice=choice, mode=kwargs.get("mode", self.mode),
            max_new_tokens=int(max_new),
            temperature=float(kwargs.get("temperature", self.temperature)),
            seed=kwargs.get("seed", self.seed), top_p=kwargs.get("top_p", self.top_p),
            stop=list(stop or self.stop or []) or None, cache_key=self.cache_key,
            response_format=kwargs.get("response_format"), top_k=pick("top_k", 0),
            min_p=pick("min_p", 0.0), frequency_penalty=pick("frequency_penalty", 0.0),
            presence_penalty=pick("presence_penalty", 0.0), logit_bias=pick("logit_bias"),
            logprobs=pick("top_logprobs", 0) if logprobs else None)
        return dict(messages=to_openai_messages(messages), request=request)

    def _metadata(self, r) -> tuple[dict, dict]:
        s = r.stats
        usage = {"input_tokens": int(s.full_context_tokens), "output_tokens": int(s.new_tokens),
                 "total_tokens": int(s.full_context_tokens + s.new_tokens)}
        # the verifier's prefix reused from its KV cache (OpenAI's cached_tokens)
        usage["input_token_details"] = {"cache_read": int(s.cached_tokens)}
        finish = "tool_calls" if r.tool_calls else r.finish_reason
        meta = {"model_name": self.model_name, "model_provider": "asymagent", "mode": s.mode,
                "finish_reason": finish, "step_stats": s.to_dict()}
        if r.logprobs is not None:
            from asymagent.integrations.server.logprobs import TokenTexts, chat_content, visible

            entries = visible(r.logprobs, getattr(self.engine, "eos_ids", ()))
            meta["logprobs"] = {"content": chat_content(TokenTexts(self.engine.tokenizer), entries)}
        return usage, meta

    def _no_calls(self, r, no_tools: bool):
        """tool_choice="none": the model may not call tools, so call-shaped output is text."""
        if no_tools and (r.tool_calls or r.invalid_tool_calls):
            text = self.engine.tokenizer.decode(r.token_ids, skip_special_tokens=True).strip()
            r = copy.copy(r)
            r.text, r.tool_calls, r.invalid_tool_calls = text, [], []
        return r

    def _chat(self, **call):
        """engine.chat; a call cut short by an exception leaves its cache session in an unknown
        state, so the session is dropped (as the server does) and the next call starts clean.
        The drop holds the engine's lock (reentrant), so no other call is using the session; an
        engine that decodes several requests at once (max_num_seqs > 1) admits each call itself
        (holding its lock around the call would keep the others from their forwards), and no
        other call of this conversation runs while the call does."""
        lock = self.engine.lock
        if _width(self.engine) > 1:
            try:
                return self.engine.chat(**call)
            except BaseException:
                with lock:
                    self.engine.caches.drop(call["request"].cache_key)
                raise
        with lock:
            try:
                return self.engine.chat(**call)
            except BaseException:
                self.engine.caches.drop(call["request"].cache_key)
                raise

    # --- many inputs at once (continuous batching) ------------------------------------------
    def _per_input(self, count: int) -> list:
        """One copy of this model per input, each on its own conversation (`cache_key/i`), so an
        engine with max_num_seqs > 1 decodes them at once (one conversation runs one request at
        a time); the same i reuses its cache across calls."""
        return [self.model_copy(update={"cache_key": f"{self.cache_key}/{i}"}) for i in range(count)]

    def batch(self, inputs: list, config=None, *, return_exceptions: bool = False,
              **kwargs: Any) -> list:
        """LangChain's batch; on an engine that decodes several requests at once the inputs run
        as concurrent requests on their own conversations (`_per_input`), their forwards batched;
        a request's output is the same as alone."""
        if _width(self.engine) <= 1 or len(inputs) <= 1:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        from langchain_core.runnables.config import get_config_list, get_executor_for_config

        configs = get_config_list(config, len(inputs))
        models = self._per_input(len(inputs))

        def one(i: int):
            try:
                return models[i].invoke(inputs[i], configs[i], **kwargs)
            except Exception as exc:
                if return_exceptions:
                    return exc
                raise

        cap = configs[0].get("max_concurrency") or _width(self.engine)
        with get_executor_for_config({**configs[0], "max_concurrency": min(cap, len(inputs))}) as pool:
            return list(pool.map(one, range(len(inputs))))

    async def abatch(self, inputs: list, config=None, *, return_exceptions: bool = False,
                     **kwargs: Any) -> list:
        """`batch` for asyncio: the inputs as concurrent `ainvoke`s on their own conversations."""
        if _width(self.engine) <= 1 or len(inputs) <= 1:
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        from langchain_core.runnables.config import get_config_list

        configs = get_config_list(config, len(inputs))
        models = self._per_input(len(inputs))
        gate = asyncio.Semaphore(configs[0].get("max_concurrency") or _width(self.engine))

        async def one(i: int):
            async with gate:
                return await models[i].ainvoke(inputs[i], configs[i], **kwargs)

        return list(await asyncio.gather(*(one(i) for i in range(len(inputs))),
                                         return_exceptions=return_exceptions))

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        no_tools = kwargs.get("tool_choice") == "none"
        call = self._chat_kwargs(messages, stop, dict(kwargs))
        r = self._no_calls(self._chat(**call), no_tools)
        self._capture(call, r)
        usage, meta = self._metadata(r)
        msg = AIMessage(content=r.text or "", tool_calls=_lc_tool_calls(r.tool_calls),
                        invalid_tool_calls=_lc_invalid_calls(r.invalid_tool_calls),
                        usage_metadata=usage, response_metadata=meta)
        return ChatResult(generations=[ChatGeneration(message=msg)], llm_output=meta)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        no_tools = kwargs.get("tool_choice") == "none"
        call = self._chat_kwargs(messages, stop, dict(kwargs))
        # Output may be a tool call (its chunks come at the end) unless no tool can be called:
        # an answer under a response_format without tools is JSON text, streamed as it comes.
        req = call["request"]
        may_call = not no_tools and (req.tools or not req.response_format)
        tok = self.engine.tokenizer
        eos = set(getattr(self.engine, "eos_ids", ()) or ())
        stops = list(req.stop)
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()

        def on_tokens(new_ids):
            events.put(("tokens", list(new_ids)))
            return False if cancel.is_set() else None

        def work():
            try:
                events.put(("done", self._chat(messages=call["messages"],
                                               request=req.replace(callback=on_tokens))))
            except Exception as exc:  # re-raised in the consumer thread
                events.put(("error", exc))

        worker = threading.Thread(target=work, name="asymagent-stream", daemon=True)
        worker.start()
        ids: list[int] = []
        sent, frozen = "", False
        hold = max((len(s) for s in stops), default=1) - 1  # a stop string may be forming
        try:
            while True:
                kind, value = events.get()
                if kind == "error":
                    raise value
                if kind == "done":
                    result = value
                    break
                ids.extend(value)
                if frozen:
                    continue
                text = tok.decode([t for t in ids if t not in eos], skip_special_tokens=False)
                if may_call and _call_started(text):
                    frozen = True  # a tool call is being written: its chunks come at the end
                    continue
                safe = text[: len(text) - hold] if hold else text
                safe = safe.lstrip().rstrip()  # the final content is stripped
                if safe.endswith("\ufffd"):
                    continue  # a multi-byte character is still incomplete
                if len(safe) > len(sent) and safe.startswith(sent):
                    chunk = ChatGenerationChunk(message=AIMessageChunk(content=safe[len(sent):]))
                    sent = safe
                    if run_manager:
                        run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk
        finally:
            cancel.set()  # a consumer gone early (or an error here) stops the engine ...
            worker.join()  # ... at its next round: no generation outlives this call
        result = self._no_calls(result, no_tools)
        self._capture(call, result)
        yield from self._final_chunks(result, sent, run_manager)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        """`_generate` on a worker thread: the event loop keeps running while the engine works."""
        return await asyncio.to_thread(self._generate, messages, stop, None, **kwargs)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        """`_stream` on a worker thread, its chunks handed to the event loop as they come; a
        consumer that stops early stops the engine at its next round."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()
        stopped = threading.Event()

        def produce() -> None:
            try:
                for chunk in self._stream(messages, stop, None, **kwargs):
                    loop.call_soon_threadsafe(chunks.put_nowait, ("chunk", chunk))
                    if stopped.is_set():
                        break  # closes _stream, which cancels the engine
            except Exception as exc:  # re-raised on the event loop
                loop.call_soon_threadsafe(chunks.put_nowait, ("error", exc))
            else:
                loop.call_soon_threadsafe(chunks.put_nowait, ("done", None))

        threading.Thread(target=produce, name="asymagent-astream", daemon=True).start()
        try:
            while True:
                kind, value = await chunks.get()
                if kind == "error":
                    raise value
                if kind == "done":
                    return
                if run_manager:
                    await run_manager.on_llm_new_token(value.text, chunk=value)
                yield value
        finally:
            stopped.set()

    def with_structured_output(self, schema: Any = None, *, method: str = "json_schema",
                               include_raw: bool = False, strict: bool | None = None,
                               **kwargs: Any) -> Runnable:
        """ChatOpenAI's methods ("json_schema" default, "json_mode", "function_calling"), each
        decoded under a grammar, so the output parses for any model
        (integrations/langchain_structured.py)."""
        from asymagent.integrations.langchain_structured import structured_output

        return structured_output(self, schema, method=method, include_raw=include_raw,
                                 strict=strict, **kwargs)

    def _final_chunks(self, r, sent: str, run_manager) -> Iterator[ChatGenerationChunk]:
        content = r.text or ""
        if len(content) > len(sent):
            rest = content[len(sent):] if content.startswith(sent) else content
            yield ChatGenerationChunk(message=AIMessageChunk(content=rest))
        for index, c in enumerate(r.tool_calls or []):
            fn = c.get("function") or {}
            args = fn.get("arguments") or "{}"
            call_id = c.get("id") or f"call_{uuid.uuid4().hex[:24]}"
            pieces = [args[i: i + _ARGS_PIECE] for i in range(0, len(args), _ARGS_PIECE)] or [""]
            for j, piece in enumerate(pieces):
                first = j == 0
                tcc = {"index": index, "args": piece, "type": "tool_call_chunk",
                       "id": call_id if first else None, "name": fn.get("name") if first else None}
                chunk = ChatGenerationChunk(message=AIMessageChunk(content="",
                                                                   tool_call_chunks=[tcc]))
                if run_manager:
                    run_manager.on_llm_new_token("", chunk=chunk)
                yield chunk
        usage, meta = self._metadata(r)
        if r.invalid_tool_calls:
            # AIMessageChunk re-derives calls from tool_call_chunks (and would "repair" broken
            # JSON), so broken calls travel in the metadata; their raw text is in the content.
            meta["invalid_tool_calls"] = _lc_invalid_calls(r.invalid_tool_calls)
        last = AIMessageChunk(content="", usage_metadata=usage, response_metadata=meta,
                              chunk_position="last")
        yield ChatGenerationChunk(message=last, generation_info={"finish_reason":
                                                                 meta["finish_reason"]})


def _call_started(text: str) -> bool:
    """True once the output has a line that may start a tool call (JSON or <tool_call>)."""
    if "<tool_call>" in text:
        return True
    last = text.split("\n")[-1].lstrip()
    if last and "<tool_call>".startswith(last):
        return True  # the tag may be forming
    return any(line.lstrip().startswith(("{", "[")) for line in text.split("\n"))
