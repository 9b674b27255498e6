"""SuffixDrafter: SuffixDecoding's drafts, from the request's full view and from previous responses.

Two indexes are asked each round (asymagent/decoding/suffix_match.py has the matching): the
request's own full view (prompt + what it generated so far; SuffixDecoding's per-request tree,
which subsumes prompt lookup) and the engine's `SuffixStore` of earlier responses (the global
tree). Each proposes its best-scoring path; the higher score wins. The draft length adapts to the
match: at most `factor * match_length` tokens, capped by the round's budget, and a path stops
where its estimated probability falls below `min_prob`. Proposals are one-hot (copied tokens),
so acceptance="exact" stays lossless, as with any drafter.

The drafter keeps the view as a numpy array and rewrites only the generated part per round
(the prompt is fixed for the request), so a proposal costs well under a millisecond at 5k tokens.
"""

from __future__ import annotations

import numpy as np

from asymagent.decoding.constraint import allowed_prefix
from asymagent.decoding.drafts import Drafts, RoundOutcome
from asymagent.decoding.suffix_match import SuffixDraft, speculate


class SuffixDrafter:
    """Suffix-matched drafts from the full view and a SuffixStore (one-hot proposals)."""

    name = "suffix"  # Drafts.source, and the key of its budget in Decoder.spec_round

    def __init__(self, view, store=None, constraint=None, *, factor: float = 1.0,
                 min_prob: float = 0.1, max_depth: int = 32, min_match: int = 2,
                 hint=()) -> None:
        self.view = view  # asymagent.kv.cache.View: the full view (prompt + generated)
        self.store = store  # asymagent.decoding.suffix_store.SuffixStore or None (no global index)
        # a third index: the response a drafter expects (GenerationRequest.draft_hint) after the
        # prompt's last tokens, so the first round matches it from the prompt's end: [depth + H]
        self.hint = np.asarray(list(view.prompt[-max_depth:]) + list(hint), dtype=np.int32) \
            if len(hint) else None
        self.constraint = constraint
        self.options = dict(factor=factor, min_prob=min_prob, max_depth=max_depth,
                            min_match=min_match)
        p = len(view.prompt)
        self._buf = np.empty(p + 64, dtype=np.int32)  # [capacity] prompt + generated
        self._buf[:p] = view.prompt
        self.last: SuffixDraft | None = None  # the latest proposal (for reports and tests)

    def _array(self) -> np.ndarray:
        """The full view as an int32 array [T] (the generated tail rewritten each call)."""
        p, gen = len(self.view.prompt), self.view.generated
        t = p + len(gen)
        if t > self._buf.shape[0]:
            grown = np.empty(max(t, 2 * self._buf.shape[0]), dtype=np.int32)
            grown[:p] = self._buf[:p]
            self._buf = grown
        self._buf[p:t] = gen
        return self._buf[:t]

    def draft(self, k: int) -> SuffixDraft:
        """The best path of at most `k` tokens from the view or the store (no constraint)."""
        arr = self._array()
        depth = self.options["max_depth"]
        best = speculate(arr, arr[-depth:], max_tokens=k, **self.options)
        if self.store is not None:
            other = self.store.speculate(arr[-depth:], max_tokens=k, **self.options)
            if other.score > best.score:
                best = other
        if self.hint is not None:
            other = speculate(self.hint, arr[-depth:], max_tokens=k, **self.options)
            if other.score > best.score:
                best = other
        return best

    def propose(self, k: int) -> Drafts:
        self.last = self.draft(k) if k > 0 else SuffixDraft()
        drafts, masks = allowed_prefix(self.constraint, self.last.tokens)
        return Drafts(tokens=drafts, source=self.name, masks=masks)

    def update(self, outcome: RoundOutcome) -> None:
        """Nothing to learn per round: the next proposal reads the grown view (and the store,
        which the engine feeds each finished response; asymagent/engine.py)."""
