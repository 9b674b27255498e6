"""POST /v1/completions: OpenAI's text-completion endpoint (prompt string or token ids, streaming).

For eval harnesses that score and continue raw text (lm-evaluation-harness `local-completions`):
`prompt` is a string, a list of token ids, or a batch of either (served one after another, one
choice per prompt, `index` in order). The prompt is encoded with the tokenizer's defaults (special
tokens added as the tokenizer adds them) and decoded with `Engine.generate` in the request's mode;
there are no messages here, so nothing is compressed (the verifier reads the full prompt, ratio
1.0 in every mode). `echo` prepends the prompt text; `echo` with `logprobs` also scores the prompt
(`Engine.score`: the verifier's log-probability of each prompt token, the first `null`), and
`max_tokens: 0` with `echo` scores without generating (log-likelihood requests). Every sampling
field acts as in chat (server_fields.py); `suffix` and `best_of` > 1 are refused with a 400.
Every prompt runs on its own cache session per mode, "completions-<mode>", so prompts sharing a
prefix (few-shot examples) reuse its KV.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from fastapi import Request  # module level: FastAPI resolves the handler's annotations here
from pydantic import Field, field_validator, model_validator

from asymagent.decoding.logprobs import LogprobRecorder
from asymagent.integrations.server_fields import SamplingFields, refuse
from asymagent.integrations.server_logprobs import completion_logprobs, visible
from asymagent.integrations.server_schemas import extension_for, finish_reason_for, usage_for
from asymagent.integrations.server_streaming import DeltaStreamer, sse_error
from asymagent.integrations.server_worker import Failed, Finished, GenerationJob, Started, TextDelta

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
    """One prompt for the engine worker (GenerationJob.task): encode, score, generate."""

    prompt: Union[str, list]
    max_new_tokens: int
    generate_kwargs: dict
    echo: bool = False
    score_top: int | None = None  # echo + logprobs: score the prompt with this many alternatives
    ids: list = field(default_factory=list)
    prompt_text: str = ""
    prompt_logprobs: list = field(default_factory=list)

    @property
    def cache_key(self) -> str:
        return self.generate_kwargs["cache_key"]

    def prompt_tokens(self, engine) -> int:
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
                mode=self.generate_kwargs["mode"], full_context_tokens=len(self.ids),
                verifier_context_tokens=len(self.ids)), finish_reason="length", logprobs=[])
        return engine.generate(self.ids, max_new_tokens=self.max_new_tokens, callback=callback,
                               **self.generate_kwargs)


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


def register_completions(app, *, engine, model_name: str, check_key, check_request, start,
                         finished, next_event, error_response, texts, defaults: dict,
                         request_timeout: float) -> None:
    """Add POST /v1/completions to `app` (the helpers are openai_server.create_app's)."""
    from fastapi import Depends
    from fastapi.responses import JSONResponse, StreamingResponse

    stop_ids = tuple(getattr(engine, "eos_ids", ()) or ())

    def new_job(req: CompletionRequest, prompt, mode: str):
        recorder = None if req.logprobs is None else LogprobRecorder(req.logprobs)
        kwargs = dict(mode=mode, seed=req.seed, top_p=req.top_p, stop=req.stop,
                      temperature=defaults["temperature"] if req.temperature is None
                      else req.temperature, cache_key=f"completions-{mode}",
                      logprobs=recorder, **req.sampling())
        task = CompletionTask(prompt, req.max_tokens, kwargs, echo=req.echo,
                              score_top=req.logprobs if req.echo else None)
        job = GenerationJob({"max_new_tokens": req.max_tokens}, asyncio.get_running_loop(),
                            deadline=time.monotonic() + request_timeout, task=task)
        return job, task, recorder

    @app.post("/v1/completions", dependencies=[Depends(check_key)])
    async def completions(req: CompletionRequest, request: Request):
        check_request(req)
        mode = req.mode or defaults["mode"]
        cid = "cmpl-" + uuid.uuid4().hex[:24]
        prompts = req.prompts()
        jobs = [new_job(req, prompt, mode) for prompt in prompts]
        # The first prompt starts before the answer does, so its errors get their own status.
        first = await start(jobs[0][0], request)
        if not isinstance(first, Started):
            return first
        if req.stream:
            return StreamingResponse(stream(req, request, cid, mode, jobs, first),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        choices, usages, exts = [], [], []
        for index, (job, task, recorder) in enumerate(jobs):
            if index:
                first = await start(job, request)
                if not isinstance(first, Started):
                    return first
            ev = await finished(job, request)
            if not isinstance(ev, Finished):
                return ev
            result = ev.result
            text = (task.prompt_text if req.echo else "") + result.text
            logprobs = None
            if recorder is not None:
                entries = (task.prompt_logprobs if req.echo else []) + \
                    visible(result.logprobs, stop_ids)
                logprobs = completion_logprobs(texts, entries, 0)
            choices.append({"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": finish_reason_for(result)})
            usages.append(usage_for(result, first.prompt_tokens))
            exts.append(extension_for(result, mode))
        return JSONResponse({"id": cid, "object": "text_completion", "created": int(time.time()),
                             "model": model_name, "system_fingerprint": f"asymagent-{mode}",
                             "choices": choices, "usage": _sum_usage(usages),
                             "asymagent": exts[0] if len(exts) == 1 else exts})

    async def stream(req: CompletionRequest, request: Request, cid: str, mode: str, jobs: list,
                     first):
        created = int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def sse(index: int | None, text: str = "", finish: str | None = None,
                logprobs: dict | None = None, **extra) -> str:
            chunk = {"id": cid, "object": "text_completion", "created": created,
                     "model": model_name, "system_fingerprint": f"asymagent-{mode}",
                     "choices": [] if index is None else [
                         {"index": index, "text": text, "logprobs": logprobs,
                          "finish_reason": finish}]}
            chunk.update(extra)
            return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

        def error(ev: Failed) -> str:
            return sse_error(ev) + "data: [DONE]\n\n"

        usages = []
        try:
            for index, (job, task, recorder) in enumerate(jobs):
                if index:
                    first = await start(job, request)
                    if not isinstance(first, Started):  # a Response: its error as an event
                        if first.status_code == 499:
                            return
                        err = json.loads(bytes(first.body)).get("error", {})
                        yield error(Failed(first.status_code, err.get("message", "failed"),
                                           err.get("type", "server_error"), err.get("param"),
                                           err.get("code")))
                        return
                streamer = DeltaStreamer(tools_enabled=False, stop=req.stop)
                offset, sent = 0, 0

                def take(entries: list) -> dict | None:
                    nonlocal offset, sent
                    if recorder is None:
                        return None
                    out = completion_logprobs(texts, entries[sent:], offset)
                    sent = max(sent, len(entries))
                    offset += sum(len(t) for t in out["tokens"])
                    return out

                if req.echo:
                    yield sse(index, task.prompt_text, logprobs=None if recorder is None else
                              completion_logprobs(texts, task.prompt_logprobs, 0))
                    offset = len(task.prompt_text)
                while True:
                    ev = await next_event(job, request)
                    if ev is None:
                        return  # client gone: finally cancels the generation
                    if isinstance(ev, Failed):
                        yield error(ev)
                        return
                    if isinstance(ev, TextDelta):
                        for delta in streamer.push(ev.text):
                            pool = [] if recorder is None else \
                                visible(recorder.entries[: ev.tokens], stop_ids)
                            yield sse(index, delta["content"], logprobs=take(pool))
                    elif isinstance(ev, Finished):
                        if ev.timed_out:
                            yield error(Failed(504, f"request timed out after "
                                                    f"{request_timeout:g} s", "timeout_error",
                                               code="timeout"))
                            return
                        result = ev.result
                        rest = "".join(d.get("content", "") for d in
                                       streamer.finish(_AsText(result.text)))
                        final = [] if recorder is None else visible(result.logprobs, stop_ids)
                        yield sse(index, rest, finish_reason_for(result), take(final),
                                  asymagent=extension_for(result, mode))
                        usages.append(usage_for(result, first.prompt_tokens))
                        break
        finally:
            for job, _, _ in jobs:
                job.cancel.set()  # a no-op once finished; stops generation if the client left
        if include_usage:
            yield sse(None, usage=_sum_usage(usages))
        yield "data: [DONE]\n\n"


@dataclass
class _AsText:
    """What DeltaStreamer.finish reads from a result: the text, no tool calls."""

    text: str
    tool_calls: list = field(default_factory=list)
