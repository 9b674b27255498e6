"""FeatureHead: an EAGLE-3-style draft head, one decoder layer over the verifier's fused low/mid/high features.

At position t the head reads g_t, the verifier's hidden states at a few layers (captured by
asymagent/kv/feature_capture.py) fused by a linear map `fc` [L*H -> H], and the embedding of
the next token x_{t+1} (the verifier's own embedding table, frozen). Both are RMS-normed,
concatenated and mapped to H (`inp`), then one decoder layer of the verifier family's shape
(attention with rotary positions and its own KV cache, SiLU MLP; `intermediate` may be smaller)
and a final norm give a_t; the verifier's LM head (shared, frozen; restricted to a draft
vocabulary when `vocab` is set) turns a_t into the distribution of x_{t+2}.

Drafting is a chain (EAGLE): after the last position whose features exist, the head's own
output a_t stands in for g_{t+1} next to the drafted token. Training feeds its own outputs back
the same way for a few steps (EAGLE-3's training-time test, `train_forward`).

Only the head's own weights are saved (`state`): the verifier's embeddings and head are read
from the verifier it was trained for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass
class FeatureHeadConfig:
    """The head's shape; `layers` are the verifier layers it reads (FeatureCapture.layers)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: tuple
    rope_theta: float = 10000.0
    eps: float = 1e-6
    vocab_size: int = 0  # the verifier's vocabulary

    @classmethod
    def for_verifier(cls, model: torch.nn.Module, layers: tuple, intermediate: int = 0) -> "FeatureHeadConfig":
        """The verifier family's layer shape (`intermediate` 0: the verifier's own)."""
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        theta = getattr(c, "rope_theta", None)
        if theta is None:
            theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return cls(hidden=c.hidden_size, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                   head_dim=head_dim, intermediate=intermediate or c.intermediate_size,
                   layers=tuple(layers), rope_theta=float(theta), eps=float(getattr(c, "rms_norm_eps", 1e-6)),
                   vocab_size=int(c.vocab_size))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layers"] = list(self.layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureHeadConfig":
        return cls(**{**d, "layers": tuple(d["layers"])})


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(positions: torch.Tensor, dim: int, theta: float, dtype) -> tuple:
    """cos, sin [..., T, D] for integer positions [..., T] (Llama's rotary, half split)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    ang = positions.float()[..., None] * inv  # [..., T, D/2]
    ang = torch.cat([ang, ang], dim=-1)  # [..., T, D]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class FeatureHead(torch.nn.Module):
    """The head's own weights (see module doc); `embed` and `lm_head` are the verifier's (frozen)."""

    def __init__(self, cfg: FeatureHeadConfig) -> None:
        super().__init__()
        h, d = cfg.hidden, cfg.head_dim
        self.cfg = cfg
        self.fc = torch.nn.Linear(len(cfg.layers) * h, h, bias=False)  # fuse low/mid/high
        self.norm_e, self.norm_g = RMSNorm(h, cfg.eps), RMSNorm(h, cfg.eps)
        self.inp = torch.nn.Linear(2 * h, h, bias=False)
        self.norm1, self.norm2, self.norm_out = RMSNorm(h, cfg.eps), RMSNorm(h, cfg.eps), RMSNorm(h, cfg.eps)
        self.q = torch.nn.Linear(h, cfg.heads * d, bias=False)
        self.k = torch.nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.v = torch.nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.o = torch.nn.Linear(cfg.heads * d, h, bias=False)
        self.gate = torch.nn.Linear(h, cfg.intermediate, bias=False)
        self.up = torch.nn.Linear(h, cfg.intermediate, bias=False)
        self.down = torch.nn.Linear(cfg.intermediate, h, bias=False)

    # ------------------------------------------------------------------ pieces
    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """Captured verifier features [..., L*H] -> g [..., H]."""
        return self.fc(feats.to(self.fc.weight.dtype))

    def layer_input(self, g: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """g [..., H] (fused features or the head's own output) + next-token embedding [..., H]."""
        emb = emb.to(self.inp.weight.dtype)
        return self.inp(torch.cat([self.norm_e(emb), self.norm_g(g)], dim=-1))  # [..., H]

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple:
        """x [B, T, H] -> q [B, Hq, T, D], k, v [B, Hkv, T, D] (rotary applied)."""
        c = self.cfg
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rotary(positions, c.head_dim, c.rope_theta, x.dtype)  # [B|1, T, D]
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # [B|1, 1, T, D]
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q [B, Hq, T, D] over k, v [B, Hkv, S, D] with a bool mask [T, S] (True: attend) -> [B, T, Hq*D]."""
        c = self.cfg
        rep = c.heads // c.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim))
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + o, then the SiLU MLP: the layer's output a [B, T, H] (before norm_out)."""
        x = x + self.o(attn)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

    # ------------------------------------------------------------------ training
    def train_forward(self, feats: torch.Tensor, emb: torch.Tensor, steps: int) -> list:
        """EAGLE-3's training-time test. feats [B, T, L*H] verifier features at positions 0..T-1,
        emb [B, T, H] embeddings of x_1..x_T (the token after each position). Returns per step j
        (0..steps-1) the outputs a^j [B, T, H]: step 0 reads the verifier's features; step j
        reads a^{j-1} shifted by one position (the head's own prediction, as in a draft chain)
        and attends to step-0 keys up to t-j and to its own chain's keys at t-j+1..t, exactly
        the keys a chain drafting j steps past the verifier's features sees. Rows t < j have
        no such chain and are left out of the loss by the caller."""
        b, t, _ = emb.shape
        positions = torch.arange(t, device=emb.device)[None]  # [1, T]
        g = self.fuse(feats)
        keys, values, outs = [], [], []
        idx = torch.arange(t, device=emb.device)
        for j in range(steps):
            if j > 0:  # a^{j-1} at t-1 stands for g_t
                prev = outs[-1]
                g = torch.cat([prev.new_zeros(b, 1, prev.shape[-1]), prev[:, :-1]], dim=1)
            x = self.layer_input(g, emb)  # [B, T, H]
            q, k, v = self.qkv(x, positions)
            keys.append(k)
            values.append(v)
            masks = [idx[None, :] <= (idx[:, None] - j)]  # step-0 keys s <= t-j  [T, T]
            for i in range(1, j + 1):  # the chain's own keys at t-(j-i)
                masks.append(idx[None, :] == (idx[:, None] - (j - i)))
            mask = torch.cat(masks, dim=1)  # [T, (j+1)T]
            mask = mask | ~mask.any(dim=1, keepdim=True)  # rows t < j: any key (not in the loss)
            attn = self.attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask)
            outs.append(self.finish(x, attn))
        return outs

    # ------------------------------------------------------------------ save / load
    def state(self) -> dict:
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}


def head_logits(out: torch.Tensor, norm_out: RMSNorm, weight: torch.Tensor) -> torch.Tensor:
    """a [..., H] -> logits [..., N] over the rows of `weight` [N, H] (the verifier's LM head,
    or its draft-vocabulary rows)."""
    return F.linear(norm_out(out).to(weight.dtype), weight).float()


def save_head(head: FeatureHead, path: str, vocab: torch.Tensor | None, meta: dict | None = None) -> None:
    """The head's weights (bf16), its config, draft vocabulary and `meta` as one .safetensors."""
    import json

    from safetensors.torch import save_file

    tensors = {k: v.to(torch.bfloat16) for k, v in head.state().items()}
    if vocab is not None:
        tensors["draft_vocab"] = vocab.long().contiguous()
    save_file(tensors, path, metadata={"config": json.dumps(head.cfg.to_dict()),
                                       "meta": json.dumps(meta or {})})


def load_head(path: str, dtype=torch.float32) -> tuple:
    """(FeatureHead, draft vocabulary LongTensor [N] or None, meta dict) from `save_head`'s file."""
    import json

    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        md = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    head = FeatureHead(FeatureHeadConfig.from_dict(json.loads(md["config"])))
    vocab = tensors.pop("draft_vocab", None)
    head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})
    return head.to(dtype).eval(), vocab, json.loads(md.get("meta", "{}"))
