"""Sampling helpers of the decode loop: nucleus filter, Gumbel-max sampling, constraint masks on rows."""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def top_p_filter(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Set logits outside the nucleus of softmax(logits / T) to -inf. [..., V] -> [..., V]."""
    if top_p >= 1.0 or temperature <= 0.0:
        return logits
    probs = torch.softmax(logits / temperature, dim=-1)  # [..., V]
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token in sorted order
    drop_sorted = before >= top_p  # keep the smallest prefix whose mass reaches top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def perturb(logits: torch.Tensor, temperature: float, gumbel: torch.Tensor) -> torch.Tensor:
    """logits + T * g: argmax of it is a sample of softmax(logits / T) (Gumbel-max). [..., V].

    One expression for every sampled token (plain steps, the drafter, the coupled gate's rows),
    computed as a separate multiply and add, so equal inputs give bit-equal scores everywhere."""
    return logits + gumbel.to(logits.device) * temperature


def sample_token(logits: torch.Tensor, temperature: float, gumbel: torch.Tensor | None = None) -> int:
    """Greedy at temperature 0 (first index on ties), else argmax(logits + T * gumbel). [V].

    `gumbel` is the position's Gumbel noise (asymagent/decoding/noise.py), needed when T > 0."""
    if temperature <= 0.0:
        return int(logits.argmax())
    if gumbel is None:
        raise ValueError("sampling at temperature > 0 needs the position's Gumbel noise")
    return int(perturb(logits.float(), temperature, gumbel).argmax())


def apply_mask(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """logits [..., V] with disallowed tokens at -inf; `mask` [V'] bool is padded/cut to V."""
    if mask is None:
        return logits
    v = logits.shape[-1]
    mask = mask.to(device=logits.device, dtype=torch.bool)
    if mask.numel() < v:
        mask = torch.cat([mask, mask.new_zeros(v - mask.numel())])
    return logits.masked_fill(~mask[:v], NEG_INF)


def mask_rows(logits: torch.Tensor, masks: list | None) -> torch.Tensor:
    """One constraint mask per row: logits [R, V], masks R x ([V'] bool | None); None: unchanged."""
    if masks is None:
        return logits
    return torch.stack([apply_mask(row, m) for row, m in zip(logits, masks)])


def gather_mask(mask: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary mask [V'] -> draft-vocabulary mask [N] (ids past V' are disallowed)."""
    vocab = vocab.to(mask.device)
    inside = vocab < mask.numel()
    return torch.where(inside, mask[vocab.clamp_max(mask.numel() - 1)], torch.zeros_like(inside))
