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
