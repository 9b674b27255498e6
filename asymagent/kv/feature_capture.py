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
"""

from __future__ import annotations

import torch

CAPTURE_ATTR = "asymagent_capture"  # the FeatureCapture on a KV cache object (GrowingCache / DynamicCache)


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
        self.buf: torch.Tensor | None = None  # [capacity, F] F = len(layers) * H
        self.hi = 0  # positions [0, hi) written contiguously

    def record(self, start: int, parts: list) -> None:
        """One forward's outputs of `layers` (in layer order, each [T, H]) at positions [start, start+T)."""
        rows = torch.cat([p.reshape(-1, p.shape[-1]) for p in parts], dim=-1)  # [T, F]
        end = start + rows.shape[0]
        if self.buf is None or self.buf.shape[1] != rows.shape[1] or self.buf.dtype != rows.dtype:
            self.buf = rows.new_zeros((max(2 * end, 256), rows.shape[1]))
            self.hi = 0
        elif end > self.buf.shape[0]:
            grown = self.buf.new_zeros((2 * end, self.buf.shape[1]))
            grown[: self.buf.shape[0]] = self.buf
            self.buf = grown
        self.buf[start:end] = rows
        if start <= self.hi:
            self.hi = end  # later positions (if any) belonged to a cropped feed
        # else a gap: positions before `start` were never captured, the prefix stays as it was

    def valid(self, held: int) -> int:
        """Positions [0, n) whose features are current for a cache holding `held` tokens."""
        return min(self.hi, held)

    def features(self, start: int, end: int) -> torch.Tensor:
        """[end - start, F] features of positions [start, end) (call within `valid`)."""
        return self.buf[start:end]

    def reset(self) -> None:
        self.hi = 0


def capture_of(cache) -> FeatureCapture | None:
    """The FeatureCapture set on a KV cache object, or None."""
    return getattr(cache, CAPTURE_ATTR, None)
