"""The drafter interface: `propose(k) -> Drafts` and `update(outcome)`, and what a round reports.

Two methods, as transformers' candidate generators (`get_candidates`,
`update_candidate_strategy`): a drafter proposes up to k tokens continuing the full view, and
hears how the round went. Implementations: `ModelDrafter` (the small drafter model,
model_drafter.py), `SuffixDrafter` (SuffixDecoding: continuations matched in the full view and in
earlier responses, suffix_drafter.py) and `LookupDrafter` (prompt lookup, lookup_drafter.py). A drafter owns its view of the request (the full view, the constraint, the
sampler); the round owns the caches it feeds and crops them (round.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Drafts:
    """Proposed tokens d_1..d_K and what the round needs to verify them.

    `proposal` is the distribution each draft was drawn from, as logits over the drafter's draft
    vocabulary ([K, N]; the model drafter), or None for a deterministic proposal ("one-hot": the
    draft has probability 1, as for copied continuations). `masks` are the constraint's K+1
    allowed-token masks (None without a constraint), read while drafting and already rolled back.
    `hidden` is the drafter's full-view hidden state at the K+1 positions when drafting produced
    it ([K+1, H]), so that delta-fusion needs no second drafter forward; None otherwise.
    """

    tokens: list  # list[int], d_1..d_K (empty: nothing to propose)
    source: str  # "model" | "suffix" | "lookup": counted per round in StepStats.draft_source
    proposal: torch.Tensor | None = None  # [K, N] logits, or None = one-hot
    masks: list | None = None  # K+1 x ([V'] bool | None), or None without a constraint
    hidden: torch.Tensor | None = None  # [K+1, H] drafter hidden states on the full view
    # seconds of the proposal spent on a deferred prefill (RequestPlan.defer_drafter): not part
    # of what drafting costs per round, so the round's draft_s leaves it out
    setup_s: float = 0.0

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class RoundOutcome:
    """What one decode step did: tokens it emitted and, for a speculative round, its gate verdict."""

    tokens: list  # list[int]: accepted drafts + recovered/bonus token (or the one plain token)
    drafted: int = 0  # K actually drafted (0 for a plain step)
    accepted: int = 0  # n, drafts accepted
    jsd: float = 0.0  # mean JSD(p_aug || p_base) over the positions the gate used (asym)
    draft_s: float = 0.0  # time drafting (drafter forwards + sampling)
    verify_s: float = 0.0  # time verifying (verifier + base forwards + gate)
    source: str = ""  # Drafts.source of a speculative round; "" for a plain step

    @property
    def lookup(self) -> bool:
        """The drafts were copied (prompt lookup or suffix matching), not drafted by the model."""
        return self.source in ("lookup", "suffix")


class Drafter(Protocol):
    name: str  # "model" | "suffix" | "lookup": Drafts.source and the key of its draft budget

    def propose(self, k: int) -> Drafts:
        """Up to `k` tokens continuing the current full view (fewer, or none, when unsure)."""

    def update(self, outcome: RoundOutcome) -> None:
        """The round's verdict on this drafter's proposal (for drafters that learn from it)."""
