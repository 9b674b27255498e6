"""SlidingLayer: a sliding-window layer cache that keeps the window plus a rollback tail.

transformers' `DynamicSlidingWindowLayer` keeps exactly the last `sliding_window - 1` positions
once the window is full and then refuses `crop` (a RuntimeError): a speculative round that
rejects drafts, or a conversation's next turn that cuts the cache back to its common prefix, crashed
every sliding-window model (Mistral, Gemma 3's local layers, Qwen with `use_sliding_window`) as
soon as its context passed the window.

`SlidingLayer` keeps positions `[base, length)` in one buffer `[B, H_kv, capacity, D]`, at least
the last `sliding_window - 1 + TAIL` of them (all of them while `base` is 0). A forward of T
tokens at positions `[c, c + T)` reads keys `[c - W + 1, c + T)` (W = sliding_window; a query at
p sees keys p - W < j <= p, transformers' `sliding_window_overlay`), exactly the keys and the
`(kv_length, kv_offset)` mask sizes of the stock layer, so every logit is the same.
`crop` moves the length back; it is valid while the window before the new length is still held
(`can_crop_to`): any rollback of at most TAIL positions, and any crop while the whole
sequence is held. A cropped length whose window was already dropped is refused
(`can_crop_to` False, `crop` raises): the owner (asymagent/kv/cache.py `ModelCache.crop`)
then drops the cache and re-prefills, never attends to a wrong window.

Old positions are dropped only when the buffer is full: the held window moves to the buffer's
start with one copy, so copies are amortised O(1) per token (capacity is at least twice the
held span). Aligned reads (`attend_align`, asymagent/kv/growing_cache.py): the layer hands
attention a multiple of `attend_align` positions from the window's first key, the tail past
the length masked by the causal mask (buffers zero-initialised; finite), so a row's bits do
not depend on how many tokens the forward feeds, as on a full-attention GrowingLayer.
Inference only: an update that needs autograd concatenates instead.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

# positions kept beyond the window: the longest rollback served without a re-prefill (a
# speculative round's K + 1 fed tokens, <= 32 on the CPU and 16 under CUDA graphs; a new turn's
# re-rendered end of the last answer)
TAIL = 256
ALIGN = 64  # capacities are a multiple of this many positions


class SlidingLayer(DynamicLayer):
    """One sliding-window layer: window + TAIL positions held, crop within them (module doc)."""

    is_sliding = True

    def __init__(self, sliding_window: int, attend_align: int = 1, tail: int | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.sliding_window = int(sliding_window)
        self.attend_align = attend_align
        self.tail = TAIL if tail is None else tail
        self._k = self._v = None  # buffers [B, H_kv, capacity, D]; slot i holds position base + i
        self._base = 0  # first held position
        self._len = 0  # cached positions (absolute): positions [base, length) are held

    # ------------------------------------------------------------------ geometry
    def first_key(self, start: int) -> int:
        """The first position a forward whose tokens start at `start` attends to."""
        return max(start - self.sliding_window + 1, 0)

    def _read(self, start: int, rows: int) -> int:
        """How many positions attention reads for `rows` tokens at `start` (aligned: module doc)."""
        n = start + rows - self.first_key(start)
        a = self.attend_align
        return n if a <= 1 else -(-(n + 1) // a) * a

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, kv offset) of the mask for a forward of `query_length` tokens."""
        return self._read(self._len, query_length), self.first_key(self._len)

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.sliding_window

    def can_crop_to(self, keep: int) -> bool:
        """Whether the cache cropped to `keep` positions still holds the window a forward then reads."""
        return keep >= self._len or self._base == 0 or keep - self._base >= self.sliding_window - 1

    def crop_floor(self) -> int:
        """The smallest length `can_crop_to` allows (0 while the whole sequence is held)."""
        return 0 if self._base == 0 else min(self._base + self.sliding_window - 1, self._len)

    # ------------------------------------------------------------------ buffers
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None
        self._base = self._len = 0

    def _view(self) -> None:
        held = self._len - self._base
        self.keys = self._k[:, :, :held]  # [B, H_kv, held, D]
        self.values = self._v[:, :, :held]

    def _fits(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        k = self._k
        return (k is not None and k.shape[:2] == key_states.shape[:2]
                and k.shape[-1] == key_states.shape[-1] and self._v.shape[-1] == value_states.shape[-1]
                and k.dtype == key_states.dtype and k.device == key_states.device
                and (torch.is_inference_mode_enabled() or not k.is_inference()))

    def _make_room(self, key_states: torch.Tensor, value_states: torch.Tensor, end: int) -> None:
        """Room for slots up to absolute position `end`: drop positions before the held span
        (window + tail before the length), moving the rest to slot 0; reallocate if still short."""
        keep_from = max(self._base, self._len - (self.sliding_window - 1) - self.tail, 0)
        held = self._len - keep_from
        fits = self._fits(key_states, value_states)
        if fits and end - keep_from <= self._k.shape[-2]:
            if keep_from > self._base:  # move the held span to the start (one copy)
                src = keep_from - self._base
                self._k[:, :, :held] = self._k[:, :, src:src + held].clone()
                self._v[:, :, :held] = self._v[:, :, src:src + held].clone()
                self._base = keep_from
            return
        span = self.sliding_window - 1 + self.tail
        cap = -(-((end - keep_from) + span) // ALIGN) * ALIGN  # >= twice the held span
        b, h, _, d = key_states.shape
        new = torch.zeros if self.attend_align > 1 else torch.empty
        k = new((b, h, cap, d), dtype=key_states.dtype, device=key_states.device)
        v = new((b, h, cap, value_states.shape[-1]), dtype=value_states.dtype, device=value_states.device)
        if held and fits:
            src = keep_from - self._base
            k[:, :, :held].copy_(self._k[:, :, src:src + held])
            v[:, :, :held].copy_(self._v[:, :, src:src + held])
        elif held:  # dtype/device/shape changed: only a reset cache may change them
            raise RuntimeError("SlidingLayer: key/value states changed shape, dtype or device mid-cache")
        self._k, self._v, self._base = k, v, keep_from

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append key/value states [B, H_kv, T, D]; return the keys/values the forward reads
        [B, H_kv, read, D] (the window before the new tokens, the new tokens, an aligned tail)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, rows = self._len, key_states.shape[-2]
        lo, read = self.first_key(start), self._read(start, rows)
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            return self._update_with_grad(key_states, value_states, lo, read)
        if not self._fits(key_states, value_states) or lo + read - self._base > self._k.shape[-2]:
            self._make_room(key_states, value_states, lo + read)
        at = start - self._base
        self._k[:, :, at:at + rows].copy_(key_states)
        self._v[:, :, at:at + rows].copy_(value_states)
        self._len = start + rows
        self._view()
        first = lo - self._base
        return self._k[:, :, first:first + read], self._v[:, :, first:first + read]

    def _update_with_grad(self, key_states, value_states, lo: int, read: int):
        """The autograd path: concatenate (no in-place writes into a buffer)."""
        held = self._len - self._base
        keys = torch.cat([self._k[:, :, :held], key_states], -2) if held else key_states
        values = torch.cat([self._v[:, :, :held], value_states], -2) if held else value_states
        self._len += key_states.shape[-2]
        pad = lo + read - self._len
        if pad > 0:
            keys = torch.cat([keys, keys.new_zeros(*keys.shape[:2], pad, keys.shape[-1])], -2)
            values = torch.cat([values, values.new_zeros(*values.shape[:2], pad, values.shape[-1])], -2)
        self._k, self._v = keys, values
        self._view()
        first = lo - self._base
        return keys[:, :, first:first + read], values[:, :, first:first + read]

    def crop(self, tokens_to_remove: int) -> None:
        """Remove `-tokens_to_remove` positions (negative, as stock); a positive n keeps the first
        n. Raises where the window before the new length was already dropped (`can_crop_to`)."""
        if not self.is_initialized or self._k is None or tokens_to_remove == 0:
            return
        keep = max(self._len + tokens_to_remove, 0) if tokens_to_remove < 0 else min(tokens_to_remove, self._len)
        if not self.can_crop_to(keep):
            raise RuntimeError(f"SlidingLayer: cannot crop to {keep} positions: the window before it "
                               f"(from position {keep - self.sliding_window + 1}) starts before the "
                               f"first held position {self._base}; re-prefill instead")
        self._len = keep
        self._view()

    def reset(self) -> None:
        self._k = self._v = None
        self._base = self._len = 0
        super().reset()

    def _unsupported(self, *args, **kwargs) -> None:
        raise NotImplementedError("SlidingLayer serves one sequence (batch edits and offloading "
                                  "are not supported)")

    offload = prefetch = reorder_cache = batch_repeat_interleave = batch_select_indices = _unsupported
