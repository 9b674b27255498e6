"""The acceptance gate in plain torch: delta-fusion, JSD-aware (cda), greedy and exact rules.

This is the readable definition of the gate (docs/architecture.md §3); the Triton kernel in
`fused_gate.py` computes the same function and is tested against this file.

Glossary (one decode round of one sequence, K draft tokens, positions i = 0..K):
- draft tokens d_0..d_{K-1}: proposed by the drafter reading the full view.
- three logit rows per position: verifier on the compressed view (v), drafter on the full
  view (a, "augmented"), drafter on the compressed view (b, "base"). Row i scores d_i; row K is
  the position after the last draft. One view (no compression): pass `base_logits=None`; the
  delta and the JSD are then 0 exactly. No drafter rows at all (mode spec: the target is the
  verifier): pass `drafter_logits=None` too (and the proposal in `proposal_logits`).
- fused target: log p_v + beta * (log p_a - log p_b) (delta-fusion). Where either drafter view
  gives a token probability 0 (masked, -inf logit) the drafter has no evidence there and the
  delta is 0. With fuse_bonus=False row K uses beta=0 (the verifier alone, as the official code).
- divergence gate (`jsd_min` > 0): the delta applies only at positions where the drafter's two
  views disagree, beta_eff,i = beta * [JSD(p_a,i || p_b,i) >= jsd_min] (`gated_beta`); elsewhere
  the target is the verifier's own row. jsd_min = 0 is plain delta-fusion, bit for bit.
- accepted tokens: the drafts before the first rejected one (num_accepted in 0..K).
- rejected token: the first draft that fails the rule; the round stops there.
- fused token: the token emitted at the stop position (argmax of the fused target for cda and
  greedy; for exact at T>0 a sample from the residual max(0, p - q)).
- bonus token: the token emitted at position K when every draft was accepted.

Rules:
- cda (paper): accept d_i iff p_v(d_i) > gamma * exp(-JSD(p_a,i || p_b,i)) * p_b(d_i).
- greedy: accept d_i iff d_i is the argmax of the fused target at i.
- exact (Leviathan/Chen rejection sampling): target p = softmax(fused / T), proposal
  q = softmax(proposal / T); accept iff u_i * q(d_i) < p(d_i); on reject emit a sample of
  max(0, p - q) (normalised); bonus = a sample of p at row K. At T = 0 it is greedy.
  cda and greedy are deterministic: temperature only matters for exact.

Numerics that the kernel reproduces bit for bit where it matters (argmax ties):
- fused scores are computed from raw logits as v + beta * D with D = a - b: it differs from the
  log-prob form by a per-row constant (log-sum-exps), which changes neither argmax nor softmax,
  needs no normalisation first (the kernel finds the argmax in its first sweep) and rounds the
  same way in both implementations. On masked tokens D = lse(a) - lse(b), the constant that
  makes the log-prob delta 0.
- sampling uses one uniform per draft and ONE exponential vector per sequence ([B, V]), since
  only one position per sequence ever emits a sampled token: token = argmax_v w[v] / E[v]
  (the exponential race: distributed as w / sum(w)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch

GeneratorArg = Union[None, torch.Generator, Sequence[torch.Generator]]
ACCEPTANCE_RULES = ("cda", "greedy", "exact")
LN2 = math.log(2.0)
LOG_FLOOR = -1.0e30  # stands in for log 0 where a finite value keeps 0 * log 0 = 0 NaN-free


@dataclass
class GateResult:
    """What one gate call decides for each sequence of the batch."""

    num_accepted: torch.Tensor  # [B] int64, drafts accepted before the first reject (0..K)
    next_token: torch.Tensor  # [B] int64, fused/residual token at the stop position or bonus
    jsd: torch.Tensor  # [B, K+1] float32, JSD(p_a || p_b) per position, natural log


@dataclass
class GateNoise:
    """Random numbers consumed by acceptance="exact" at temperature > 0 (kernel and reference)."""

    uniform: torch.Tensor  # [B, K] float32 in [0, 1): one acceptance draw per draft
    exponential: torch.Tensor  # [B, V] float32 > 0: Exp(1) race for the one sampled token


def draw_gate_noise(batch: int, k: int, vocab: int, *, device: torch.device | str = "cpu",
                    generator: GeneratorArg = None) -> GateNoise:
    """Draw the uniforms and exponentials of one round; `generator` may be one per row."""
    device = torch.device(device)
    gens = list(generator) if isinstance(generator, (list, tuple)) else None
    if gens is not None and len(gens) != batch:
        raise ValueError(f"got {len(gens)} generators for a batch of {batch} rows")
    if gens is None:
        gen = generator
        gdev = gen.device if gen is not None else device
        uniform = torch.rand((batch, k), generator=gen, device=gdev)  # [B, K]
        expo = torch.empty((batch, vocab), device=gdev).exponential_(generator=gen)  # [B, V]
    else:
        uniform = torch.stack([torch.rand((k,), generator=g, device=g.device).to(device)
                               for g in gens])
        expo = torch.stack([torch.empty((vocab,), device=g.device).exponential_(generator=g)
                            .to(device) for g in gens])
    # Exp(1) is 0 with probability 0 but float sampling can round to it; keep the race finite.
    expo = expo.clamp_min_(torch.finfo(torch.float32).tiny)
    return GateNoise(uniform=uniform.to(device), exponential=expo.to(device))


def gate_views(verifier_logits, drafter_logits, base_logits):
    """(v, a, b) with the optional rows filled in: no base rows -> a; no drafter rows -> v.

    Returns a fourth item, True when the call has one drafter view (delta and JSD are 0)."""
    if drafter_logits is None and base_logits is not None:
        raise ValueError("base_logits needs drafter_logits (pass both, or base_logits=None)")
    a = verifier_logits if drafter_logits is None else drafter_logits
    return verifier_logits, a, a if base_logits is None else base_logits, base_logits is None


def validate_gate_inputs(verifier_logits, drafter_logits, base_logits, draft_tokens, *, beta,
                         gamma, acceptance, temperature, proposal_logits,
                         jsd_min: float = 0.0) -> tuple[int, int, int]:
    """Check shapes, dtypes and parameters; return (B, K, V). Raises ValueError.

    `drafter_logits` and `base_logits` may be None (see `gate_views`)."""
    verifier_logits, drafter_logits, base_logits, _ = gate_views(verifier_logits, drafter_logits,
                                                                 base_logits)
    for name, t in (("verifier_logits", verifier_logits), ("drafter_logits", drafter_logits),
                    ("base_logits", base_logits)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a [B, K+1, V] tensor, got "
                             f"{getattr(t, 'shape', type(t))}")
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    shape = verifier_logits.shape
    if drafter_logits.shape != shape or base_logits.shape != shape:
        raise ValueError(f"logit shapes differ: verifier {tuple(shape)}, drafter "
                         f"{tuple(drafter_logits.shape)}, base {tuple(base_logits.shape)}")
    batch, kp1, vocab = shape
    if kp1 < 1 or vocab < 1 or batch < 1:
        raise ValueError(f"logits must have B >= 1, K+1 >= 1 and V >= 1, got {tuple(shape)}")
    if not isinstance(draft_tokens, torch.Tensor) or tuple(draft_tokens.shape) != (batch, kp1 - 1):
        raise ValueError(f"draft_tokens must be [B, K] = [{batch}, {kp1 - 1}], got "
                         f"{getattr(draft_tokens, 'shape', type(draft_tokens))}")
    if draft_tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if draft_tokens.device.type == "cpu" and draft_tokens.numel() > 0:  # no sync on CPU
        low, high = int(draft_tokens.min()), int(draft_tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"draft_tokens must be in [0, {vocab}), got [{low}, {high}]")
    devices = {t.device for t in (verifier_logits, drafter_logits, base_logits, draft_tokens)}
    if proposal_logits is not None:
        if tuple(proposal_logits.shape) != (batch, kp1 - 1, vocab):
            raise ValueError(f"proposal_logits must be [B, K, V] = [{batch}, {kp1 - 1}, {vocab}],"
                             f" got {tuple(proposal_logits.shape)}")
        devices.add(proposal_logits.device)
    if len(devices) != 1:
        raise ValueError(f"all gate tensors must be on one device, got {sorted(map(str, devices))}")
    if acceptance not in ACCEPTANCE_RULES:
        raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}, got {acceptance!r}")
    if not (0.0 < float(gamma) <= 1.0) and acceptance == "cda":
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    if not math.isfinite(float(beta)) or float(beta) < 0:
        raise ValueError(f"beta must be finite and >= 0, got {beta!r}")
    if not math.isfinite(float(jsd_min)) or float(jsd_min) < 0:
        raise ValueError(f"jsd_min must be finite and >= 0, got {jsd_min!r}")
    if not math.isfinite(float(temperature)) or float(temperature) < 0:
        raise ValueError(f"temperature must be finite and >= 0, got {temperature!r}")
    return batch, kp1 - 1, vocab


def _log_softmax_lse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (log-probs, row logsumexp [.., 1]) of x [B, R, V]; -inf entries stay -inf."""
    log_probs = torch.log_softmax(x, dim=-1)  # [B, R, V] one fused pass
    # at the row's argmax log p = max - lse, so lse needs no second exp pass (and no sync)
    lse = x.amax(dim=-1, keepdim=True) - log_probs.amax(dim=-1, keepdim=True)  # [B, R, 1]
    return log_probs, lse


def jsd_from_log_probs(la: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
    """JSD(p_a || p_b) in nats over the last dim; 0 * log 0 counts as 0. [..., V] -> [...].

    JSD = 1/2 sum p_a (log p_a - log m) + 1/2 sum p_b (log p_b - log m), m = (p_a + p_b) / 2.
    """
    la = la.clamp_min(LOG_FLOOR)  # p = 0 (log p = -inf) -> a finite floor: 0 * log 0 -> 0
    lb = lb.clamp_min(LOG_FLOOR)
    pa, pb = la.exp(), lb.exp()  # [..., V]
    log_m = (pa + pb).log().clamp_min(LOG_FLOOR) - LN2  # [..., V] log of the mixture
    kl_a = torch.linalg.vecdot(pa, la - log_m)  # [...] KL(p_a || m)
    kl_b = torch.linalg.vecdot(pb, lb - log_m)  # [...] KL(p_b || m)
    return (0.5 * (kl_a + kl_b)).clamp(0.0, LN2)


def gated_beta(jsd: torch.Tensor, beta_rows: torch.Tensor, jsd_min: float) -> torch.Tensor:
    """The divergence gate: beta where JSD(p_a || p_b) >= jsd_min, else 0. jsd [..., R] -> [..., R].

    `beta_rows` [R] (or broadcastable to jsd) is each position's beta before the gate. The one
    definition of the gated delta's weight: the gate, its kernel and `asymagent eval fusion`."""
    beta_rows = beta_rows.expand_as(jsd)  # [..., R]
    if not jsd_min:  # plain delta-fusion, bit for bit
        return beta_rows
    return torch.where(jsd >= float(jsd_min), beta_rows, torch.zeros_like(beta_rows))


def fused_scores(v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta_rows: torch.Tensor,
                 lse_a: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Fused target up to a per-row constant: v + beta * D (see module docstring). [B, R, V].

    `beta_rows` is [R] (one beta per position) or [B, R] (per row: the divergence gate); the
    logits may also be [R, V] with beta_rows [R] and lse [R, 1]."""
    joint = (a > -math.inf) & (b > -math.inf)  # [B, R, V] both drafter views allow the token
    masked_delta = lse_a - lse_b  # [B, R, 1] makes log p_a - log p_b = 0 on masked tokens
    delta = torch.where(joint, a - b, masked_delta)  # [B, R, V]
    scaled = delta * beta_rows[..., None]  # separate multiply: no FMA, kernel-identical
    return v + scaled


def fused_gate_reference(verifier_logits: torch.Tensor, drafter_logits: torch.Tensor | None,
                         base_logits: torch.Tensor | None, draft_tokens: torch.Tensor, *, beta: float,
                         gamma: float, acceptance: str = "cda", temperature: float = 0.0,
                         generator: GeneratorArg = None,
                         proposal_logits: torch.Tensor | None = None, fuse_bonus: bool = True,
                         noise: GateNoise | None = None, jsd_min: float = 0.0) -> GateResult:
    """The gate of docs/architecture.md §3 in eager torch (see the module docstring for the definition).

    Logits are [B, K+1, V] (fp32/fp16/bf16, computed in fp32), draft_tokens [B, K] int64;
    `base_logits=None` means one drafter view, `drafter_logits=None` no drafter rows (spec).
    `noise` replaces the draws from `generator` (used to compare the kernel bit for bit).
    `jsd_min` > 0: the delta only where JSD(p_a || p_b) >= jsd_min (`gated_beta`).
    """
    batch, k, vocab = validate_gate_inputs(
        verifier_logits, drafter_logits, base_logits, draft_tokens, beta=beta, gamma=gamma,
        acceptance=acceptance, temperature=temperature, proposal_logits=proposal_logits,
        jsd_min=jsd_min)
    verifier_logits, drafter_logits, base_logits, one_view = gate_views(
        verifier_logits, drafter_logits, base_logits)
    device = verifier_logits.device
    v = verifier_logits.float()  # [B, K+1, V]
    a = drafter_logits.float()  # [B, K+1, V]
    b = base_logits.float()  # [B, K+1, V]
    drafts = draft_tokens.long()  # [B, K]

    if one_view:
        # one drafter view (mode spec, or no compression): JSD = 0 and delta = 0 exactly
        lb = None
        jsd = torch.zeros((batch, k + 1), dtype=torch.float32, device=device)  # [B, K+1]
        fused = v  # [B, K+1, V]
    else:
        la, lse_a = _log_softmax_lse(a)  # [B, K+1, V], [B, K+1, 1]
        lb, lse_b = _log_softmax_lse(b)
        jsd = jsd_from_log_probs(la, lb)  # [B, K+1]
        beta_rows = torch.full((k + 1,), float(beta), dtype=torch.float32, device=device)
        if not fuse_bonus:
            beta_rows[k] = 0.0  # [K+1]
        beta_rows = gated_beta(jsd, beta_rows, jsd_min)  # [B, K+1]
        fused = fused_scores(v, a, b, beta_rows, lse_a, lse_b)  # [B, K+1, V]

    sampling = acceptance == "exact" and float(temperature) > 0.0
    if not sampling:
        fused_argmax = fused.argmax(dim=-1)  # [B, K+1], first index on ties
    if acceptance == "cda":
        lv = torch.log_softmax(v[:, :k], dim=-1)  # [B, K, V] (row K is not needed)
        lv_d = lv.gather(-1, drafts[..., None]).squeeze(-1)  # [B, K] log p_v(d)
        lb_k = lb[:, :k] if lb is not None else torch.log_softmax(b[:, :k], dim=-1)  # [B, K, V]
        lb_d = lb_k.gather(-1, drafts[..., None]).squeeze(-1)  # [B, K] log p_b(d)
        accept = lv_d > (math.log(gamma) - jsd[:, :k]) + lb_d  # [B, K] p_v > gamma_eff * p_b
        candidates = fused_argmax  # [B, K+1]
    elif not sampling:  # greedy, or exact at temperature 0
        accept = drafts == fused_argmax[:, :k]  # [B, K]
        candidates = fused_argmax
    else:
        if noise is None:
            noise = draw_gate_noise(batch, k, vocab, device=device, generator=generator)
        temp = float(temperature)
        proposal = (a[:, :k] if proposal_logits is None else proposal_logits.float())  # [B, K, V]
        log_p = torch.log_softmax(fused / temp, dim=-1)  # [B, K+1, V] target
        log_q = torch.log_softmax(proposal / temp, dim=-1)  # [B, K, V] proposal
        lp_d = log_p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
        lq_d = log_q.gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
        accept = noise.uniform.log() + lq_d < lp_d  # [B, K]  u * q(d) < p(d)
        expo = noise.exponential[:, None, :]  # [B, 1, V]
        p = log_p.exp()  # [B, K+1, V]
        residual = (p[:, :k] - log_q.exp()).clamp_min(0.0)  # [B, K, V] max(0, p - q)
        residual_token = (residual / expo).argmax(-1)  # [B, K]
        target_token = (p / expo).argmax(-1)  # [B, K+1] fallback when p == q, and the bonus
        no_residual = residual.amax(-1) <= 0.0  # [B, K]
        residual_token = torch.where(no_residual, target_token[:, :k], residual_token)
        candidates = torch.cat([residual_token, target_token[:, k:]], dim=1)  # [B, K+1]

    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B] length of the accepted prefix
    next_token = candidates.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    return GateResult(num_accepted=num_accepted, next_token=next_token, jsd=jsd)
