"""ChatAsymSpec: the asymagent Engine as a LangChain chat model (tools, streaming, usage, stats).

    from asymagent.integrations.langchain import ChatAsymSpec
    llm = ChatAsymSpec.from_default(mode="asym", max_tokens=128)
    llm.bind_tools([my_tool], tool_choice="any").invoke("...")   # schema-constrained call

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

import copy
import json
import queue
import threading
import uuid
from typing import Any, Iterator, Sequence

from langchain_core.callbacks import CallbackManagerForLLMRun
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
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

_ARGS_PIECE = 24  # characters of tool-call arguments per streamed chunk
# LangChain passes these through bind/with_structured_output; they need nothing from a local engine
# (one call per constrained step; schemas are always enforced when a call is forced).
_IGNORED_KWARGS = {"parallel_tool_calls", "strict", "stream_usage"}


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


class ChatAsymSpec(BaseChatModel):
    """LangChain chat model over an asymagent Engine (local, context-asymmetric speculation)."""

    engine: Any = Field(default=None, exclude=True)  # asymagent.Engine
    model_name: str = "asymagent-smollm2-135m"
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
    trace_dir: str | None = None  # capture each call as a trace line here (off by default)
    _trace_writer: Any = PrivateAttr(default=None)

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @model_validator(mode="after")
    def _check(self) -> "ChatAsymSpec":
        if self.engine is None or not hasattr(self.engine, "chat"):
            raise ValueError("ChatAsymSpec needs engine=<asymagent.Engine>; "
                             "or use ChatAsymSpec.from_default()")
        if self.mode not in ("full", "compressed", "spec", "asym"):
            raise ValueError(f"mode must be full|compressed|spec|asym, got {self.mode!r}")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.trace_dir is not None:
            from asymagent.trace_capture import TraceWriter

            self._trace_writer = TraceWriter(self.trace_dir)
        return self

    def _capture(self, call: dict, r) -> None:
        if self._trace_writer is not None:
            self._trace_writer.record(self.engine, call["messages"], call["tools"], r, source="langchain",
                                      mode=call["mode"], temperature=call["temperature"])

    @classmethod
    def from_default(cls, **kw) -> "ChatAsymSpec":
        """The embedded default engine (SmolLM2-135M verifier + project drafter, CPU); `spec=`,
        `compression=` or `config=` (a config file, e.g. from `asymagent tune`) set it up."""
        from asymagent.engine import Engine

        engine_kw = {k: kw.pop(k) for k in ("spec", "compression", "config") if k in kw}
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
        tools = kwargs.pop("tools", None) or None
        choice = kwargs.pop("tool_choice", "auto")
        if choice == "none":
            tools, choice = None, "auto"
        if tools is None:
            choice = "auto"
        ignored = {k for k in kwargs if k.startswith("ls_") or k in _IGNORED_KWARGS}
        unknown = set(kwargs) - ignored - {"seed", "temperature", "max_tokens", "top_p", "mode"}
        if unknown:
            raise ValueError(f"unsupported generation arguments: {sorted(unknown)}")
        max_new = kwargs.get("max_tokens", self.max_tokens) or 256
        return dict(messages=to_openai_messages(messages), tools=tools, tool_choice=choice,
                    mode=kwargs.get("mode", self.mode), max_new_tokens=int(max_new),
                    temperature=float(kwargs.get("temperature", self.temperature)),
                    seed=kwargs.get("seed", self.seed), top_p=kwargs.get("top_p", self.top_p),
                    stop=list(stop or self.stop or []) or None, cache_key=self.cache_key)

    def _metadata(self, r) -> tuple[dict, dict]:
        s = r.stats
        usage = {"input_tokens": int(s.full_context_tokens), "output_tokens": int(s.new_tokens),
                 "total_tokens": int(s.full_context_tokens + s.new_tokens)}
        reused = max(int(s.full_context_tokens) - int(s.verifier_prefill_tokens), 0)
        if s.compression_ratio >= 1.0 and reused:
            usage["input_token_details"] = {"cache_read": reused}
        finish = "tool_calls" if r.tool_calls else r.finish_reason
        meta = {"model_name": self.model_name, "model_provider": "asymagent", "mode": s.mode,
                "finish_reason": finish, "step_stats": s.to_dict()}
        return usage, meta

    def _no_calls(self, r, no_tools: bool):
        """tool_choice="none": the model may not call tools, so call-shaped output is text."""
        if no_tools and (r.tool_calls or r.invalid_tool_calls):
            text = self.engine.tokenizer.decode(r.token_ids, skip_special_tokens=True).strip()
            r = copy.copy(r)
            r.text, r.tool_calls, r.invalid_tool_calls = text, [], []
        return r

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        no_tools = kwargs.get("tool_choice") == "none"
        call = self._chat_kwargs(messages, stop, dict(kwargs))
        r = self._no_calls(self.engine.chat(**call), no_tools)
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
        tok = self.engine.tokenizer
        eos = set(getattr(self.engine, "eos_ids", ()) or ())
        stops = call["stop"] or []
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()

        def on_tokens(new_ids):
            events.put(("tokens", list(new_ids)))
            return False if cancel.is_set() else None

        def work():
            try:
                events.put(("done", self.engine.chat(callback=on_tokens, **call)))
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
                if not no_tools and _call_started(text):
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
            cancel.set()
        worker.join()
        result = self._no_calls(result, no_tools)
        self._capture(call, result)
        yield from self._final_chunks(result, sent, run_manager)

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
