"""TokenConstraint: the protocol the engine uses to constrain decoding (e.g. tool-call JSON).

The engine drives a constraint through speculation like this, per round:
  1. drafting d_1..d_K: before each draft step read `allowed_mask()`, mask the drafter logits,
     pick d_i, `advance(d_i)`; then read one more mask (position K+1);
  2. `rollback(K)`; the K+1 masks [K+1, V] are applied to verifier, drafter and base logits alike
     (disallowed -> -inf) before the gate, so violating drafts are rejected and the fused argmax
     respects the constraint;
  3. `advance` the accepted drafts and the emitted token.
Jump-forward: `forced_tokens()` lists tokens the constraint alone determines from the current
state; the engine emits them without a model forward and prefills them with the next forward.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class TokenConstraint(Protocol):
    def allowed_mask(self) -> torch.Tensor | None:
        """[V] bool, True where the next token is allowed; None means no restriction."""

    def advance(self, token_id: int) -> bool:
        """Consume one token; returns False (and does not move) if the token is not allowed."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` advances."""

    def forced_tokens(self) -> list[int]:
        """Tokens fully determined from the current state (jump-forward); may be empty."""

    def is_terminated(self) -> bool:
        """True when the constrained object is complete (the engine then stops)."""


def close_masks(constraint, masks: list, k: int) -> list:
    """After drafting k tokens under `constraint`: append the K+1-th mask, roll the k drafts back.

    Once the drafts complete the constraint, whatever the gate emits after them is dropped by the
    decode loop, so that row is left unrestricted (None). Returns `masks` (K+1 entries).
    """
    masks.append(None if constraint.is_terminated() else constraint.allowed_mask())
    constraint.rollback(k)
    return masks


def allowed_prefix(constraint, tokens: list) -> tuple[list, list | None]:
    """Copied drafts under `constraint`: the prefix it allows and its K+1 masks (rolled back).

    Returns (drafts, masks), masks None when nothing is left (or there is no constraint)."""
    if constraint is None or not tokens:
        return list(tokens), None
    drafts, masks = [], []
    for token in tokens:  # keep the prefix the constraint allows
        mask = constraint.allowed_mask()  # [V'] bool
        if token >= mask.numel() or not bool(mask[token]) or not constraint.advance(token):
            break
        drafts.append(token)
        masks.append(mask)
        if constraint.is_terminated():
            break
    if not drafts:
        return [], None
    return drafts, close_masks(constraint, masks, len(drafts))


def advance_constraint(constraint, tokens: list, jumped: bool) -> tuple[int, int, int]:
    """Advance `constraint` through `tokens` until it terminates: (tokens kept, forced among them,
    index of the last kept token that was not forced, -1 if none).

    A token counts as forced when the constraint alone determined it: jump-forwarded tokens, and
    round tokens that were the first of `forced_tokens()` at their position (drafted and accepted
    under the constraint's singleton mask): no model decision was needed for either. Which tokens
    are forced depends on the constraint's states only, not on the mode that emitted them: a
    one-token decode jump-forwards exactly these.
    """
    forced, free = 0, -1
    for j, t in enumerate(tokens):
        if constraint.is_terminated():  # complete mid-round: whatever follows is dropped
            return j, forced, free
        if jumped:
            forced += 1
        else:
            determined = constraint.forced_tokens()
            if bool(determined) and int(determined[0]) == t:
                forced += 1
            else:
                free = j
        if not constraint.advance(t):
            raise RuntimeError(f"decoded token {t} violates the constraint")
    return len(tokens), forced, free
