"""SuffixStore: the global side of suffix drafting, previous outputs of all requests, bounded, LRU, optionally on disk.

SuffixDecoding's *global tree* indexes the responses of earlier requests, so that an agent that
emits the same tool-call JSON, ids and phrasings step after step (and run after run) can copy them
even when the current prompt does not contain them. Here the responses are kept as token arrays
in an LRU keyed by request (a response that a draft was copied from becomes most recent), bounded
by `max_requests` responses and `max_tokens` tokens in all; the oldest go first. Matching runs on
one concatenation of the responses (asymagent/decoding/suffix_match.py), rebuilt only when the
content changes.

`path` (optional) persists the store as a small .npz file: loaded when the store is created,
written (atomically: temp file + rename) after every `add`, so a served agent keeps what it
learned across restarts.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict

import numpy as np

from asymagent.decoding.suffix_match import SEP, SuffixDraft, speculate


class SuffixStore:
    """Bounded LRU of previous responses (token arrays) with suffix-matched drafting over them."""

    def __init__(self, max_requests: int = 256, max_tokens: int = 65536,
                 path: str | os.PathLike | None = None) -> None:
        if max_requests < 0 or max_tokens < 0:
            raise ValueError("SuffixStore needs max_requests >= 0 and max_tokens >= 0")
        self.max_requests, self.max_tokens = int(max_requests), int(max_tokens)
        self.path = None if path is None else os.fspath(path)
        self._entries: OrderedDict = OrderedDict()  # request id -> np.int32 [L]
        self._tokens = 0
        self._next_id = 0
        self._arr: np.ndarray | None = None  # [sum(L_i + 1)] responses, each followed by SEP
        self._starts: np.ndarray | None = None  # [R] start of each response in _arr
        self._ids: list = []  # request ids in _arr order
        if self.path is not None and os.path.exists(self.path):
            self.load(self.path)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def add(self, tokens, request_id=None) -> None:
        """Store one response (replacing an earlier one of the same id), evicting the oldest."""
        arr = np.asarray(list(tokens), dtype=np.int32)  # [L]
        if arr.size == 0 or self.max_requests == 0 or arr.size > self.max_tokens:
            return
        if request_id is None:
            request_id, self._next_id = self._next_id, self._next_id + 1
        if request_id in self._entries:
            self._tokens -= int(self._entries.pop(request_id).size)
        self._entries[request_id] = arr
        self._tokens += int(arr.size)
        while len(self._entries) > self.max_requests or self._tokens > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self._tokens -= int(old.size)
        self._arr = None
        if self.path is not None:
            self.save(self.path)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens, self._arr = 0, None

    def _array(self) -> np.ndarray:
        if self._arr is None:
            parts, starts, at = [], [], 0
            sep = np.array([SEP], dtype=np.int32)
            for arr in self._entries.values():
                parts += [arr, sep]
                starts.append(at)
                at += arr.size + 1
            self._arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
            self._starts = np.asarray(starts, dtype=np.int64)
            self._ids = list(self._entries)
        return self._arr

    def speculate(self, context: np.ndarray, **kw) -> SuffixDraft:
        """The best draft continuing `context` from any stored response (suffix_match.speculate).

        The response the draft was copied from becomes the most recently used."""
        if not self._entries:
            return SuffixDraft()
        draft = speculate(self._array(), context, **kw)
        if draft.tokens and draft.start >= 0:
            rid = self._ids[int(np.searchsorted(self._starts, draft.start, side="right")) - 1]
            if rid in self._entries:
                self._entries.move_to_end(rid)  # LRU by use; the array order is unaffected
        return draft

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the responses (oldest first) to `path` as .npz, atomically."""
        path = os.fspath(path)
        arrays = list(self._entries.values())
        lengths = np.asarray([a.size for a in arrays], dtype=np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, tokens=flat, lengths=lengths)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def load(self, path: str | os.PathLike) -> None:
        """Add the responses stored in `path` (within this store's bounds)."""
        with np.load(os.fspath(path)) as data:
            flat, lengths = data["tokens"].astype(np.int32), data["lengths"]
        saved, self.path = self.path, None  # no write-back while loading
        try:
            at = 0
            for n in lengths.tolist():
                self.add(flat[at: at + n])
                at += n
        finally:
            self.path = saved
