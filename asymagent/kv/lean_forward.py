"""LeanForward: the Llama decoder forward as straight-line code, bit-identical to transformers'.

Why (issue 30, "take the Python out of decoding"; embedded verifier, bf16, 2 threads, 1000
cached tokens, `python -m asymagent.evals.probes.packed_decode`): a one-token forward through
transformers takes ~38 ms, of which the linear kernels are ~18 ms and attention ~3 ms. The rest
is per-call Python and small ops: five decorated module calls per layer, keyword plumbing, the
attention-interface lookup, a mask built through transformers' mask functions, and three q/k/v
plus two gate/up kernel calls where one each would do. LeanForward runs the same computation
over the same weights as one loop: the mask, the rotary tables and the attention function once
per forward, q|k|v and gate|up as one packed kernel call each (bf16 on the CPU, forwards of at
most `PackedLinear.max_rows` rows), rotary embedding on q and k together. Measured: ~28 ms
instead of ~38 ms for one token and for a 4-token verify (docs/kernels.md).

Bit-identical to the transformers forward, by construction and by check:
- every op is transformers' own, in the same order and dtypes (RMSNorm in float32, rotary as
  `x*cos + rotate_half(x)*sin`, the attention function the model is configured with, the
  causal mask); `rotate_half(x)*sin` is computed as `cat(x2, x1) * cat(-sin1, sin2)`, the same
  products (negation is exact);
- the fused q|k|v and gate|up kernels give every output column the bits the separate kernels
  give (oneDNN reduces over the input dimension the same way whatever the output width;
  checked per model, below); forwards of more rows than the packed limit (prefill chunks) call
  the separate layers exactly as transformers does;
- `attach` runs the model both ways on a fresh cache (a prefill, then 1-, 4- and 40-token
  forwards) and compares the logits bit for bit; a model that differs stays on the transformers
  forward and the reason is reported (`LeanReport.why`).

Decode and verify forwards take a shorter road still (`_Direct`, `_direct_layer`): when a
forward is one the engine's CPU path would run through the fused packed kernels (o / down
packed, or a `FloorLinear` run through its own forward: the reference pair's 1.5B), our GQA
attention (grouped rows, or per head where this CPU's grouped rows differ:
`attention.decode_attention`) and a GrowingCache with room, every per-call decision those
functions make (row floors, the attention interface's branches, the additive mask, the cache's
room check) is made once per forward and each layer runs as one function of tensor ops:
the same ops in the same order on the same tensors, so the same bits (the attach check runs it:
its 1- and 4-token forwards take this road; tests/test_lean_forward.py compares it with the
general loop). Measured: 2.4-3.2 ms less per decode or verify forward (5-8%; docs/results.md,
"The Python out of decoding"). Rows under a kernel's row floor (asymagent/modeling/row_floor.py:
attention 2 on AMX, 4 on an AMD EPYC without AMX; a linear's 1 or 2) are padded on the road
exactly as the general loop pads them (issue 53: before, such a forward left the road, so on that
AMD no decode took it). Anything else (a first forward on an empty cache, a layer whose cache must
grow, other attention) takes the general loop, layer by layer.

Scope: `LlamaForCausalLM` bodies (the embedded verifier, the drafter) and `Qwen2ForCausalLM` ones
(the reference pair: q|k|v biases added inside the fused kernel; `FAMILIES`), with a SiLU
MLP and full attention in every layer, on the CPU, over a DynamicCache or GrowingCache (the
StaticKV / CUDA-graph path, asymagent/kv/static_cache.py, is separate). Used by
`ModelCache.forward_logits/forward_hidden` (asymagent/kv/cache.py) when attached; the model's own
`forward` is untouched, and a model (or its body) with forward hooks registered, or global forward
hooks, is run through it so that the hooks see every forward (hooks on inner modules, layers or
projections, are not called by LeanForward: detach it, or set the switch below, to use those). `ASYMAGENT_LEAN_FORWARD=0` turns it off. A FeatureCapture on the cache
(asymagent/kv/feature_capture.py) receives the outputs of its layers (references, no op changed). The fused packed weights replace
the per-layer packed copies of q/k/v/gate/up (those are dropped; a transformers forward re-makes
them on first use), so memory stays as with packed linears alone; a weight changed in place (its
version counter moves) is re-fused on the next forward.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asymagent.kv.attention import DecodeAttention, decode_attention, gqa_sdpa_forward
from asymagent.kv.feature_capture import capture_of
from asymagent.kv.growing_cache import GrowingLayer
from asymagent.modeling import packed_linear
from asymagent.modeling.check_record import recorded_check
from asymagent.modeling.packed_linear import FloorLinear, PackedLinear

ATTR = "asymagent_lean"  # the attached LeanForward on the *ForCausalLM
CHECK_ROWS = (1, 4, 40)  # forward sizes compared with transformers at attach time (after a prefill)


@dataclass
class LeanReport:
    """What `attach` did: attached or why not, and whether the fused packed kernels are in use."""

    attached: bool = False
    fused: bool = False  # q|k|v and gate|up through one packed kernel each
    why: str | None = None  # not attached: the reason


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, op for op (float32 inside, weight applied in the input dtype)."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`x*cos + rotate_half(x)*sin` with rotate_half's negation moved into `sin_signed`."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin_signed)


def _fused(x: torch.Tensor, packed: torch.Tensor, parts: tuple, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [1, T, H] through one fused packed kernel (+ the parts' biases) -> [1, T, sum of the parts'
    outputs]; if the kernel fails, packing is switched off (one warning) and the parts run one by
    one (same bits)."""
    try:
        return packed_linear.packed_rows_forward(x, packed, bias)
    except Exception as exc:  # noqa: BLE001 - as PackedLinear: fall back for good, once
        packed_linear.disable(exc)
    return torch.cat([m.forward(x) for m in parts], dim=-1)


def _version(t: torch.Tensor) -> tuple:
    try:
        version = torch.Tensor._version.__get__(t)
    except RuntimeError:  # an inference tensor has no version counter
        version = -1
    return (t.data_ptr(), version)


class _Layer:
    """One decoder layer's weights and modules, with its fused packed q|k|v and gate|up kernels."""

    __slots__ = ("norm1", "q", "k", "v", "o", "norm2", "gate", "up", "down", "attn",
                 "qkv_packed", "qkv_bias", "gu_packed", "sources")

    def __init__(self, layer: torch.nn.Module) -> None:
        a, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.q, self.k, self.v, self.o = a.q_proj, a.k_proj, a.v_proj, a.o_proj
        self.gate, self.up, self.down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.attn = a
        self.qkv_packed = self.gu_packed = self.qkv_bias = None
        self.sources = None

    def fuse(self) -> None:
        """(Re)make the fused packed kernels from the current weights; drop the per-layer copies."""
        parts = (self.q, self.k, self.v, self.gate, self.up)
        # [Hq*D + 2*Hkv*D, H] and [2*I, H]
        self.qkv_packed = packed_linear.pack_weight(torch.cat([self.q.weight, self.k.weight, self.v.weight]))
        biases = [m.bias for m in (self.q, self.k, self.v)]
        # [Hq*D + 2*Hkv*D] (Qwen2), or None (Llama): added inside the packed kernel, per column
        self.qkv_bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self.gu_packed = packed_linear.pack_weight(torch.cat([self.gate.weight, self.up.weight]))
        self.sources = tuple(_version(m.weight) for m in parts)
        for m in parts:  # the fused copies replace them (re-made by PackedLinear if ever used)
            m.packed_weight, m.packed_key = None, None

    def current(self) -> None:
        """Re-fuse when a source weight was replaced or changed in place since `fuse`."""
        weights = [m.weight for m in (self.q, self.k, self.v, self.gate, self.up)]
        try:  # `_version` inline: this runs for every layer of every forward
            sources = tuple([(w.data_ptr(), torch.Tensor._version.__get__(w)) for w in weights])
        except RuntimeError:  # an inference tensor has no version counter
            sources = tuple(_version(w) for w in weights)
        if self.sources != sources:
            self.fuse()


@dataclass(frozen=True)
class Family:
    """What a model family's decoder looks like to LeanForward: its class, and which biases its
    linears carry (the forward adds a q|k|v bias when the layers have one; an MLP bias is none of
    these families')."""

    model_class: str
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2); o and the MLP never do

    def why_not(self, cfg) -> str | None:
        if getattr(cfg, "mlp_bias", False):
            return "biased MLP"
        if not self.qkv_bias and getattr(cfg, "attention_bias", False):
            return "biased attention"
        if self.model_class == "Qwen2ForCausalLM" and getattr(cfg, "use_sliding_window", False):
            return "sliding-window attention"
        return None


# The Llama decoder and the families that are Llama's layer with other biases: Qwen2 (q/k/v
# biases, rope theta 1e6, tied or untied head; the reference pair, asymagent/modeling/pairs.py).
FAMILIES = {"llama": Family("LlamaForCausalLM", qkv_bias=False),
            "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True)}


def why_not(model: torch.nn.Module) -> str | None:
    """None if LeanForward can run `model`, else why not."""
    if os.environ.get("ASYMAGENT_LEAN_FORWARD", "").strip().lower() in ("0", "false", "off", "no"):
        return "ASYMAGENT_LEAN_FORWARD=0"
    cfg = getattr(model, "config", None)
    family = FAMILIES.get(getattr(cfg, "model_type", None))
    if family is None or type(model).__name__ != family.model_class:
        return f"{type(model).__name__} is not one of " + ", ".join(f.model_class for f in FAMILIES.values())
    why = family.why_not(cfg)
    if why is not None:
        return why
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (SiLU only)"
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "sliding_window", None):
        return "not every layer is full attention"
    p = next(model.parameters())
    if p.device.type != "cpu":
        return f"device {p.device.type} (CPU only: CUDA decodes through static caches and graphs)"
    return None


_ROAD = threading.local()  # `general` set: this thread's forwards take the general loop


@contextlib.contextmanager
def general_loop():
    """Inside the block (this thread) every layer runs the general loop, as before the direct road:
    what the tests compare it with (the A/B that timed it: docs/log.md, "The Python out of decoding")."""
    saved = getattr(_ROAD, "general", False)
    _ROAD.general = True
    try:
        yield
    finally:
        _ROAD.general = saved


@dataclass
class _Direct:
    """What every layer of one forward shares on the direct road (see the module doc): rotary
    tables [1, 1, T, D], the attention call (its additive mask and padded rows), the head counts,
    the row floors of the packed kernels (q|k|v, gate|up, o, down: rows under one are padded to
    it, as `packed_rows_forward` pads them)."""

    cos: torch.Tensor
    sin_signed: torch.Tensor
    attention: DecodeAttention
    floors: dict  # "qkv" / "gu" / "o" / "down" -> row floor of that packed kernel
    hq: int
    hkv: int
    d: int
    inter: int
    off: bool = False  # the packed kernel failed in this forward: the general loop from here on


ROW_PROJECTIONS = (PackedLinear, FloorLinear)  # o / down kinds the direct road runs


def _proj(module: torch.nn.Linear, packed: torch.Tensor | None, x: torch.Tensor, floor: int) -> torch.Tensor:
    """o / down on the direct road: the packed kernel (`packed`), its rows padded to its `floor`
    (looked up once per forward) as `PackedLinear.forward` pads them, or, `packed` None, the
    layer's own forward: a FloorLinear (a layer `pack_linears` left on F.linear) pads its rows to
    F.linear's floor itself, exactly as the general loop's `lay.down.forward` call does."""
    if packed is None:
        return module.forward(x)
    return packed_linear.padded_forward(x, packed, None, floor)


def _direct_layer(lay: _Layer, x: torch.Tensor, o_packed: torch.Tensor | None, down_packed: torch.Tensor | None,
                  k_buf: torch.Tensor, v_buf: torch.Tensor, start: int, read: int, f: _Direct) -> torch.Tensor:
    """One decoder layer of a decode / verify forward, x [1, T, H] -> [1, T, H]: the general loop's
    fused branch with `cache.update`, `gqa_sdpa_forward` (grouped rows or per head, rows padded
    to the attention floor: `f.attention`) and `PackedLinear.forward` (rows padded to each
    kernel's floor) written out (their checks made once per forward by `LeanForward._direct`).
    The new keys and values go to positions [start, start + T) of the cache's buffers
    [1, Hkv, capacity, D]; attention reads `read` positions."""
    rows, hq, hkv, d = x.shape[1], f.hq, f.hkv, f.d
    h = rms_norm(x, lay.norm1.weight, lay.norm1.variance_epsilon)  # [1, T, H]
    qkv = packed_linear.padded_forward(h, lay.qkv_packed, lay.qkv_bias, f.floors["qkv"])  # [1, T, (Hq+2Hkv)*D]
    qkv = qkv.view(1, rows, hq + 2 * hkv, d).transpose(1, 2)  # [1, Hq+2Hkv, T, D]
    qk = rope(qkv[:, : hq + hkv], f.cos, f.sin_signed)  # [1, Hq+Hkv, T, D]
    k_buf[:, :, start:start + rows].copy_(qk[:, hq:])
    v_buf[:, :, start:start + rows].copy_(qkv[:, hq + hkv:])
    out = f.attention(qk[:, :hq], k_buf[:, :, :read], v_buf[:, :, :read], lay.attn.scaling)  # [1, T, Hq, D]
    x = x + _proj(lay.o, o_packed, out.reshape(1, rows, -1).contiguous(), f.floors["o"])
    h = rms_norm(x, lay.norm2.weight, lay.norm2.variance_epsilon)
    gu = packed_linear.padded_forward(h, lay.gu_packed, None, f.floors["gu"])  # [1, T, 2*I]
    act = F.silu(gu[..., : f.inter]) * gu[..., f.inter:]  # [1, T, I]
    return x + _proj(lay.down, down_packed, act, f.floors["down"])


def _packed_of(module: torch.nn.Linear) -> torch.Tensor | None:
    """A PackedLinear's current packed weight; None for a FloorLinear (`_proj` runs its forward)."""
    return module.current_packed() if type(module) is PackedLinear else None


class LeanForward:
    """The decoder forward of one LlamaForCausalLM (see the module doc); `attach` makes one."""

    def __init__(self, model: torch.nn.Module, fuse: bool) -> None:
        self.model = model
        self.body = model.model
        cfg = model.config
        self.config = cfg
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.intermediate = cfg.intermediate_size
        self.layers = [_Layer(layer) for layer in self.body.layers[: cfg.num_hidden_layers]]
        # fused packed kernels: every projection a PackedLinear (bf16 CPU, pack_linears ran)
        self.fused = fuse and all(type(m) is PackedLinear for lay in self.layers
                                  for m in (lay.q, lay.k, lay.v, lay.gate, lay.up))
        if self.fused:
            for lay in self.layers:
                lay.fuse()

    def __reduce__(self):
        """A copied or pickled model gets no LeanForward (its packed kernels are opaque oneDNN
        tensors bound to this model's weights); `attach` the copy again if wanted."""
        return (_none, ())

    # ------------------------------------------------------------------ pieces
    def _mask(self, cache, x: torch.Tensor, positions: torch.Tensor, past: int, rows: int):
        """The causal mask transformers would build for this forward ([1, 1, T, L] bool, or None)."""
        first = cache.layers[0] if getattr(cache, "layers", None) else None
        if isinstance(first, GrowingLayer) and first.attend_align > 1:
            # an aligned read (growing_cache.py): the mask is never skipped; key j is seen by the
            # query at position p iff j <= p, over the attended length
            keys = first.attended(past + rows)
            return (torch.arange(keys, device=x.device)[None, :] <= positions[0][:, None])[None, None]
        from transformers.masking_utils import create_causal_mask

        return create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None,
                                  cache=cache, position_ids=positions)

    # ------------------------------------------------------------------ forward
    def body_forward(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """input_ids [1, T] -> the body's last hidden states [1, T, H] BEFORE the final norm;
        the cache grows by T positions (as `model.model(input_ids, cache=cache, use_cache=True)`)."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama.modeling_llama import eager_attention_forward

        body = self.body
        x = body.embed_tokens(input_ids)  # [1, T, H]
        rows = input_ids.shape[1]
        past = cache.get_seq_length()
        positions = (torch.arange(rows, device=x.device) + past).unsqueeze(0)  # [1, T]
        mask = self._mask(cache, x, positions, past, rows)
        cos, sin = body.rotary_emb(x, position_ids=positions)  # [1, T, D] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [1, 1, T, D]
        half = self.head_dim // 2
        sin_signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # rotate_half's sign
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(getattr(self.config, "_attn_implementation", "sdpa"),
                                                          eager_attention_forward)
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        # the fused kernels: bf16 on the CPU, while PackedLinear's kernel works (packed_linear.py)
        packed = (self.fused and x.dtype == torch.bfloat16 and x.device.type == "cpu"
                  and packed_linear.enabled())
        direct = self._direct(attention, packed, cos, sin_signed, mask, x)
        capture = capture_of(cache)  # EAGLE-3 features (asymagent/kv/feature_capture.py), or None
        parts = [] if capture is not None else None
        for i, lay in enumerate(self.layers):
            if parts is not None and i > 0 and i - 1 in capture.layer_set:
                parts.append(x[0])  # layer i-1's output [T, H] (a reference: no op changes)
            if direct is not None:
                out = self._direct_step(i, lay, x, cache, direct)
                if out is not None:
                    x = out
                    continue
            fused = packed and rows <= getattr(lay.q, "max_rows", 0)
            h = rms_norm(x, lay.norm1.weight, lay.norm1.variance_epsilon)  # [1, T, H]
            if fused:
                lay.current()
                qkv = _fused(h, lay.qkv_packed, (lay.q, lay.k, lay.v), lay.qkv_bias)
                qkv = qkv.view(1, rows, hq + 2 * hkv, d).transpose(1, 2)  # [1, Hq+2Hkv, T, D]
                qk = rope(qkv[:, : hq + hkv], cos, sin_signed)  # [1, Hq+Hkv, T, D]
                q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv:]
            else:
                q = rope(lay.q.forward(h).view(1, rows, hq, d).transpose(1, 2), cos, sin_signed)
                k = rope(lay.k.forward(h).view(1, rows, hkv, d).transpose(1, 2), cos, sin_signed)
                v = lay.v.forward(h).view(1, rows, hkv, d).transpose(1, 2)  # [1, Hkv, T, D]
            k, v = cache.update(k, v, i)  # [1, Hkv, L, D]
            out, _ = attention(lay.attn, q, k, v, mask, dropout=0.0, scaling=lay.attn.scaling)
            x = x + lay.o.forward(out.reshape(1, rows, -1).contiguous())  # [1, T, H]
            h = rms_norm(x, lay.norm2.weight, lay.norm2.variance_epsilon)
            if fused:
                gu = _fused(h, lay.gu_packed, (lay.gate, lay.up))  # [1, T, 2*I]
                act = F.silu(gu[..., : self.intermediate]) * gu[..., self.intermediate:]  # [1, T, I]
            else:
                act = F.silu(lay.gate.forward(h)) * lay.up.forward(h)
            x = x + lay.down.forward(act)
        if parts is not None:
            if len(self.layers) - 1 in capture.layer_set:
                parts.append(x[0])
            capture.record(past, parts)
        return x

    def _direct(self, attention, packed: bool, cos: torch.Tensor, sin_signed: torch.Tensor,
                mask, x: torch.Tensor) -> _Direct | None:
        """The direct road's shared inputs for this forward (module doc), or None: the forward
        is one the general loop would run through the fused packed kernels, `gqa_sdpa_forward`'s
        decode attention (`decode_attention`: grouped rows or per head) and packed calls for o and
        down (or, for a FloorLinear o / down, its own forward). Rows under a kernel's row floor
        are padded to it on the road, as the general loop pads them (never a reason to leave)."""
        rows = x.shape[1]
        if (not packed or attention is not gqa_sdpa_forward or x.shape[0] != 1 or torch.is_grad_enabled()
                or getattr(_ROAD, "general", False)):
            return None
        lay = self.layers[0]
        if type(lay.o) not in ROW_PROJECTIONS or type(lay.down) not in ROW_PROJECTIONS:
            return None
        lay.current()
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        floors = {"qkv": packed_linear.packed_floor(lay.qkv_packed, x.shape[-1], x.dtype),
                  "gu": packed_linear.packed_floor(lay.gu_packed, x.shape[-1], x.dtype)}
        for role, n_in in (("o", hq * d), ("down", self.intermediate)):
            # the floor of this role's packed layers (any layer's: some may be FloorLinear, which
            # pads itself; every layer's weight has the same shape)
            m = next((getattr(la, role) for la in self.layers if type(getattr(la, role)) is PackedLinear), None)
            floors[role] = 1 if m is None else packed_linear.packed_floor(m.current_packed(), n_in, x.dtype)
        attention_call = decode_attention(rows, hq, hkv, mask, x.dtype, x.device)
        if attention_call is None:
            return None
        return _Direct(cos=cos, sin_signed=sin_signed, attention=attention_call, floors=floors,
                       hq=hq, hkv=hkv, d=d, inter=self.intermediate)

    def _direct_step(self, i: int, lay: _Layer, x: torch.Tensor, cache, f: _Direct) -> torch.Tensor | None:
        """Layer `i` on the direct road, or None (the general loop runs it): the kernels must be
        the fused and packed ones for these rows and the layer's cache a GrowingLayer with room."""
        rows = x.shape[1]
        o, down = lay.o, lay.down
        if (f.off or rows > getattr(lay.q, "max_rows", 0) or type(o) not in ROW_PROJECTIONS
                or type(down) not in ROW_PROJECTIONS or rows > o.max_rows or rows > down.max_rows):
            return None
        layer_cache = cache.layers[i] if i < len(getattr(cache, "layers", ())) else None
        if type(layer_cache) is not GrowingLayer:
            return None
        read = layer_cache.room_for(rows, x.dtype, f.hkv, f.d)
        if read is None:  # the general loop's cache.update grows or initialises the buffers
            return None
        lay.current()
        k_buf, v_buf = layer_cache.buffers()
        try:
            out = _direct_layer(lay, x, _packed_of(o), _packed_of(down), k_buf, v_buf,
                                layer_cache.get_seq_length(), read, f)
        except Exception as exc:  # noqa: BLE001 - as `_fused`: packing off for good, once; the
            packed_linear.disable(exc)  # general loop re-runs this layer (the cache has not
            f.off = True  # advanced: its write of these positions is repeated)
            return None
        layer_cache.advance(rows)
        return out

    def hidden(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """[1, T] -> final (normed) hidden states [1, T, H], as `model.model(...).last_hidden_state`."""
        norm = self.body.norm
        return rms_norm(self.body_forward(input_ids, cache), norm.weight, norm.variance_epsilon)

    def logits(self, input_ids: torch.Tensor, cache, keep: int) -> torch.Tensor:
        """[1, T] -> logits of the last `keep` positions [1, keep, V] in the model dtype, as
        `model(..., logits_to_keep=keep).logits`."""
        norm = self.body.norm
        x = self.body_forward(input_ids, cache)[:, -keep:]  # [1, keep, H]
        return self.model.lm_head(rms_norm(x, norm.weight, norm.variance_epsilon))


def _none() -> None:
    return None


def lean_of(model: torch.nn.Module) -> LeanForward | None:
    """The LeanForward attached to `model`, if any (and not turned off since)."""
    lean = getattr(model, ATTR, None)
    if lean is None:
        return None
    if os.environ.get("ASYMAGENT_LEAN_FORWARD", "").strip().lower() in ("0", "false", "off", "no"):
        return None
    if lean.body.embed_tokens.weight.device.type != "cpu":  # moved since: transformers' forward
        return None
    if _hooked(model) or _hooked(lean.body):  # hooks see every forward: transformers' forward
        return None
    return lean


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")


def _hooked(module: torch.nn.Module) -> bool:
    """Whether forward hooks are registered on `module` or globally (torch.nn.modules.module)."""
    from torch.nn.modules import module as torch_module

    return any(getattr(module, name, None) or getattr(torch_module, "_global" + name, None)
               for name in _HOOK_DICTS)


@torch.inference_mode()
def _same_as_transformers(model: torch.nn.Module, lean: LeanForward) -> str | None:
    """Prefill + CHECK_ROWS forwards both ways on fresh caches; None if every logit is equal."""
    from asymagent.kv.growing_cache import for_model

    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 70), generator=g)  # [1, 70]
    plain, fast = for_model(model), for_model(model)  # the caches the engine gives the model
    model(input_ids=prompt, cache=plain, use_cache=True)
    lean.body_forward(prompt, fast)
    for rows in CHECK_ROWS:
        ids = torch.randint(0, vocab, (1, rows), generator=g)  # [1, rows]
        a = model(input_ids=ids, cache=plain, use_cache=True, logits_to_keep=rows).logits
        b = lean.logits(ids, fast, rows)
        if not torch.equal(a, b):
            return f"logits of a {rows}-token forward differ from transformers' (max |diff| " \
                   f"{(a.float() - b.float()).abs().max().item():.3g})"
        h_plain = model.model(input_ids=ids, cache=plain, use_cache=True).last_hidden_state
        if not torch.equal(h_plain, lean.hidden(ids, fast)):
            return f"hidden states of a {rows}-token forward differ from transformers'"
    return None


def attach(model: torch.nn.Module, check: bool = True) -> LeanReport:
    """Give `model` a LeanForward (attribute ATTR) when it can run it and, with `check`, when its
    logits equal transformers' bit for bit; idempotent. Call after `pack_linears` and
    `use_gqa_attention` (the kernels and attention it must match are the model's current ones).
    The check's answer for a model loaded from files is recorded (asymagent/modeling/
    check_record.py: keyed on the weights, machine, threads and code) and read back on the next
    start."""
    why = why_not(model)
    if why is not None:
        return LeanReport(why=why)
    lean = getattr(model, ATTR, None) or LeanForward(model, fuse=True)
    if check:
        answer = recorded_check("lean_same_as_transformers", model, lambda: _check(model, lean),
                                _valid_answer, lean.fused, CHECK_ROWS,
                                getattr(model.config, "_attn_implementation", None))
        if answer["why"] is not None:
            setattr(model, ATTR, None)
            return LeanReport(why=answer["why"])
        if lean.fused and not answer["fused"]:  # equal only without the fused kernels
            lean = LeanForward(model, fuse=False)
    setattr(model, ATTR, lean)
    return LeanReport(attached=True, fused=lean.fused)


def _check(model: torch.nn.Module, lean: LeanForward) -> dict:
    """{"fused": the lean forward that equals transformers' is the fused one, "why": None, or why
    neither does}; the fused kernels tried first. The per-layer packed copies the transformers
    forward re-made on the way are dropped again where the fused ones replace them (~2 GB on the
    reference pair, never read by the lean forward)."""
    why, fused = _same_as_transformers(model, lean), lean.fused
    if why is not None and lean.fused:  # try again without the fused kernels
        why, fused = _same_as_transformers(model, LeanForward(model, fuse=False)), False
    if fused and why is None:
        for lay in lean.layers:
            for m in (lay.q, lay.k, lay.v, lay.gate, lay.up):
                m.packed_weight, m.packed_key = None, None
    return {"fused": fused, "why": why}


def _valid_answer(answer) -> bool:
    return isinstance(answer, dict) and isinstance(answer.get("fused"), bool) and \
        (answer.get("why") is None or isinstance(answer.get("why"), str))


def detach(model: torch.nn.Module) -> None:
    """Back to the transformers forward for `model` (the per-layer packed copies come back on use)."""
    if getattr(model, ATTR, None) is not None:
        setattr(model, ATTR, None)
