"""Counts of the router's decisions in this process (router.py writes, ingress.py's /metrics reads).

A module of its own because Ray ships the router class by value (its module's globals are copied
into the handle's process): the router imports this module when it counts, so it reaches the
process's one `ROUTES`, the object the ingress reads.
"""

from __future__ import annotations

import threading


class RouteCounts:
    """Thread-safe counters of routing outcomes (one per process: the ingress's router)."""

    KINDS = ("affine", "new", "moved", "unkeyed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.KINDS, 0)

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._counts)


ROUTES = RouteCounts()
