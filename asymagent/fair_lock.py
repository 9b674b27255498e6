"""FairLock: a reentrant lock granted in arrival order (FIFO); it serialises the requests to one Engine.

`threading.Lock` makes no promise about which waiter wins, so under a stream of requests one
caller could wait indefinitely. Here every waiter takes a place in a queue and the lock goes to
the oldest one when it is released. The holder may acquire it again (the engine's `chat` calls
its own `generate`); it is released when every acquire has been matched.
"""

from __future__ import annotations

import threading
from collections import deque


class FairLock:
    """A reentrant FIFO lock (`with lock: ...`); `waiting` counts the queued threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque = deque()  # one ticket per waiting thread, oldest first
        self._owner: int | None = None  # threading.get_ident() of the holder
        self._depth = 0  # acquires not yet released by the holder

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            ticket = object()
            self._queue.append(ticket)
            try:
                while self._owner is not None or self._queue[0] is not ticket:
                    self._cond.wait()
            except BaseException:  # interrupted while queued: give the place up
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("FairLock.release() by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    def release_all(self) -> int:
        """Release every acquire the calling holder made; returns how many, for `reacquire`
        (a request that waits for a batched forward lets the others run meanwhile,
        asymagent/scheduling/batcher.py)."""
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("FairLock.release_all() by a thread that does not hold it")
            depth, self._depth, self._owner = self._depth, 0, None
            self._cond.notify_all()
            return depth

    def reacquire(self, depth: int) -> None:
        """Take the lock again (in arrival order) with the depth `release_all` returned."""
        self.acquire()
        with self._cond:
            self._depth = depth

    @property
    def holder(self) -> int | None:
        """threading.get_ident() of the thread holding the lock, or None."""
        return self._owner

    @property
    def waiting(self) -> int:
        """Threads queued for the lock (not counting the holder)."""
        return len(self._queue)

    def __enter__(self) -> "FairLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
