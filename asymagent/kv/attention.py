"""GQA-aware SDPA for multi-token decode: verify K+1 positions without copying the KV cache.

transformers' `sdpa` attention expands grouped key/value heads with `repeat_kv` whenever a
forward feeds more than one query token under a mask (the verify forward of every speculative
round, and chunked prefill on top of a cache): a full copy of every layer's keys and values, x
the group size (3 for SmolLM2), each round. `torch.nn.functional.scaled_dot_product_attention`
takes `enable_gqa=True` instead and reads the grouped heads in place; the result is the same
computation (bit-identical to the repeat_kv path on CPU in our checks) at about half the time
for a 3-token query over 2k cached positions.

Decode and verify forwards (at most GROUP_ROWS tokens) in bf16 on the CPU go one step further:
the query heads that share a key/value head become rows of that head (`_grouped_rows`, a view:
[1, Hkv*G, q, D] -> [1, Hkv, G*q, D]), so the kernel reads each key/value head once, in Hkv work
items instead of Hq. Same bits as the per-head call (checked for 1..32 tokens, 1 and 2 threads,
on an Intel CPU with AMX), and no duplicated row for a one-token decode (G rows are already the
multi-row path). Measured there (2 threads, 5k cached keys, one layer): 0.68 -> 0.30 ms for one
token, 0.79 -> 0.43 ms for five. Whether the two give the same bits is the CPU kernel's
property (an AMD EPYC with AVX512-BF16 and no AMX gave other bits until both paths padded their
rows to the kernel's row floor, `attention_floor`), so `grouped_rows_exact()` checks it once per
thread count on the machine itself and the grouped path is taken only where it holds.
`decode_attention` makes this choice once per forward for the callers that run the call
themselves (the lean forward's direct road, the batched forward): grouped or per head, the rows
padded to the floor either way, so a floor above a forward's rows never sends it elsewhere.

Masks are handed to SDPA in the additive form it would make of them (0 / -inf), built once per
forward and shared by every layer (`_memo`): the grouped rows' repeated mask, and the per-head
path's, which a prefill uses (SDPA converting a 490 x 5k bool mask in each of 30 layers cost ~5%
of such a prefill at 2 threads).

On the CPU, a prefill on an empty cache (a conversation's first prompt, a long prompt's first
chunk: the mask exactly causal from position 0, an aligned read's masked tail included) is handed
to SDPA as `is_causal` instead of its mask: the flash kernel then skips the key blocks above the
diagonal, which under a mask it computes and discards. Top-left causal is the mask when the rows start at
position 0, and the output bits are the same (tests/test_attention.py, bf16 and float32, 64-1000
rows); a 1024-token prefill of the embedded verifier is 1.15x faster (bf16, 2 threads).

`use_gqa_attention(model)` switches a model that uses `sdpa` to this function ("asymagent_sdpa"
in transformers' AttentionInterface); anything else (eager, flash, a model without grouped
heads, single-token decode, position bias) goes through transformers' own sdpa unchanged.
`python -m asymagent.evals.probes.kv_probes attention` times one verify forward, sdpa vs this.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass

import torch

from asymagent.modeling.probe_cache import cached_probe
from asymagent.modeling.row_floor import floors_off, pad_rows, smallest_floor

ATTN_NAME = "asymagent_sdpa"
# decode and verify forwards of at most this many tokens (bf16 on the CPU) run with each
# group's query heads as rows of one head (`_grouped_rows`): measured bit-identical to the
# per-head path for 1..32 tokens over aligned key counts at 1 and 2 threads, 2.2x faster for one
# token over 5k keys (0.68 -> 0.30 ms a layer), 1.8x for 5 tokens (2 threads)
GROUP_ROWS = 32
_registered = False
# a prefill of at least this many rows on an empty cache runs as `is_causal` (the flash kernel
# skips the blocks above the diagonal): bf16, 2 threads, 9 heads over 3: 1000 rows 3.99 -> 2.62 ms
# a layer, 490 rows 1.04 -> 0.85 ms, 100 rows no gain; the same bits at every size measured
CAUSAL_ROWS = 64


ATTENTION_CANDIDATES = (2, 4, 8)  # row floors the probe tries, smallest first


@torch.compiler.assume_constant_result  # under torch.compile: called once while tracing, a constant
def attention_floor(dtype: torch.dtype, threads: int | None = None) -> int:
    """Query rows a masked attention call on the CPU needs so that each row gets the bits it gets
    in any few-row call (asymagent/modeling/row_floor.py): the smallest of ATTENTION_CANDIDATES
    for which rows padded to it agree, probed once per (dtype, threads) on random data of the
    embedded verifier's head shapes over aligned key counts with a causal mask.
    `ASYMAGENT_ROW_FLOORS=0`: 2, the one duplicated row used before floors were probed."""
    if floors_off():
        return 2
    return _attention_floor(dtype, torch.get_num_threads() if threads is None else threads)


def _causal_draw(g: torch.Generator, keys: int, rows: int, dtype: torch.dtype) -> tuple:
    """Random attention inputs of the embedded verifier's head shapes (9 query heads over 3
    key/value heads of 64) for `rows` new positions at the end of `keys` (an aligned key count,
    asymagent/kv/growing_cache.py): q [1, 9, rows, 64], k, v [1, 3, keys, 64], causal mask."""
    k = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
    v = torch.randn(1, 3, keys, 64, generator=g).to(dtype)
    q = torch.randn(1, 9, rows, 64, generator=g).to(dtype)
    past = keys - 64
    mask = (torch.arange(keys)[None, :] <= (torch.arange(rows) + past)[:, None])[None, None]
    return q, k, v, mask  # mask [1, 1, rows, keys]


@functools.cache
def _attention_floor(dtype: torch.dtype, threads: int) -> int:
    """Probed once per machine, torch and key (asymagent/modeling/probe_cache.py keeps the answer)."""
    return cached_probe("attention_floor", (dtype, threads), lambda: _probe_attention_floor(dtype))


def _probe_attention_floor(dtype: torch.dtype) -> int:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    g = torch.Generator().manual_seed(0)
    draws = [_causal_draw(g, keys, 32, dtype) for keys in (704, 2560)]

    def call(draw, floor, rows, lo):  # rows lo.. of q padded to the floor -> [1, Hq, rows, D]
        q, k, v, mask = draw
        out = sdpa(pad_rows(q[:, :, lo:lo + rows], floor, 2), k, v,
                   attn_mask=pad_rows(mask[:, :, lo:lo + rows], floor, 2), scale=0.125, enable_gqa=True)
        return out[:, :, :rows]

    floor = smallest_floor(ATTENTION_CANDIDATES, draws, call, dim=2)
    return ATTENTION_CANDIDATES[-1] if floor is None else floor


def gqa_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                     scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """Attention of transformers' sdpa signature; query [B, Hq, q, D], key/value [B, Hkv, S, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_len = query.shape[2]
    capture = getattr(_CAPTURE, "active", None)
    if capture is not None:  # reads the inputs only: the output bits are the same
        capture.add(query, key, attention_mask, scaling, getattr(module, "layer_idx", None))
    one_row = q_len == 1 and _same_rows_as_batched(query, attention_mask)
    if (groups <= 1 or (q_len == 1 and not one_row) or attention_mask is None
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if dropout == 0.0 and _groups_rows(q_len, query.shape[1], key.shape[1], groups, attention_mask,
                                       query.dtype, query.device, query.shape[0]):
        return _grouped_rows(query, key, value, attention_mask, scaling, groups)
    if (q_len >= CAUSAL_ROWS and query.device.type == "cpu" and not getattr(_MASKS, "masked_fresh", False)
            and _fresh_causal(attention_mask, q_len)):  # a prefill on an empty cache: the kernel
        # skips the blocks above the diagonal; the same bits as the masked call (top-left
        # causal = the mask when the rows start at position 0; tests/test_attention.py). CPU
        # only: measured there; CUDA's kernels may align a non-square causal mask otherwise
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, dropout_p=dropout, is_causal=True, scale=scaling,
            enable_gqa=True)  # [B, Hq, q, D]
        return out.transpose(1, 2).contiguous(), None  # [B, q, Hq, D]
    floor = attention_floor(query.dtype) if _same_rows_as_batched(query, attention_mask) else 1
    if q_len < floor:  # the rows repeated up to the kernel's row floor (row_floor.py): the code
        # path a verify forward takes, so a position scores as it does there
        query = pad_rows(query, floor, 2)  # [B, Hq, floor, D]
    attention_mask = _flat_mask(attention_mask, max(q_len, floor), query.dtype)  # [B, 1, rows, L]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)  # [B, Hq, max(q, floor), D]
    if q_len < floor:
        out = out[:, :, :q_len]  # [B, Hq, q, D]
    return out.transpose(1, 2).contiguous(), None  # [B, q, Hq, D]


_CAPTURE = threading.local()  # `active`: the AttentionCapture this thread's attention calls feed


class AttentionCapture:
    """Where the last `rows` query rows of each forward look: per key position, the attention
    probability each row gives it, max over heads (a position one head reads hard counts,
    whichever head: Speculative Prefill's pooling), summed over layers; `scores` pools the rows
    (mean, or max: a position one row reads hard, the token that decides, counts).

    Fed by `gqa_sdpa_forward` inside `capture_attention` (the direct road, which skips it, is
    not taken there), over one or more forwards (a prefill's last rows, then one-token decodes):
    row r of the capture is the r-th row seen. Recomputes softmax(q k^T) for those rows in
    float32 beside the kernel's call; the forward's own bits are untouched."""

    def __init__(self, rows: int, per_layer: bool = False) -> None:
        self.rows = rows
        self.forwards: list = []  # per forward: [r, L] summed over its layers
        self.layers = 0  # layers per forward (the model's depth)
        # per forward, per layer: [r, L] (kept only when asked: `scores(..., layers=...)` reads it)
        self.by_layer: list | None = [] if per_layer else None

    def add(self, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
            scaling: float | None, layer: int | None) -> None:
        """One attention call of layer `layer` (0 starts a forward; None: a model without
        layer indices, every call its own forward)."""
        r = min(self.rows, query.shape[2])
        hkv, d = key.shape[1], query.shape[-1]
        groups = query.shape[1] // hkv
        q = query[0, :, -r:].float().reshape(hkv, groups * r, d)  # [Hkv, G*r, D]: a group's heads as rows
        k = key[0].float()  # [Hkv, L, D], read once per key/value head (no repeat per query head)
        scale = scaling if scaling is not None else d ** -0.5
        s = torch.matmul(q, k.transpose(1, 2)).mul_(scale).view(hkv, groups, r, -1)  # [Hkv, G, r, L]
        if attention_mask is not None:
            m = attention_mask[0, 0, -r:, : s.shape[-1]]  # [r, L]
            s = s.masked_fill_(~m, float("-inf")) if m.dtype == torch.bool else s.add_(m.float())
        pooled = torch.softmax(s, dim=-1).amax(dim=(0, 1))  # [r, L]
        starts = not layer or not self.forwards
        if starts:
            self.forwards.append(pooled)
        else:
            self.forwards[-1] = _fit(self.forwards[-1], pooled.shape[-1]) + pooled
        if self.by_layer is not None:
            if starts:
                self.by_layer.append([])
            self.by_layer[-1].append(pooled)
        self.layers = max(self.layers, (layer or 0) + 1)

    def scores(self, length: int, pool: str = "mean", layers: range | None = None,
               forwards: slice = slice(None)) -> list:
        """[length] attention per key position (mean over layers, or over `layers` only: a
        per-layer capture; rows pooled by `pool`; the rows of the `forwards` picked: e.g.
        slice(0, 1) a prompt's rows, slice(1, None) the look-ahead's decode rows after it), zeros
        where nothing was captured."""
        if not self.forwards[forwards] or not self.layers:
            return [0.0] * length
        if layers is None:
            rows = torch.cat([_fit(f, length) for f in self.forwards[forwards]]) / self.layers  # [R, length]
        else:
            if self.by_layer is None:
                raise ValueError("scores(layers=...) needs a capture made with per_layer=True")
            picked = [sum(_fit(f[i], length) for i in layers if i < len(f)) for f in self.by_layer[forwards]]
            rows = torch.cat(picked) / len(layers)  # [R, length]
        pooled = rows.amax(0) if pool == "max" else rows.mean(0)
        return pooled.tolist()


def _fit(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [..., L] cut or zero-padded to [..., n] (an aligned read's key count is rounded up; a
    later forward has more keys)."""
    if x.shape[-1] >= n:
        return x[..., :n]
    return torch.cat([x, x.new_zeros(*x.shape[:-1], n - x.shape[-1])], dim=-1)


@contextlib.contextmanager
def capture_attention(rows: int, per_layer: bool = False):
    """Inside the block (this thread) every attention call through `gqa_sdpa_forward` adds its
    last `rows` query rows' attention to the AttentionCapture it yields (kept per layer too
    with `per_layer`)."""
    saved = getattr(_CAPTURE, "active", None)
    _CAPTURE.active = capture = AttentionCapture(rows, per_layer)
    try:
        yield capture
    finally:
        _CAPTURE.active = saved


def _groups_rows(rows: int, heads: int, kv_heads: int, groups: int, attention_mask: torch.Tensor | None,
                 dtype: torch.dtype, device: torch.device, batch: int) -> bool:
    """Whether `gqa_sdpa_forward` runs a (dropout-free) forward of `rows` query rows over `heads`
    query and `kv_heads` key/value heads in `groups` as grouped rows (`_grouped_rows`): bf16 on
    the CPU, batch 1, a mask shared by the heads, at most GROUP_ROWS rows, where this CPU's
    kernel gives the per-head call's bits. The one rule for both callers."""
    return (groups > 1 and attention_mask is not None and rows <= GROUP_ROWS and batch == 1
            and dtype == torch.bfloat16 and device.type == "cpu" and attention_mask.shape[1] == 1
            and heads == kv_heads * groups and grouped_rows_exact())


def group_rows(rows: int, groups: int, floor: int) -> int:
    """Query rows per head `_grouped_rows` gives the kernel: `rows`, or, where the grouped call
    (`groups` x `rows` rows) is under the kernel's row floor, ceil(floor / groups) (the rows
    repeated, row_floor.py's `pad_rows`)."""
    return rows if groups * rows >= floor else -(-floor // groups)


@dataclass(frozen=True)
class DecodeAttention:
    """The attention call `gqa_sdpa_forward` makes for a decode / verify forward, decided once per
    forward (`decode_attention`) for a caller that runs it itself (asymagent/kv/lean_forward.py's
    direct road, asymagent/kv/batched_forward.py): grouped rows or per head, with the query rows
    repeated up to `rows` (the kernel's row floor) and sliced back, so a row gets exactly the bits
    the general path gives it, whatever this CPU's floor."""

    mask: torch.Tensor  # additive: [1, 1, G*R, L] grouped, [1, 1, R, L] per head
    rows: int  # R: query rows per head handed to the kernel (>= the forward's rows)
    grouped: bool  # `_grouped_rows`' call; else the per-head call (enable_gqa)

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 scaling: float | None) -> torch.Tensor:
        """query [1, Hq, T, D] over key/value [1, Hkv, L, D] -> [1, T, Hq, D] (contiguous)."""
        b, hq, q_len, d = query.shape
        query = pad_rows(query, self.rows, 2)  # [1, Hq, R, D]
        if self.grouped:  # head h*G+g, row t -> head h, row g*R+t (as `_grouped_rows`)
            grouped = query.reshape(b, key.shape[1], (hq // key.shape[1]) * self.rows, d)
            out = torch.nn.functional.scaled_dot_product_attention(
                grouped, key, value, attn_mask=self.mask, scale=scaling).view(b, hq, self.rows, d)
        else:  # the per-head branch of `gqa_sdpa_forward`
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=self.mask, dropout_p=0.0, scale=scaling,
                enable_gqa=True)  # [1, Hq, R, D]
        return out[:, :, :q_len].transpose(1, 2).contiguous()  # [1, T, Hq, D]


def decode_attention(rows: int, heads: int, kv_heads: int, attention_mask: torch.Tensor | None,
                     dtype: torch.dtype, device: torch.device) -> DecodeAttention | None:
    """How `gqa_sdpa_forward` runs (dropout-free) attention of `rows` query rows over `heads` query
    and `kv_heads` key/value heads under `attention_mask` [1, 1, rows, L] in a bf16 CPU decode or
    verify forward (at most GROUP_ROWS rows, grouped heads): the grouped rows where this CPU's
    kernel gives them the per-head bits (`grouped_rows_exact`), else the per-head call; in both,
    rows under the kernel's row floor are padded up to it (never a reason to go elsewhere). None
    for a forward it would hand to another branch (no groups, float32, another device or mask)."""
    groups = heads // kv_heads if kv_heads else 0
    if (groups <= 1 or heads != kv_heads * groups or attention_mask is None or rows > GROUP_ROWS
            or dtype != torch.bfloat16 or device.type != "cpu" or attention_mask.dim() != 4
            or attention_mask.shape[0] != 1 or attention_mask.shape[1] != 1
            or attention_mask.shape[2] != rows):
        return None
    floor = attention_floor(dtype)
    if _groups_rows(rows, heads, kv_heads, groups, attention_mask, dtype, device, 1):
        padded = group_rows(rows, groups, floor)
        return DecodeAttention(_group_mask(attention_mask, groups, padded, dtype), padded, True)
    # GROUP_ROWS < CAUSAL_ROWS: a forward of this size is never a fresh causal prefill; a bf16
    # CPU forward under a mask pads to the floor (`_same_rows_as_batched`)
    padded = max(rows, floor)
    return DecodeAttention(_flat_mask(attention_mask, padded, dtype), padded, False)


_MASKS = threading.local()  # the additive mask of the forward in progress, per thread


def _group_mask(attention_mask: torch.Tensor, groups: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """attention_mask [B, 1, q, L] -> [B, 1, G*rows, L]: its rows padded to `rows`, repeated per
    group member, as an additive mask in `dtype` (0 / -inf: what SDPA makes of a bool mask, the
    same bits, measured). Every layer of a forward passes the same mask object, so it is built
    once per forward (the memo holds the source, whose identity it checks), not once a layer."""
    def build() -> torch.Tensor:
        b, keys = attention_mask.shape[0], attention_mask.shape[-1]
        mask = pad_rows(attention_mask, rows, 2)[:, :, None].expand(b, 1, groups, rows, keys)
        return _additive(mask.reshape(b, 1, groups * rows, keys), dtype)  # [B, 1, G*rows, L]

    return _memo(attention_mask, ("grouped", groups, rows, dtype), build)


def _memo(attention_mask: torch.Tensor, key: tuple, build):
    """`build()` once per forward: every layer of a forward passes the same mask object, so the
    memo (one per thread) holds the source, whose identity it checks, and what was built from it
    by key (the additive mask, whether it is a fresh causal mask)."""
    if getattr(_MASKS, "per_layer", False):
        return build()
    memo = getattr(_MASKS, "last", None)
    if memo is None or memo[0] is not attention_mask:
        memo = _MASKS.last = (attention_mask, {})
    built = memo[1]
    if key not in built:
        built[key] = build()
    return built[key]


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as SDPA makes it additive (0 / -inf in the query's dtype; the same bits,
    tests/test_attention.py); a float mask unchanged."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _fresh_causal(attention_mask: torch.Tensor, q_len: int) -> bool:
    """Whether `attention_mask` [1, 1, q, L] is exactly causal from position 0 (row i sees keys
    0..i, nothing after; L >= q: an aligned read's masked tail included): a prefill on an empty
    cache. Checked once per forward (the memo)."""
    def build() -> bool:
        m = attention_mask
        if (m.dtype != torch.bool or m.dim() != 4 or m.shape[0] != 1 or m.shape[1] != 1
                or m.shape[2] != q_len or m.shape[3] < q_len):
            return False
        if bool(m[0, 0, 0, 1]):  # the first row sees a second key: rows after cached positions
            return False  # (every agent step after the first), told without the q x L triangle
        causal = torch.ones(q_len, m.shape[3], dtype=torch.bool, device=m.device).tril()  # [q, L]
        return bool(torch.equal(m[0, 0], causal))

    return _memo(attention_mask, ("fresh_causal", q_len), build)


def _flat_mask(attention_mask: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """The per-head path's mask [B, 1, q, L] -> [B, 1, rows, L]: its rows padded to `rows`, additive
    in `dtype`, once per forward. SDPA converts a bool mask in every call (one `where` over q x L
    a layer; built once, a 490-token prefill over 4.5k cached tokens is ~5% faster at 2 threads,
    docs/results.md); the kernel then reads the same additive mask, so every output bit is the
    same."""
    if getattr(_MASKS, "bool_flat", False):  # sdpa_converts_masks(): as before, SDPA converts it
        return pad_rows(attention_mask, rows, 2)
    return _memo(attention_mask, ("flat", rows, dtype),
                 lambda: _additive(pad_rows(attention_mask, rows, 2), dtype))


@contextlib.contextmanager
def _switched(flag: str):
    """`flag` of this thread's mask state set inside the block (the probes' "before" settings)."""
    saved = getattr(_MASKS, flag, False)
    setattr(_MASKS, flag, True)
    try:
        yield
    finally:
        setattr(_MASKS, flag, saved)


def sdpa_converts_masks():
    """Inside the block (this thread) the per-head path hands SDPA the bool mask, which SDPA
    converts in every layer, as before the additive form (the A/B that timed it: docs/log.md)."""
    return _switched("bool_flat")


def masked_fresh_prefill():
    """Inside the block (this thread) a prefill on an empty cache runs under its mask, as before
    `is_causal` took it (what the tests compare it with; the A/B that timed it: docs/log.md)."""
    return _switched("masked_fresh")


def per_layer_masks():
    """Inside the block (this thread) the grouped mask is built in every layer, as before the
    once-per-forward memo (the A/B that timed it: docs/log.md)."""
    return _switched("per_layer")


def _grouped_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor, scaling: float | None, groups: int) -> tuple:
    """Decode / verify attention with the query heads of a group as rows of one head: query
    [1, Hkv*G, q, D] -> [1, Hkv, G*q, D] over key/value [1, Hkv, L, D], the mask repeated per
    group member. The kernel then reads each key/value head once (Hkv work items instead of Hq).
    Fewer than the kernel's row floor (row_floor.py) in all: the rows are repeated up to it, as
    on the per-head path."""
    b, hq, q_len, d = query.shape
    rows = group_rows(q_len, groups, attention_floor(query.dtype))
    query = pad_rows(query, rows, 2)  # [B, Hq, rows, D] (unchanged when q_len >= rows)
    grouped = query.reshape(b, hq // groups, groups * rows, d)  # head h*G+g, row t -> head h, row g*rows+t
    mask = _group_mask(attention_mask, groups, rows, query.dtype)  # [1, 1, G*rows, L]
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask,
                                                           scale=scaling)  # [1, Hkv, G*rows, D]
    return out.view(b, hq, rows, d)[:, :, :q_len].transpose(1, 2).contiguous(), None  # [B, q, Hq, D]


@torch.compiler.assume_constant_result  # under torch.compile: called once while tracing, a constant
def grouped_rows_exact(threads: int | None = None) -> bool:
    """Whether `_grouped_rows` gives the per-head call's bits on this CPU at this thread count;
    probed once per thread count (27 small attention calls, a few ms).

    Both sides are padded to the row floor (`attention_floor`). Measured: equal on an Intel CPU
    with AMX and, with the floors, on an AMD EPYC without AMX (without them it differed there: 2
    query rows over 704 keys). Where they differ, the per-head call is kept."""
    return _grouped_rows_exact(torch.get_num_threads() if threads is None else threads)


@functools.cache
def _grouped_rows_exact(threads: int) -> bool:
    """Probed once per machine, torch and thread count (asymagent/modeling/probe_cache.py)."""
    return cached_probe("grouped_rows_exact", (threads,), lambda: _probe_grouped_rows_exact(threads))


def _probe_grouped_rows_exact(threads: int) -> bool:
    g = torch.Generator().manual_seed(0)
    floor = attention_floor(torch.bfloat16, threads)  # the per-head path's row floor
    for keys in (128, 704, 2048):
        for rows in (1, 2, 3, 5, 8, 16, 17, 31, 32):
            query, key, value, mask = _causal_draw(g, keys, rows, torch.bfloat16)
            got, _ = _grouped_rows(query, key, value, mask, 0.125, 3)
            want = torch.nn.functional.scaled_dot_product_attention(
                pad_rows(query, floor, 2), key, value, attn_mask=pad_rows(mask, floor, 2),
                scale=0.125, enable_gqa=True)[:, :, :rows]
            if not torch.equal(got, want.transpose(1, 2).contiguous()):
                return False
    return True


def _same_rows_as_batched(query: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether a forward of few rows (a decode) runs with its rows repeated up to the kernel's row
    floor (asymagent/modeling/row_floor.py), so that a position scores exactly as it does inside a
    multi-row (verify) forward: on the CPU in bf16/fp16 under a mask (an aligned read,
    asymagent/kv/growing_cache.py, or StaticKV). PyTorch's CPU attention takes different code
    paths by the number of query rows, and in bf16 the rows' results differ across them
    (measured: on AMX one row vs 2..40 rows; on an AMD EPYC without AMX 1, 2-3 and 4+ rows)."""
    return (attention_mask is not None and query.device.type == "cpu"
            and query.dtype in (torch.bfloat16, torch.float16) and query.shape[0] == 1)


def aligned_sdpa_mask(*args, **kwargs):
    """transformers' sdpa mask, except that it is never skipped when the keys reach past the last
    query position (an aligned read of asymagent/kv/growing_cache.py: the tail must be masked;
    skipping would let a single-token decode attend to it). Otherwise exactly `sdpa_mask`."""
    from transformers.masking_utils import sdpa_mask

    bound = _signature(sdpa_mask).bind(*args, **kwargs)
    given = bound.arguments
    if given.get("kv_offset", 0) + given["kv_length"] > given.get("q_offset", 0) + given["q_length"]:
        given["allow_is_causal_skip"] = False
    return sdpa_mask(*bound.args, **bound.kwargs)


@functools.cache
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)  # once: the mask is built on every forward


def register() -> None:
    """Add ATTN_NAME to transformers' AttentionInterface (idempotent)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTN_NAME, gqa_sdpa_forward)
        # masks as for sdpa: without this entry transformers builds NO mask for an unknown
        # implementation, and a multi-token forward on a cache would attend wrongly
        AttentionMaskInterface.register(ATTN_NAME, aligned_sdpa_mask)
        _registered = True


def use_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch `model` from sdpa to the GQA-aware sdpa; True if it switched (or already had)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == ATTN_NAME:
        return True
    if impl != "sdpa":
        return False
    register()
    try:
        model.set_attn_implementation(ATTN_NAME)
    except (AttributeError, ValueError, TypeError):
        return False
    return getattr(model.config, "_attn_implementation", None) == ATTN_NAME
