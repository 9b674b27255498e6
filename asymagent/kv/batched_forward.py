"""One decoder forward over the rows of several sequences, each row's bits those of its own forward.

Continuous batching (issue 42): requests decoding at once feed one model forward each per step
(a one-token decode, a K+1-row verify, a drafter step). On the CPU such a forward is dominated by
reading the weights (~20 of ~28 ms for a decode of the embedded verifier, asymagent/kv/lean_forward.py),
and a linear layer reads them once for any number of rows. `forward_many` runs the forwards of
several sequences of one model as ONE pass: every linear layer (q|k|v, o, gate|up, down, the head)
on all their rows together, attention per sequence over its own cache (ragged: no row padding to
the longest sequence, no shared cache tensor).

Batch invariance (DESIGN.md §4): a row must get the bits it gets in its own forward, or a
request's tokens would depend on what else is served. On the CPU fast path that holds by the
properties the engine already stands on for "one position, one score" (a position scores alike
in a 1-row decode and a K+1-row verify):
- the packed linear kernel gives a row the same bits in any call of 1..`MAX_ROWS` rows (padded to
  this CPU's row floor, asymagent/modeling/row_floor.py), so the rows of several sequences are
  one call of at most MAX_ROWS rows (32): `forward_many` refuses more (the scheduler splits);
- attention runs per sequence exactly as its own forward runs it (`attention.decode_attention`:
  the grouped rows, or per head where this CPU's grouped rows differ, its rows padded to the
  attention floor as its own forward pads them, the same additive mask over the same aligned read
  of the same cache buffers), so a one-token decode joins a batch on a CPU whose attention floor
  is above its rows too (issue 53: an AMD EPYC's 4);
- everything else is per row or per element (embedding, RMSNorm over a row, rotary products,
  SiLU, residual adds).
`tests/test_batched_forward.py` checks it bit for bit against each sequence's own forward.

Scope: what `batchable` accepts, i.e. forwards the lean forward's direct road would run alone:
a LeanForward with fused packed kernels (bf16 on the CPU; an o / down projection that
`pack_linears` left on F.linear, a `FloorLinear`, runs its own forward over all rows: F.linear
padded to its row floor, whose rows the floor probe checks agree in any call of 1..32 rows, as the
packed kernel's), our grouped GQA attention, biases only
where the model's family has them (Llama none; Qwen2, the reference pair, q|k|v biases added
inside the fused kernel, per column, as the lean forward adds them),
each layer cache a GrowingLayer with room for the rows and aligned reads, at most MAX_ROWS rows in
all. Anything else (float32, CUDA, a prefill chunk, a cache that must grow) runs as its own forward
(`run_one`), as before: correct, not batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asymagent.kv.attention import DecodeAttention, decode_attention, gqa_sdpa_forward
from asymagent.kv.feature_capture import capture_of
from asymagent.kv.growing_cache import GrowingLayer
from asymagent.kv.lean_forward import FAMILIES, LeanForward, lean_of, rms_norm, rope
from asymagent.modeling import packed_linear
from asymagent.modeling.packed_linear import FloorLinear, PackedLinear

MAX_ROWS = packed_linear.MAX_PACKED_ROWS  # rows of one batched forward (the packed kernel's limit)


@dataclass
class SeqCall:
    """One sequence's forward: feed `ids` into `cache`; `keep` > 0: the logits of the last `keep`
    rows [1, keep, V] (as LeanForward.logits), `keep` None: the normed hidden states [1, T, H]
    (as LeanForward.hidden)."""

    lean: LeanForward
    cache: object  # a GrowingCache (DynamicCache) of `lean`'s model
    ids: list
    keep: int | None = None

    @property
    def rows(self) -> int:
        return len(self.ids)


def _attention_interface(lean: LeanForward):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get_interface(
        getattr(lean.config, "_attn_implementation", "sdpa"), None)


def model_batchable(lean: LeanForward) -> bool:
    """The model runs on the fused packed road: bf16 CPU, packing on, our grouped attention,
    fused packed q|k|v and gate|up, o / down packed or `FloorLinear` (F.linear, its rows padded
    to F.linear's floor: a row's bits are the same in any call of 1..MAX_ROWS rows, as the
    packed kernel's; `max_rows` covering a whole batched forward), biases only where its family has them (the lean forward's
    `Family` adapter: Qwen2's q|k|v bias, added inside the fused kernel as its own forward adds
    it; o and the MLP never carry one)."""
    if not (lean.fused and packed_linear.enabled() and not torch.is_grad_enabled()):
        return False
    if _attention_interface(lean) is not gqa_sdpa_forward:
        return False
    w = lean.body.embed_tokens.weight
    if w.dtype != torch.bfloat16 or w.device.type != "cpu":
        return False
    family = FAMILIES.get(getattr(lean.config, "model_type", None))
    qkv_bias = family is not None and family.qkv_bias
    for lay in lean.layers:
        if not all(type(m) is PackedLinear for m in (lay.q, lay.k, lay.v, lay.gate, lay.up)):
            return False
        for m in (lay.o, lay.down):
            if type(m) is not PackedLinear and not (type(m) is FloorLinear and m.max_rows >= MAX_ROWS):
                return False
        if any(m.bias is not None for m in (lay.o, lay.gate, lay.up, lay.down)):
            return False
        biased = [m.bias is not None for m in (lay.q, lay.k, lay.v)]
        if any(biased) and not (qkv_bias and all(biased)):
            return False
    return True


def batchable(call: SeqCall, model_ok: bool | None = None) -> bool:
    """Whether `call` may join a batched forward (module doc): its model on the fused packed road
    (`model_ok`: `model_batchable(call.lean)` when the caller checked it already, once for many
    calls) and every layer of its cache a GrowingLayer with aligned reads and room for its rows."""
    lean, rows = call.lean, call.rows
    if model_ok is None:
        model_ok = lean_of(lean.model) is lean and model_batchable(lean)
    if rows < 1 or rows > MAX_ROWS or not model_ok:
        return False
    layers = getattr(call.cache, "layers", None)
    if not layers or len(layers) < len(lean.layers):
        return False
    for layer in layers[: len(lean.layers)]:
        if type(layer) is not GrowingLayer or layer.attend_align <= 1:
            return False
        if layer.room_for(rows, torch.bfloat16, lean.kv_heads, lean.head_dim) is None:
            return False
    return _seq_attention(call) is not None


def _seq_attention(call: SeqCall) -> DecodeAttention | None:
    """The attention call this sequence's own forward would make (lean forward's `_mask` on an
    aligned GrowingLayer, then `decode_attention`: grouped rows or per head, its rows padded to
    this CPU's attention floor), or None."""
    lean, rows = call.lean, call.rows
    first = call.cache.layers[0]
    past = first.get_seq_length()
    keys = first.attended(past + rows)
    positions = torch.arange(rows) + past  # [T]
    mask = (torch.arange(keys)[None, :] <= positions[:, None])[None, None]  # [1, 1, T, L] bool
    return decode_attention(rows, lean.heads, lean.kv_heads, mask, torch.bfloat16,
                            torch.device("cpu"))


@dataclass
class _Seq:
    """Per sequence, for every layer of one batched forward: its rows [lo, hi) of the forward,
    its attention call (mask, padded rows), its layer caches, the cached positions before the forward (`start`, the same in
    every layer) and the aligned length attention reads (`read`)."""

    lo: int
    hi: int
    attention: DecodeAttention  # its own forward's call (asymagent/kv/attention.py)
    layers: list  # its GrowingLayer per decoder layer
    start: int
    read: int


def run_one(call: SeqCall) -> torch.Tensor:
    """`call` as its own forward (the lean forward's road): [1, keep, V] or [1, T, H]."""
    ids = torch.tensor([call.ids], dtype=torch.long)  # [1, T]
    # LeanForward's own methods, not a subclass's (asymagent/scheduling/batcher.py routes those here)
    if call.keep is None:
        return LeanForward.hidden(call.lean, ids, call.cache)
    return LeanForward.logits(call.lean, ids, call.cache, call.keep)


@torch.inference_mode()
def forward_many(calls: list) -> list:
    """The forwards of `calls` (one model, each `batchable`, at most MAX_ROWS rows in all) as one
    pass; returns per call what `run_one` returns, with the same bits. Each cache grows by its
    call's rows. One call: `run_one`."""
    if len(calls) == 1:
        return [run_one(calls[0])]
    lean = calls[0].lean
    if any(c.lean is not lean for c in calls):
        raise ValueError("forward_many: every call must run the same model")
    total = sum(c.rows for c in calls)
    if total > MAX_ROWS:
        raise ValueError(f"forward_many: {total} rows, at most {MAX_ROWS} in one forward")
    body = lean.body
    ids = torch.tensor([[t for c in calls for t in c.ids]], dtype=torch.long)  # [1, R]
    x = body.embed_tokens(ids)  # [1, R, H]
    seqs, cos, sin = [], [], []
    half = lean.head_dim // 2
    lo = 0
    for c in calls:
        layers = list(c.cache.layers[: len(lean.layers)])
        past = layers[0].get_seq_length()
        positions = (torch.arange(c.rows) + past).unsqueeze(0)  # [1, T]
        cs, sn = body.rotary_emb(x[:, lo:lo + c.rows], position_ids=positions)  # [1, T, D] each
        cos.append(cs)
        sin.append(torch.cat((-sn[..., :half], sn[..., half:]), dim=-1))  # rotate_half's sign
        seqs.append(_Seq(lo=lo, hi=lo + c.rows, attention=_seq_attention(c), layers=layers, start=past,
                         read=layers[0].attended(past + c.rows)))
        lo += c.rows
    cos_all = torch.cat(cos, dim=1).unsqueeze(1)  # [1, 1, R, D]
    sin_all = torch.cat(sin, dim=1).unsqueeze(1)  # [1, 1, R, D]
    captures = [capture_of(c.cache) for c in calls]  # EAGLE-3 features (kv/feature_capture.py)
    parts: list = [[] for _ in calls]
    for i, lay in enumerate(lean.layers):
        x = _layer(lean, lay, i, x, seqs, cos_all, sin_all)
        for cap, got, s in zip(captures, parts, seqs):
            if cap is not None and i in cap.layer_set:
                got.append(x[0, s.lo:s.hi])  # [T, H] this sequence's rows (a reference)
    for cap, got, s in zip(captures, parts, seqs):
        if cap is not None:
            cap.record(s.start, got)
    return _outputs(lean, x, calls, seqs)


def _layer(lean: LeanForward, lay, i: int, x: torch.Tensor, seqs: list, cos: torch.Tensor,
           sin_signed: torch.Tensor) -> torch.Tensor:
    """Decoder layer `i` over every sequence's rows, x [1, R, H] -> [1, R, H]: the direct road's
    layer (lean_forward.py `_direct_layer`) with the linears on all rows and attention per
    sequence (its rows' keys and values written into its own cache buffers)."""
    rows, hq, hkv, d = x.shape[1], lean.heads, lean.kv_heads, lean.head_dim
    lay.current()
    h = rms_norm(x, lay.norm1.weight, lay.norm1.variance_epsilon)  # [1, R, H]
    qkv = packed_linear.packed_rows_forward(h, lay.qkv_packed, lay.qkv_bias)  # [1, R, (Hq+2Hkv)*D]
    qkv = qkv.view(1, rows, hq + 2 * hkv, d).transpose(1, 2)  # [1, Hq+2Hkv, R, D]
    qk = rope(qkv[:, : hq + hkv], cos, sin_signed)  # [1, Hq+Hkv, R, D]
    sizes = [s.hi - s.lo for s in seqs]
    queries = qk[:, :hq].split(sizes, dim=2)  # [1, Hq, T, D] per sequence
    buffers = [s.layers[i].buffers() for s in seqs]  # [1, Hkv, capacity, D] each
    # every sequence's new keys and values into its own buffers, one call
    torch._foreach_copy_(
        [k[:, :, s.start:s.hi - s.lo + s.start] for s, (k, _) in zip(seqs, buffers)]
        + [v[:, :, s.start:s.hi - s.lo + s.start] for s, (_, v) in zip(seqs, buffers)],
        list(qk[:, hq:].split(sizes, dim=2)) + list(qkv[:, hq + hkv:].split(sizes, dim=2)))
    outs = []
    for s, q, (k_buf, v_buf), n in zip(seqs, queries, buffers, sizes):
        s.layers[i].advance(n)
        outs.append(s.attention(q, k_buf[:, :, :s.read], v_buf[:, :, :s.read], lay.attn.scaling))  # [1, T, Hq, D]
    attn = torch.cat(outs, dim=1).reshape(1, rows, hq * d)  # [1, R, Hq*D], contiguous
    x = x + _rows_linear(lay.o, attn)
    h = rms_norm(x, lay.norm2.weight, lay.norm2.variance_epsilon)
    gu = packed_linear.packed_rows_forward(h, lay.gu_packed)  # [1, R, 2*I]
    act = F.silu(gu[..., : lean.intermediate]) * gu[..., lean.intermediate:]  # [1, R, I]
    return x + _rows_linear(lay.down, act)


def _rows_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """o / down over all rows [1, R, in] -> [1, R, out]: the packed kernel (rows padded to its
    floor), or a FloorLinear's own forward (F.linear, rows padded to F.linear's floor)."""
    if type(module) is FloorLinear:
        return module.forward(x)
    return packed_linear.packed_rows_forward(x, module.current_packed())


def _outputs(lean: LeanForward, x: torch.Tensor, calls: list, seqs: list) -> list:
    """Per call: the logits of its last `keep` rows (one head call over every kept row) or its
    normed hidden states."""
    norm = lean.body.norm
    kept, spans, out = [], [], [None] * len(calls)
    for j, (c, s) in enumerate(zip(calls, seqs)):
        if c.keep is None:
            out[j] = rms_norm(x[:, s.lo:s.hi], norm.weight, norm.variance_epsilon)  # [1, T, H]
        else:
            kept.append(x[:, s.hi - c.keep:s.hi])  # [1, keep, H]
            spans.append((j, c.keep))
    if kept:
        h = rms_norm(torch.cat(kept, dim=1), norm.weight, norm.variance_epsilon)  # [1, K, H]
        logits = lean.model.lm_head(h)  # [1, K, V]
        at = 0
        for j, keep in spans:
            out[j] = logits[:, at:at + keep]
            at += keep
    return out
