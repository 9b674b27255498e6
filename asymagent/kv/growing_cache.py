"""A DynamicCache whose full-attention layers append K/V into a preallocated buffer (no torch.cat).

transformers' `DynamicLayer.update` appends each step's keys and values with `torch.cat`, which
copies the whole layer cache: every decoded token copies every layer's K and V once more (at ~5k
cached tokens about a tenth of a SmolLM2-135M decode step on CPU). `GrowingLayer` keeps one
buffer per K and V, `[B, H_kv, capacity, D]`, writes the new positions into it in place, and
hands attention the view `[:, :, :length]`; the buffer is reallocated (one copy) only when it is
full, geometrically (x GROWTH, at least HEADROOM free positions), so the copies per token are
amortised O(1) instead of O(length). `crop` only moves the length back: the positions past it
are overwritten by the next update (a view handed out earlier sees that; nothing here keeps one).

The values, and therefore every logit, are the same as the stock cache's: the same tensors,
read through a strided view instead of a fresh contiguous one (tests/test_growing_cache.py).
Memory is at most x GROWTH (+ HEADROOM) of the stock cache's and is given back on `reset` only.

**Aligned attention reads** (`attend_align`, on the CPU under our GQA sdpa, asymagent/kv/cache.py):
PyTorch's CPU attention gives a query row a result that depends on how many keys it reads when
that count is not a multiple of 64 (measured in bf16 and float32: a row over 700 keys differs
with 1, 2 or 5 query rows in the forward; over 704, 768, 1024 or 2048 keys, masked past the
cached length, every row is bit-identical whatever the query count and key count, in bf16). So
a decode step (1 row) and a speculative verify (K+1 rows) scored the same position differently,
and mode full and mode spec could pick different tokens at a near tie (seen on a parcels step in
bf16). With `attend_align = 64` the layer hands attention the buffer up to the next multiple of
64 past the cached length (at least one position past it; buffers zero-initialised, so the tail is finite; stale rows past a crop are finite too) and
`get_mask_sizes` reports that length, so the causal mask masks the tail; the mask function
(asymagent/kv/attention.py) never skips a mask whose keys reach past the last query. The cached
keys/values (`layer.keys`) keep their exact length.

`GrowingCache(config=...)` is `DynamicCache(config=...)` with every plain `DynamicLayer` replaced
by a `GrowingLayer` and every `DynamicSlidingWindowLayer` by a `SlidingLayer`
(asymagent/kv/sliding_layer.py: the window plus a rollback tail, so rejected drafts and a new
turn's prefix reuse can crop it past the window); chunked, hybrid, indexed and dummy layers stay
stock (`croppable_to` says when a crop would need what they dropped).
Inference only: an update that needs autograd (inputs requiring grad) falls back to a cat.

`python -m asymagent.evals.probes.kv_probes growing-cache` times a full-context greedy decode on the
embedded default, stock vs growing cache, interleaved A/B.
"""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from asymagent.kv.sliding_layer import SlidingLayer

GROWTH = 1.5  # a full buffer is reallocated at this multiple of its capacity...
HEADROOM = 256  # ...and with at least this many free positions (the first allocation too)
ALIGN = 64  # capacities are rounded up to a multiple of this many positions
ATTEND_ALIGN = 64  # attention reads a multiple of this many positions (`attend_align`)


def _capacity(needed: int, old: int) -> int:
    cap = max(needed + HEADROOM, int(old * GROWTH))
    return -(-cap // ALIGN) * ALIGN


class GrowingLayer(DynamicLayer):
    """A full-attention layer cache over a preallocated buffer; `keys`/`values` are length views."""

    def __init__(self, attend_align: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self._k = self._v = None  # buffers [B, H_kv, capacity, D]
        self._len = 0  # cached positions: keys == self._k[:, :, :self._len]
        # attention reads the buffer up to a multiple of this (1: exactly the cached length)
        self.attend_align = attend_align

    def attended(self, length: int) -> int:
        """How many positions attention reads when `length` are cached."""
        a = self.attend_align
        # past the length by at least one position: the mask is then never skipped (a skipped
        # mask sends a one-row decode down another attention path), see the module doc
        return length if a <= 1 else -(-(length + 1) // a) * a

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, offset) of the mask: the attended length (see the module doc)."""
        return self.attended(self.get_seq_length() + query_length), 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)  # device; keys/values = empty
        self._k = self._v = None
        self._len = 0

    def _view(self) -> None:
        self.keys = self._k[:, :, : self._len]  # [B, H_kv, length, D]
        self.values = self._v[:, :, : self._len]

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        """Reallocate both buffers to fit `needed` positions (GROWTH, HEADROOM); keep the cache."""
        old = 0 if self._k is None else self._k.shape[-2]
        cap = _capacity(needed, old)
        b, h, _, d = key_states.shape
        # zeros: an aligned read (attend_align) may reach positions never written; masked, finite
        new = torch.zeros if self.attend_align > 1 else torch.empty
        k = new((b, h, cap, d), dtype=key_states.dtype, device=key_states.device)
        v = new((b, h, cap, value_states.shape[-1]), dtype=value_states.dtype,
                device=value_states.device)
        if self._len:
            k[:, :, : self._len].copy_(self._k[:, :, : self._len])
            v[:, :, : self._len].copy_(self._v[:, :, : self._len])
        self._k, self._v = k, v

    def _fits(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> bool:
        k = self._k
        return (k is not None and needed <= k.shape[-2]
                and k.shape[:2] == key_states.shape[:2] and k.shape[-1] == key_states.shape[-1]
                and self._v.shape[-1] == value_states.shape[-1]
                and k.dtype == key_states.dtype and k.device == key_states.device
                # a buffer made under inference_mode cannot be written outside it
                and (torch.is_inference_mode_enabled() or not k.is_inference()))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append key/value states [B, H_kv, T, D]; return the cached ones [B, H_kv, length, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            keys = torch.cat([self.keys, key_states], dim=-2) if self._len else key_states
            values = torch.cat([self.values, value_states], dim=-2) if self._len else value_states
            self._adopt(keys, values)
            return self.keys, self.values
        start = self._len
        end = start + key_states.shape[-2]
        read = self.attended(end)  # <= capacity: capacities are multiples of ALIGN
        if not self._fits(key_states, value_states, read):
            self._grow(key_states, value_states, read)
        self._k[:, :, start:end].copy_(key_states)
        self._v[:, :, start:end].copy_(value_states)
        self._len = end
        self._view()
        if read == end:
            return self.keys, self.values
        return self._k[:, :, :read], self._v[:, :, :read]  # [B, H_kv, read, D], tail masked

    def room_for(self, rows: int, dtype: torch.dtype, kv_heads: int, head_dim: int) -> int | None:
        """For a caller that writes `rows` new positions into `buffers()` itself (as `update` would,
        asymagent/kv/lean_forward.py): the length attention then reads, if the buffers exist and
        hold it (dtype, heads, head size; writable here); None where `update` must run (it grows
        or initialises them). Call `advance(rows)` after writing."""
        k = self._k
        if k is None or k.dtype != dtype or k.shape[0] != 1 or k.shape[1] != kv_heads or k.shape[-1] != head_dim:
            return None
        read = self.attended(self._len + rows)
        if read > k.shape[-2] or (k.is_inference() and not torch.is_inference_mode_enabled()):
            return None
        return read

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers [1, H_kv, capacity, D]; positions [0, length) are cached."""
        return self._k, self._v

    def advance(self, rows: int) -> None:
        """The `rows` positions after the cached ones, written into `buffers()`, are now cached."""
        self._len += rows
        self._view()

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make `keys`/`values` [B, H_kv, L, D] the (full) buffers, e.g. after a batch reorder."""
        self._k, self._v, self._len = keys, values, keys.shape[-2]
        read = self.attended(self._len)
        if read > self._len:  # an aligned read needs room past the length: copy into zeros
            self._k = torch.cat([keys, keys.new_zeros(*keys.shape[:2], read - self._len, keys.shape[-1])], -2)
            self._v = torch.cat([values, values.new_zeros(*values.shape[:2], read - self._len,
                                                          values.shape[-1])], -2)
        self._view()

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Remove `-tokens_to_remove` positions (negative, as stock); positive n keeps the first n.

        Stock `DynamicLayer.crop` raises on a positive n; here it means the absolute length to keep
        (the transformers 4.x `max_length` meaning), a no-op when the cache is not longer.
        """
        if not self.is_initialized or self._k is None or tokens_to_remove == 0:
            return
        if tokens_to_remove < 0:
            keep = max(self._len + tokens_to_remove, 0)
        else:
            keep = min(tokens_to_remove, self._len)
        self._len = keep
        self._view()

    def reset(self) -> None:
        self._k = self._v = None
        self._len = 0
        super().reset()

    # Rarely used paths (offloading, beams, batch edits): do them on the views, adopt the result.
    def offload(self) -> None:
        if self._k is not None:
            self._k = self._k.to("cpu", non_blocking=True)
            self._v = self._v.to("cpu", non_blocking=True)
            self._view()

    def prefetch(self) -> None:
        if self._k is not None and self._k.device != self.device:
            self._k = self._k.to(self.device, non_blocking=True)
            self._v = self._v.to(self.device, non_blocking=True)
            self._view()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self._len:
            idx = beam_idx.to(self.keys.device)
            self._adopt(self.keys.index_select(0, idx), self.values.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._len:
            self._adopt(self.keys.repeat_interleave(repeats, dim=0),
                        self.values.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._len:
            self._adopt(self.keys[indices, ...], self.values[indices, ...])


class GrowingCache(DynamicCache):
    """`DynamicCache(config=...)` with GrowingLayer for every plain full-attention layer."""

    def __init__(self, config=None, attend_align: int = 1) -> None:
        super().__init__(config=config)
        if self.layer_class_to_replicate is DynamicLayer:  # no config: layers made on first use
            self.layer_class_to_replicate = functools.partial(GrowingLayer, attend_align=attend_align)
        self.layers = [_growing(layer, attend_align) for layer in self.layers]


def _growing(layer, attend_align: int):
    """The growing counterpart of a stock layer (full: GrowingLayer, sliding: SlidingLayer)."""
    if type(layer) is DynamicLayer:
        return GrowingLayer(attend_align=attend_align)
    if type(layer) is DynamicSlidingWindowLayer:
        return SlidingLayer(layer.sliding_window, attend_align=attend_align)
    return layer


def croppable_to(cache, keep: int) -> bool:
    """Whether every layer of `cache` can be cropped to `keep` positions and still serve the next
    forward: a SlidingLayer that dropped the window before `keep`, or a stock sliding/chunked
    layer past its window (it keeps no past), cannot."""
    for layer in getattr(cache, "layers", ()):
        check = getattr(layer, "can_crop_to", None)
        if check is not None:
            if not check(keep):
                return False
        elif getattr(layer, "is_sliding", False) and keep < layer.get_seq_length():
            window = getattr(layer, "sliding_window", None)
            if window is None or layer.get_seq_length() >= window:
                return False
    return True


def crop_floor(cache) -> int:
    """The smallest `keep` every layer of `cache` can still be cropped to (`croppable_to`; a crop
    below it drops the cache): 0 with full attention, past a SlidingLayer's dropped window."""
    floor = 0
    for layer in getattr(cache, "layers", ()):
        if isinstance(layer, SlidingLayer):
            floor = max(floor, layer.crop_floor())
        elif getattr(layer, "is_sliding", False):
            window = getattr(layer, "sliding_window", None)
            if window is None or layer.get_seq_length() >= window:
                floor = max(floor, layer.get_seq_length())
    return floor


def for_model(model: torch.nn.Module) -> GrowingCache:
    """The growing cache the engine gives `model` (asymagent/kv/cache.py ModelCache): aligned
    reads (`ATTEND_ALIGN`) in bf16/fp16 on the CPU under our GQA sdpa, exact reads otherwise."""
    from asymagent.kv.attention import ATTN_NAME

    p = next(model.parameters())
    aligned = (p.device.type == "cpu" and p.dtype in (torch.bfloat16, torch.float16)
               and getattr(model.config, "_attn_implementation", None) == ATTN_NAME)
    return GrowingCache(config=model.config, attend_align=ATTEND_ALIGN if aligned else 1)

