"""The engine worker: threads that own the Engine and serve a bounded queue of generation jobs.

One thread per request the engine may decode at once (`Engine(max_num_seqs=N)`, `serve
--max-num-seqs`; asymagent/scheduling/): with N = 1 requests run one at a time on a single worker
thread, as generation is compute-bound; with N > 1 up to N jobs run at once, the engine batching
their forwards round by round, so their streams interleave. Everything that touches the engine
or its tokenizer runs holding the engine's lock (HF fast tokenizers are not safe to mutate from
two threads; the engine releases it only while a request waits for a batched forward). The
asyncio side submits a `GenerationJob`
(one `Task`: a chat turn, a text completion, a Responses turn) and reads its events from an
`asyncio.Queue` fed with `loop.call_soon_threadsafe`:

  Started           the prompt fits and generation is under way (sent with the first tokens)
  TextDelta(text)   newly decoded text, one per token (never a split UTF-8 character)
  Finished(result)  the engine's result (finish_reason "cancelled" if it was stopped)
  Failed(...)       an error to answer with (status + OpenAI error fields; errors.py)

A full queue raises `QueueFull` at submit time (-> HTTP 429). Cancellation (client disconnect)
and the request deadline are checked by the engine callback after every round, so a dropped
stream stops generating at the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from asymagent.chat.schema_refs import ToolSchemaError
from asymagent.integrations.server.errors import Failed

log = logging.getLogger("asymagent.server")


class QueueFull(Exception):
    """The worker's queue is at capacity (answered with 429)."""


@dataclass
class Started:
    prompt_tokens: int


@dataclass
class TextDelta:
    text: str
    tokens: int = 0  # tokens generated so far (the text covers them, minus held-back bytes)


@dataclass
class Finished:
    result: Any  # asymagent.engine.ChatResult
    timed_out: bool = False


class Task(Protocol):
    """What a job runs on the worker thread (chat.ChatTask, completions.CompletionTask)."""

    cache_key: str  # the engine cache session (dropped when the generation is cut short)
    max_new_tokens: int
    where: str  # the request field holding the prompt ("messages", "prompt", "input")

    def prompt_tokens(self, engine, chat_format) -> int:
        """Full-view prompt length; raises ValueError/TypeError/KeyError for a refused input."""

    def verifier_tokens(self, engine) -> int | None:
        """The verifier's view length when it reads a compressed view (modes compressed and
        asym), else None; asked only when the full prompt is over the context limit."""

    def run(self, engine, callback):
        """Generate; `callback(new_ids) -> bool` after every round (False stops)."""

    def record(self, trace_writer, engine, result) -> None:
        """Capture the finished request (asymagent.trace_capture.TraceWriter)."""


@dataclass
class GenerationJob:
    """One request for the worker: its task plus bookkeeping."""

    task: Task
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which the job is cut off
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    received: float = field(default_factory=time.monotonic)
    started: float | None = None
    first_token: float | None = None
    finished: float | None = None
    checked_at: float = 0.0  # last client-disconnect check (asyncio side)

    def emit(self, event) -> None:
        """Thread-safe: hand an event to the asyncio side (ignored once the loop is gone)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # event loop closed: the server is shutting down
            pass


class IncrementalDetokenizer:
    """Decode a growing token list into text deltas without splitting multi-byte characters.

    vLLM's incremental scheme: decode a short window `ids[prefix:read]` and the same window
    extended by the new tokens `ids[prefix:]`; the delta is what the extension added. Both
    decodes start at the same token, so tokenizer quirks at a window's start (a SentencePiece
    leading space) cancel out, and each round costs O(window), not O(response). While the
    extension ends in U+FFFD (an incomplete UTF-8 sequence) nothing is emitted and the window
    is kept, so the held bytes come out once the character is complete.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # tokens up to here have been emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def feed(self, new_ids: list[int]) -> str:
        self.ids.extend(int(i) for i in new_ids)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]


def count_prompt_tokens(chat_format, messages: list[dict], tools: list[dict] | None) -> int:
    """Full-view prompt length (what the drafter reads; the verifier's view is never longer)."""
    return len(chat_format.render_ids(messages, tools=tools, add_generation_prompt=True))


def context_limit(engine) -> int | None:
    """The verifier's max_position_embeddings (None if unknown): the engine checks a request
    against the view its verifier reads (Engine's ContextLengthError); the drafter only
    proposes tokens and reads the full view however long (the shipped one was trained on
    1024-token sequences and reads the bench's 5000-token histories)."""
    model = getattr(engine, "verifier", None)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(limit) if limit else None


class EngineWorker:
    """N threads, one engine, a bounded FIFO of jobs; see the module docstring."""

    def __init__(self, engine, *, max_queue: int = 16, metrics=None,
                 observe: Callable[[GenerationJob, Any], None] | None = None):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.engine = engine
        self.metrics = metrics
        self.observe = observe
        self.max_context = context_limit(engine)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        # jobs generated at once: the engine's max_num_seqs (1 for an engine without a scheduler)
        self.width = max(1, int(getattr(getattr(engine, "scheduler", None), "max_num_seqs", 1)))
        self._threads: list = []
        self._lock = threading.Lock()
        self._chat_format = None  # built on a worker thread (it uses the tokenizer)
        self._current: dict = {}  # id(job) -> the jobs being generated
        self._running = 0  # jobs being generated (num_requests_running)
        self._service_s = 0.0  # moving average of a generation's duration (for Retry-After)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self.width:
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"asymagent-engine-{len(self._threads)}")
                thread.start()
                self._threads.append(thread)

    def _engine_lock(self):
        """The engine's lock (tokenizer and engine state), or nothing for an engine without one."""
        lock = getattr(self.engine, "lock", None)
        return lock if lock is not None else contextlib.nullcontext()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel queued jobs and stop the threads after the running jobs' next round."""
        with self._lock:
            threads, self._threads = self._threads, []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.emit(Failed(503, "server is shutting down", "server_error"))
        for current in list(self._current.values()):
            current.cancel.set()  # stops at its next round
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join(timeout)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def retry_after_s(self) -> int:
        """Seconds a client refused with 429 should wait: the queue's expected drain time
        (depth x the moving average of a generation's duration / the jobs run at once), at
        least 1, at most 60."""
        return max(1, min(60, math.ceil(self._service_s * (self.depth + 1) / self.width)))

    # -- submission (asyncio side) ------------------------------------------------------------
    def submit(self, job: GenerationJob) -> None:
        self.start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"the server queue is full ({self._queue.maxsize} requests waiting); "
                            "retry later") from None
        if self.metrics is not None:
            self.metrics.waiting.labels(self.metrics.model_name).set(self._queue.qsize())

    # -- worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if self.metrics is not None:
                self.metrics.waiting.labels(self.metrics.model_name).set(self._queue.qsize())
            self._current[id(job)] = job
            try:
                self._process(job)
            except Exception as exc:  # worker bug: answer 500 without internals, keep serving
                log.error("generation failed: %s\n%s", exc, traceback.format_exc())
                job.emit(Failed(500, f"internal error ({type(exc).__name__}); the server log "
                                     "has the details", "server_error"))
            finally:
                self._current.pop(id(job), None)

    def _process(self, job: GenerationJob) -> None:
        if job.cancel.is_set():  # client left while queued
            return
        job.started = time.monotonic()
        if job.started > job.deadline:
            job.emit(Failed(504, "request timed out while waiting in the queue",
                            "timeout_error", code="timeout"))
            return
        with self._engine_lock():  # the tokenizer, and views the engine may be building
            admitted = self._admit(job.task)
        if isinstance(admitted, Failed):
            job.emit(admitted)
            return
        self._generate(job, admitted)

    def _admit(self, task: Task) -> int | Failed:
        """The prompt's length, or the 400 for a prompt that is refused or does not fit."""
        where, max_new = task.where, task.max_new_tokens
        uncapped = getattr(task, "uncapped", False) and self.max_context is not None
        max_new = 1 if uncapped else max_new  # no cap asked: whatever room the context leaves
        try:
            if self._chat_format is None and where != "prompt":  # a text completion needs none
                from asymagent.chat.chat_format import ChatFormat

                self._chat_format = getattr(self.engine, "chat_format", None) or \
                    ChatFormat(self.engine.tokenizer)
            prompt_tokens = task.prompt_tokens(self.engine, self._chat_format)
            if self.max_context is None or prompt_tokens + max_new <= self.max_context:
                if uncapped:
                    task.cap(self.max_context - prompt_tokens)
                return prompt_tokens
            # in modes compressed and asym the verifier reads the compressed view: the full one
            # may be longer than the model's context (the drafter reads it whole)
            seen = task.verifier_tokens(self.engine)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # the input was refused
            what = "messages or tools" if where == "messages" else where
            return Failed(400, f"invalid {what}: {exc}", param=where)
        if seen is not None and seen + max_new <= self.max_context:
            if uncapped:
                task.cap(self.max_context - seen)
            return prompt_tokens
        shown = prompt_tokens if seen is None else seen
        note = "" if seen is None or seen == prompt_tokens else \
            f" The verifier reads the {where} compressed to {seen} of {prompt_tokens} tokens."
        return Failed(400, f"This model's maximum context length is {self.max_context} "
                           f"tokens. However, you requested {shown + max_new} tokens "
                           f"({shown} in the {where}, {max_new} in the completion).{note} "
                           f"Please reduce the length of the {where} or completion.",
                      param=where, code="context_length_exceeded")

    def _generate(self, job: GenerationJob, prompt_tokens: int) -> None:
        detok = IncrementalDetokenizer(self.engine.tokenizer)
        timed_out = False
        started = False

        def announce() -> None:
            # Started goes out with the first tokens (or the result), not before the engine
            # call: an error the engine raises up front is still answered with a proper status.
            nonlocal started
            if not started:
                started = True
                job.emit(Started(prompt_tokens))

        def callback(new_ids) -> bool:
            nonlocal timed_out
            announce()
            if job.first_token is None and len(new_ids):
                job.first_token = time.monotonic()
            for token in list(new_ids):  # a delta per token, as OpenAI and vLLM stream
                text = detok.feed([token])
                if text:
                    job.emit(TextDelta(text, tokens=len(detok.ids)))
            if job.cancel.is_set():
                return False
            if time.monotonic() > job.deadline:
                timed_out = True
                return False
            return True

        result, failed = self._run_task(job.task, callback)
        if failed is not None or job.cancel.is_set() or timed_out:
            # A generation cut short (client gone, deadline) or failed leaves its conversation's
            # caches holding tokens nobody will extend, or in an unknown state: free them.
            with self._engine_lock():
                self.engine.caches.drop(job.task.cache_key)
        if failed is not None:
            job.emit(failed)
            return
        self._service_s = 0.8 * self._service_s + 0.2 * (time.monotonic() - job.started)
        job.finished = time.monotonic()
        if job.first_token is None and result.token_ids:
            job.first_token = job.finished
        if job.cancel.is_set():
            if self.metrics is not None:
                self.metrics.abort(len(result.token_ids))
        elif self.observe is not None:
            self.observe(job, result)
        announce()
        job.emit(Finished(result, timed_out=timed_out))

    def _run_task(self, task: Task, callback) -> tuple[Any, Failed | None]:
        """(result, None), or (None, the error to answer with) when the engine refused or failed."""
        self._set_running(+1)
        try:
            return task.run(self.engine, callback), None
        except ToolSchemaError as exc:  # a forced call's schema the grammar cannot serve
            return None, Failed(400, str(exc), param="tools", code="invalid_schema")
        except ValueError as exc:  # other bad input the engine found
            message = str(exc)
            param = next((f for f in ("response_format", "logit_bias") if f in message), None)
            return None, Failed(400, message, param=param)
        except Exception as exc:  # engine bug: logged in full, answered without internals
            log.error("generation failed: %s\n%s", exc, traceback.format_exc())
            return None, Failed(500, f"internal error during generation ({type(exc).__name__}); "
                                     "the server log has the details", "server_error")
        finally:
            self._set_running(-1)

    def _set_running(self, step: int) -> None:
        with self._lock:
            self._running += step
            running = self._running
        if self.metrics is not None:
            self.metrics.running.labels(self.metrics.model_name).set(running)
