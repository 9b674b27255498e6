"""FeatureCapture: the verifier's hidden states at a few layers, kept per cached position (EAGLE-3's features).

An EAGLE-3 feature head (asymagent/decoding/feature_head.py) drafts from the verifier's own
hidden states at a low, a middle and a high layer. The verifier computes them anyway in every
forward (prefill, plain step, verify): a FeatureCapture set on a KV cache (`CAPTURE_ATTR`, set by
`ModelCache` when its `capture` is set) receives each forward's layer outputs and keeps them by
absolute position, so a drafter reads the features of exactly the positions the cache holds.

Recording only stores references and copies the rows afterwards: no op of the forward changes,
so the verifier's logits are the same bits with capture as without (tests/test_feature_drafter.py).
Where the cache is cropped and re-fed, the positions are written again; `valid(held)` is the
length of the contiguous prefix of positions captured since, up to the tokens the cache holds.

Memory follows the KV cache (3 x H values a position: 9.2 KB a token on the pair's 1.5B in bf16):
- the buffer holds positions `[base, base + capacity)` and grows as the KV cache's GrowingLayer
  does (asymagent/kv/growing_cache.py `_capacity`: x1.5, 256 rows of headroom, 64-row aligned);
- `crop(keep)` (ModelCache.crop) drops the positions the cache drops, the head's rows over them
  too (`head_state.crop`), and gives memory back when the buffer is over twice what is held;
- `reset()` (ModelCache.reset: a crop to 0, or a sliding-window cache that must re-prefill) frees
  the buffer and the head's state;
- `release(floor)` (ModelCache, after each forward): positions before the cache's crop floor (a
  sliding-window cache past its window + rollback tail, growing_cache.crop_floor) can never be
  read again; rows before `min(floor - 1, the head's last position)` are moved out when the buffer is
  full (one copy, amortised), so a sliding-window verifier's features stay bounded too.
With a full-attention verifier the capture therefore holds exactly the positions its KV cache
holds, never more than ~1.5x their rows; `TRIM = False` keeps the untrimmed buffer (the tests
compare the drafts both ways).
"""

from __future__ import annotations

import torch

from asymagent.kv.growing_cache import _capacity

CAPTURE_ATTR = "asymagent_capture"  # the FeatureCapture on a KV cache object (GrowingCache / DynamicCache)
TRIM = True  # crop / reset / release give memory back (False: the buffer only grows, as first built)


def default_layers(num_layers: int) -> tuple:
    """EAGLE-3's low / middle / high layers of a `num_layers`-layer verifier (0-based layer
    outputs: 2, L/2, L-3, as EAGLE-3 reads a 32-layer Llama; never the last layer, whose output
    transformers returns after the final norm). 28 layers (the pair's 1.5B): (2, 14, 25)."""
    top = max(num_layers - 2, 0)  # the last layer but one
    picks = {min(2, top), min(num_layers // 2, top), min(max(num_layers - 3, 0), top)}
    return tuple(sorted(picks))


class FeatureCapture:
    """Per-position hidden states of `layers` (each [H]) concatenated: [positions, len(layers)*H]."""

    def __init__(self, layers: tuple) -> None:
        self.layers = tuple(int(i) for i in layers)
        self.layer_set = frozenset(self.layers)
        self.buf: torch.Tensor | None = None  # [capacity, F] F = len(layers) * H; row i = position base + i
        self.base = 0  # first position held
        self.hi = 0  # positions [0, hi) written contiguously (those before `base` released)
        self.floor = 0  # positions before it may be moved out (release)
        self.head_state = None  # the feature drafter's state over these positions (feature_drafter.HeadState)

    @property
    def rows(self) -> int:
        """Rows allocated (the memory the capture holds: rows x F values)."""
        return 0 if self.buf is None else self.buf.shape[0]

    def record(self, start: int, parts: list) -> None:
        """One forward's outputs of `layers` (in layer order, each [T, H]) at positions [start, start+T)."""
        rows = torch.cat([p.reshape(-1, p.shape[-1]) for p in parts], dim=-1)  # [T, F]
        end = start + rows.shape[0]
        if start < self.base:  # before the released positions (never after a crop the cache allowed)
            self.reset()
        if self.buf is None or self.buf.shape[1] != rows.shape[1] or self.buf.dtype != rows.dtype:
            self.base, self.hi = 0, 0
            self.buf = rows.new_zeros((_capacity(end, 0) if TRIM else max(2 * end, 256), rows.shape[1]))
        elif end - self.base > self.buf.shape[0]:
            self._make_room(end)
        self.buf[start - self.base:end - self.base] = rows
        if start <= self.hi:
            self.hi = end  # later positions (if any) belonged to a cropped feed
        # else a gap: positions before `start` were never captured, the prefix stays as it was

    def _make_room(self, end: int) -> None:
        """Room up to position `end`: move out the released positions first, then grow."""
        held = max(self.hi - self.base, 0)
        keep_from = min(max(self.floor, self.base), self.base + held) if TRIM else self.base
        if keep_from > self.base and end - keep_from <= self.buf.shape[0]:
            src = keep_from - self.base
            n = held - src
            self.buf[:n] = self.buf[src:src + n].clone()
            self.base = keep_from
            return
        cap = _capacity(end - keep_from, self.buf.shape[0]) if TRIM else 2 * end
        grown = self.buf.new_zeros((cap, self.buf.shape[1]))
        src = keep_from - self.base
        n = min(held, self.buf.shape[0]) - src
        grown[:n] = self.buf[src:src + n]
        self.buf, self.base = grown, keep_from

    def valid(self, held: int) -> int:
        """Positions [0, n) whose features are current for a cache holding `held` tokens."""
        return min(self.hi, held)

    def features(self, start: int, end: int) -> torch.Tensor:
        """[end - start, F] features of positions [start, end) (call within `valid`, from `base`)."""
        if start < self.base:
            raise IndexError(f"features of position {start} were released (held from {self.base})")
        return self.buf[start - self.base:end - self.base]

    def crop(self, keep: int) -> None:
        """The cache keeps its first `keep` positions: so do the features and the head's rows."""
        if not TRIM:
            return
        if self.buf is None or (self.base > 0 and keep - 1 < self.base):
            self.reset()  # the head would read a released position
            return
        self.hi = min(self.hi, keep)
        if self.head_state is not None:
            self.head_state.crop(keep)
        self.floor = min(self.floor, self._head_needs())
        held = self.hi - self.base
        want = _capacity(held, 0)
        if self.buf.shape[0] > 2 * want:  # give memory back
            self.buf = self.buf[:want].clone()

    def release(self, floor: int) -> None:
        """The cache can no longer be cropped below `floor`: positions the head has read and no
        crop can bring back may be moved out (at the next growth)."""
        self.floor = max(self.floor, min(floor - 1, self._head_needs()))

    def _head_needs(self) -> int:
        """The first position the head may still read: it re-runs its last position, or (no head
        yet) reads from the start."""
        return 0 if self.head_state is None else max(self.head_state.n - 1, 0)

    def reset(self) -> None:
        """The cache was dropped: drop the features and the head's state."""
        self.hi = 0
        if TRIM:
            self.buf, self.base, self.floor, self.head_state = None, 0, 0, None


def capture_of(cache) -> FeatureCapture | None:
    """The FeatureCapture set on a KV cache object, or None."""
    return getattr(cache, CAPTURE_ATTR, None)
