"""LookupDrafter: prompt-lookup drafts, continuing the full view's last n-gram from its latest earlier occurrence.

Agent turns copy a lot from their own history (ids, file names, field values out of tool
outputs, the JSON scaffolding of earlier calls). When the last `n` tokens of the full view occur
earlier in it, the tokens that followed that occurrence are a free draft: no drafter forward is
needed to propose them (Saxena's prompt lookup decoding; `prompt_lookup_num_tokens` in
transformers). The engine tries this before the drafter each round (`SpecConfig.lookup_ngram`);
the verifier and the gate treat the proposal like any other draft, with a one-hot proposal
distribution, so acceptance="exact" stays lossless.
"""

from __future__ import annotations

import numpy as np

from asymagent.decoding.constraint import allowed_prefix
from asymagent.decoding.drafts import Drafts, RoundOutcome


def lookup_continuation(ids: list, max_ngram: int, k: int, min_ngram: int = 2) -> list:
    """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix n-gram.

    Tries n = max_ngram down to min_ngram; the first n with a match wins and its most recent
    occurrence (the closest context) is used. Returns [] when nothing matches.
    """
    if max_ngram < 1 or k < 1 or min_ngram < 1:
        raise ValueError(f"need max_ngram >= 1, k >= 1, min_ngram >= 1; got {max_ngram}, {k}, {min_ngram}")
    n_ids = len(ids)
    arr = np.asarray(ids, dtype=np.int64)  # [T]
    for n in range(min(max_ngram, n_ids - 1), min(min_ngram, max_ngram) - 1, -1):
        tail = arr[n_ids - n:]  # [n] the suffix to find
        # starts i < T - n, so that at least one token follows the occurrence
        starts = np.flatnonzero(arr[: n_ids - n] == tail[0])
        for j in range(1, n):
            starts = starts[arr[starts + j] == tail[j]]
        if starts.size:
            i = int(starts[-1]) + n
            return arr[i:i + k].tolist()
    return []


class LookupDrafter:
    """Drafts copied from the full view (one-hot proposals); walks them through the constraint."""

    name = "lookup"  # Drafts.source, and the key of its budget in Decoder.spec_round

    def __init__(self, view, ngram: int, constraint=None) -> None:
        self.view = view  # asymagent.kv.cache.View: the full view (prompt + generated)
        self.ngram = ngram  # longest suffix n-gram tried (SpecConfig.lookup_ngram)
        self.constraint = constraint

    def propose(self, k: int) -> Drafts:
        found = lookup_continuation(self.view.ids(), self.ngram, k) if k > 0 else []
        drafts, masks = allowed_prefix(self.constraint, found)
        return Drafts(tokens=drafts, source=self.name, masks=masks)

    def update(self, outcome: RoundOutcome) -> None:
        """Nothing to learn: the next proposal is read from the (grown) view itself."""
