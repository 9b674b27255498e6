"""ForwardBatcher: the model forwards of the requests decoding at once, gathered into as few forwards as it can.

Continuous batching without rewriting the decode loop: every admitted request decodes in its own
thread with the loop it always had (asymagent/decoding/loop.py, round.py), holding the engine's
FairLock (the "baton": only one request runs engine Python at a time, so shared state, the
caches' LRU, the store of earlier responses, the conversations, is touched by one at a time, as
before). When a request's decode step asks its model for a forward (a decode, a K+1-row verify,
a drafter step, a prefill chunk), the forward goes to the batcher (`RoutedLean`), the request
releases the baton and waits; the next request runs up to its own forward, and so on. When every
admitted request is waiting for a forward (a "round"), the last one to arrive runs them
(`_lead`; with forwards of two models waiting, the cheaper model's first, the others wait for
the next round, so the requests' speculative rounds fall into step): per model, the batchable ones (asymagent/kv/batched_forward.py) packed first-fit into
forwards of at most `max_rows` rows, the others one by one. Each request then takes the baton
back, in arrival order, and goes on with its result. A request joins at the next round (its
prefill is just its first forwards) and leaves when it ends (`decoding` exits).

Outputs do not depend on the company: a batched forward gives every row the bits of its own
forward (batched_forward.py), and which forwards share a round never changes a value, only when it
is computed. One request alone takes none of this (its forwards run at once, under the baton).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from asymagent.fair_lock import FairLock
from asymagent.kv.batched_forward import (MAX_ROWS, SeqCall, batchable, forward_many, model_batchable,
                                         run_one)
from asymagent.kv.lean_forward import ATTR, LeanForward, lean_of
from asymagent.scheduling import company_clock
from asymagent.scheduling.forward_costs import ForwardCosts

_CURRENT = threading.local()  # .batcher: the ForwardBatcher this request thread decodes under


def current() -> "ForwardBatcher | None":
    """The batcher the calling thread's request decodes under, or None (forwards run at once)."""
    return getattr(_CURRENT, "batcher", None)


class RoutedLean(LeanForward):
    """A LeanForward whose `logits` / `hidden` from a request thread under a ForwardBatcher go
    through it (anything else runs as LeanForward). `route(model)` swaps the class of the
    model's attached LeanForward in place (no state added: the same object, the same weights)."""

    def logits(self, input_ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        batcher = current()
        if batcher is None:
            return super().logits(input_ids, cache, keep)
        return batcher.forward(SeqCall(self, cache, input_ids[0].tolist(), keep))

    def hidden(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        batcher = current()
        if batcher is None:
            return super().hidden(input_ids, cache)
        return batcher.forward(SeqCall(self, cache, input_ids[0].tolist(), None))


def route(model: torch.nn.Module | None) -> bool:
    """Send `model`'s lean forwards through the calling request's batcher (see RoutedLean);
    False where the model has no LeanForward (its forwards then run at once, unbatched)."""
    lean = getattr(model, ATTR, None) if model is not None else None
    if not isinstance(lean, LeanForward):
        return False
    if type(lean) is LeanForward:
        lean.__class__ = RoutedLean
    return True


@dataclass
class _Ticket:
    """One waiting forward: its call, then its result or error."""

    call: SeqCall
    result: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False
    share: float = 0.0  # seconds of its forward charged to its request (ForwardCosts.shares)


class ForwardBatcher:
    """Gathers the forwards of the requests decoding under it (module doc)."""

    def __init__(self, baton: FairLock, max_rows: int = MAX_ROWS) -> None:
        self.baton = baton
        # rows of one batched forward: the packed kernel's limit bounds it (batched_forward.py)
        self.max_rows = max(1, min(int(max_rows), MAX_ROWS))
        self._cv = threading.Condition()
        self._pending: list = []  # _Ticket, in arrival order
        self._active = 0  # request threads decoding under the batcher
        self._running = False  # a thread is running a round's forwards
        # called with (sequences, rows) after every forward a round runs (metrics)
        self.observers: list[Callable[[int, int], None]] = []
        # per model (id of its LeanForward): the fit of its decode-sized forwards' seconds
        self.costs: dict = {}
        # charge a request in company its share of the forwards it waited for
        # (asymagent/scheduling/company_clock.py); False: its wall time, as alone
        self.cost_sharing = True

    def draft_share(self) -> int | None:
        """Most drafts one request's round should verify while several requests decode under
        this batcher: its fair share of one batched forward's rows (`max_rows` // requests
        decoding, less the row every verify has), so that every request's verify fits ONE
        forward instead of spilling into a second; None for a request alone (no cap). Read by
        the decode loop only where K is tuned anyway (a position-invariant rule: the tokens do
        not depend on K, asymagent/decoding/loop.py)."""
        active = self._active
        if active <= 1:
            return None
        return max(self.max_rows // active - 1, 0)

    @contextlib.contextmanager
    def decoding(self):
        """The calling thread's request decodes under this batcher for the block (admitted)."""
        with self._cv:
            self._active += 1
        saved = current()
        _CURRENT.batcher = self
        try:
            yield
        finally:
            _CURRENT.batcher = saved
            with self._cv:
                self._active -= 1
                self._cv.notify_all()  # the others may all be waiting now: one of them leads

    def forward(self, call: SeqCall) -> torch.Tensor:
        """`call`'s output once a round has run it; alone, at once."""
        with self._cv:
            alone = self._active <= 1 and not self._pending and not self._running
        if alone:
            t0 = time.perf_counter()
            out = run_one(call)
            self._observe([call], time.perf_counter() - t0)
            return out
        ticket = _Ticket(call)
        held = self.baton.holder == threading.get_ident()
        t_wait = time.perf_counter()
        depth = self.baton.release_all() if held else 0
        try:
            with self._cv:
                self._pending.append(ticket)
                self._cv.notify_all()
                while not ticket.done:
                    if not self._running and self._pending and len(self._pending) >= self._active:
                        self._lead()
                    else:
                        self._cv.wait()
        finally:
            if held:
                self.baton.reacquire(depth)
            if self.cost_sharing:
                company_clock.charge(time.perf_counter() - t_wait, ticket.share)
        if ticket.error is not None:
            raise ticket.error
        return ticket.result

    def _lead(self) -> None:
        """Run the round's forwards (called holding `_cv`; released while they run). When the
        waiting forwards are of several models, only the cheapest model's run (the fewest
        layers: drafter steps) and the others keep waiting: the requests still drafting reach
        their verify forward in the next rounds, and every request's verify then runs in one
        forward instead of one per drafting phase (speculative rounds of different requests
        fall into step)."""
        batch = self._pending
        models = {id(t.call.lean): len(t.call.lean.layers) for t in batch}
        if len(models) > 1:
            cheapest = min(models, key=models.get)
            self._pending = [t for t in batch if id(t.call.lean) != cheapest]
            batch = [t for t in batch if id(t.call.lean) == cheapest]
        else:
            self._pending = []
        self._running = True
        self._cv.release()
        try:
            self._run(batch)
        finally:
            self._cv.acquire()
            self._running = False
            self._cv.notify_all()

    def _run(self, batch: list) -> None:
        """Per model: batchable calls first-fit into forwards of <= max_rows rows, others alone."""
        by_model: dict = {}
        for t in batch:
            by_model.setdefault(id(t.call.lean), []).append(t)
        for tickets in by_model.values():
            lean = tickets[0].call.lean
            model_ok = len(tickets) > 1 and lean_of(lean.model) is lean and model_batchable(lean)
            groups: list = []  # [rows, [tickets]]
            for t in tickets:
                if not batchable(t.call, model_ok):
                    self._finish([t], lambda calls: [run_one(calls[0])])
                    continue
                for g in groups:
                    if g[0] + t.call.rows <= self.max_rows:
                        g[0] += t.call.rows
                        g[1].append(t)
                        break
                else:
                    groups.append([t.call.rows, [t]])
            for _, group in groups:
                self._finish(group, forward_many)

    def _finish(self, tickets: list, run: Callable[[list], list]) -> None:
        t0 = time.perf_counter()
        try:
            outs = run([t.call for t in tickets])
            for t, out in zip(tickets, outs):
                t.result = out
        except Exception as exc:  # noqa: BLE001 - each waiting request raises it
            for t in tickets:
                t.error = exc
        seconds = time.perf_counter() - t0
        costs = self._observe([t.call for t in tickets], seconds)
        for t, share in zip(tickets, costs.shares([t.call.rows for t in tickets], seconds)):
            t.share = share
            t.done = True

    def _observe(self, calls: list, seconds: float) -> ForwardCosts:
        """Record a forward of `calls` that took `seconds`: its model's cost fit (decode-sized
        forwards only: a prefill chunk is another regime), the observers; returns the fit (a
        batched forward's shares are read from it; a request alone is charged nothing)."""
        rows = [c.rows for c in calls]
        costs = self.costs.get(id(calls[0].lean))
        if costs is None:
            costs = self.costs[id(calls[0].lean)] = ForwardCosts()
        if sum(rows) <= self.max_rows:
            costs.observe(len(calls), sum(rows), seconds)
        for fn in self.observers:
            fn(len(calls), sum(rows))
        return costs
