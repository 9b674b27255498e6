"""A request's clock in company: its wall time, less its waits for batched forwards, plus its share of them.

Adaptive K and the draft choice (asymagent/decoding/adaptive_k.py) weigh a round's drafts
against its cost in seconds. Alone, a round's wall time is its cost. Under continuous batching
(asymagent/scheduling/batcher.py) it is not: a request waiting for its forward also waits for the
other requests' Python, their drafter steps and their prefills, and its own forward is one
sequence of a forward shared with up to seven others. What the request costs the batch is its
own serial time (engine Python runs one request at a time) plus its share of the forwards it
joined (`ForwardCosts.shares`: the rows it brought at the measured per-row cost, the rest of the
forward split evenly between its sequences).

`now()` is `time.perf_counter()` moved by what the batcher charged the calling thread so far
(`charge(waited, share)` after each forward it waited for: + share - waited), so an interval
`now() - t0` is the request's cost in company over it, and exactly its wall time where no
forward was shared (a request alone: nothing is charged). Only speed decisions read it, and
only where they cannot change a token (`RequestPlan.adaptive_k`).
"""

from __future__ import annotations

import threading
import time

_LOCAL = threading.local()  # .offset: seconds charged to this thread (share - waited, summed)


def now() -> float:
    """perf_counter() plus the calling thread's charges (module doc)."""
    return time.perf_counter() + getattr(_LOCAL, "offset", 0.0)


def charge(waited: float, share: float) -> None:
    """The calling thread waited `waited` seconds for a forward whose cost to it was `share`."""
    _LOCAL.offset = getattr(_LOCAL, "offset", 0.0) + share - waited
