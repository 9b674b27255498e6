"""Scheduler: which requests decode at once (continuous batching), bounded, first come first served.

`Engine(max_num_seqs=N)` with N > 1 (vLLM's name; `asymagent serve --max-num-seqs`) lets up to N
requests decode at once, their forwards gathered round by round (asymagent/scheduling/batcher.py)
into forwards of at most `max_num_batched_tokens` rows (vLLM's name; at most the packed kernel's
32 on the CPU path, asymagent/kv/batched_forward.py). A request is admitted (`slot`) when fewer
than N run and no other request of its conversation (`cache_key`) runs: a conversation's caches
and views are used by one request at a time, each seeing them as its predecessor left them, as
with the one-at-a-time engine. Waiting requests are admitted in arrival order, skipping those
whose conversation is busy. `running` / `waiting` are vLLM's num_requests_running / _waiting.

N = 1 (the default) is the one-at-a-time engine: `slot` is the FairLock alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque

from asymagent.fair_lock import FairLock
from asymagent.kv.batched_forward import MAX_ROWS
from asymagent.scheduling.batcher import ForwardBatcher


class Scheduler:
    """Admission for requests decoding at once (module doc)."""

    def __init__(self, baton: FairLock, max_num_seqs: int, max_num_batched_tokens: int = MAX_ROWS) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        self.baton = baton
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.batcher = ForwardBatcher(baton, max_num_batched_tokens)
        self._cv = threading.Condition()
        self._queue: deque = deque()  # [cache_key] per waiting request, oldest first
        self._busy: set = set()  # cache keys of the running requests
        self.running = 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _may_start(self, entry: list) -> bool:
        if self.running >= self.max_num_seqs:
            return False
        for other in self._queue:  # the oldest waiting request whose conversation is free
            if other[0] not in self._busy:
                return other is entry
        return False

    @contextlib.contextmanager
    def slot(self, cache_key):
        """The block runs as one admitted request of conversation `cache_key` (any hashable: the
        engine passes its cache store's and the request's), holding the baton
        (the engine's FairLock) except while it waits for a forward."""
        if self.max_num_seqs == 1:
            with self.baton:
                yield
            return
        entry = [cache_key]
        with self._cv:
            self._queue.append(entry)
            try:
                while not self._may_start(entry):
                    self._cv.wait()
            finally:
                self._queue.remove(entry)
                self._cv.notify_all()
            self._busy.add(cache_key)
            self.running += 1
        try:
            with self.batcher.decoding(), self.baton:
                yield
        finally:
            with self._cv:
                self._busy.discard(cache_key)
                self.running -= 1
                self._cv.notify_all()
