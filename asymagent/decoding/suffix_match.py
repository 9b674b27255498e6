"""Suffix matching: the frequency-scored continuation of a context inside a token array (SuffixDecoding).

SuffixDecoding (Oliaro et al., NeurIPS 2025; arctic-inference's `SuffixTree`, vLLM's
`method="suffix"`) keeps a suffix tree over earlier tokens: the node reached by the last m tokens
of the context (the *match*) counts every earlier occurrence of them, and its children count what
followed. A draft walks from that node to the most frequent child while the running product of
child / parent counts (the *estimated probability* of the drafted prefix) stays above
`min_prob`, for at most `min(max_tokens, factor * m)` tokens; every match length m is tried and
the draft with the highest score (sum of the estimated probabilities) wins.

We compute the same numbers without materialising the tree: the occurrences of the last m
context tokens are an index set into the array (filtered one token further to the left per m),
and a node's children are the tokens at those positions + depth. numpy does each step in one
vectorised pass, so a draft over a 5k-token view costs well under a millisecond (a verifier
forward costs tens), and appending a token costs nothing (no tree to update). Arrays may hold
several sequences separated by `SEP` (-1): no match or continuation crosses a separator.

Counts follow the tree's convention for earlier sequences (a stored response that ends at a node
still counts in that node: a continuation seen once after a context seen twice has probability
1/2), but the query's own final occurrence is not counted (arctic-inference's per-request tree
holds it and so divides by one more). Ties between equally frequent children go to the most
recent occurrence (prompt lookup's choice).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SEP = -1  # separates sequences in one array; never a token id


@dataclass
class SuffixDraft:
    """A path-shaped draft: tokens, each with the estimated probability of the prefix up to it."""

    tokens: list = field(default_factory=list)  # list[int]
    probs: list = field(default_factory=list)  # list[float], non-increasing
    score: float = 0.0  # sum(probs): expected accepted tokens if the estimates were calibrated
    match_len: int = 0  # context tokens matched
    start: int = -1  # array position of the first draft token in the occurrence it followed


def _path(arr: np.ndarray, nxt: np.ndarray, budget: int, min_prob: float) -> SuffixDraft:
    """Walk from the node whose occurrences continue at positions `nxt` to the most frequent child."""
    out = SuffixDraft()
    n = arr.shape[0]
    pos = nxt  # [O] positions of the next token of each occurrence still on the path
    prob = 1.0
    while len(out.tokens) < budget:
        pos = pos[pos < n]
        if pos.size == 0:
            break
        vals = arr[pos]  # [O] children of the current node, SEP where a sequence ended
        if pos.size == 1:  # one occurrence left: its continuation is copied at probability `prob`
            p = int(pos[0])
            run = arr[p: p + budget - len(out.tokens)]
            ends = np.flatnonzero(run < 0)
            run = run[: ends[0]] if ends.size else run
            if out.start < 0 and run.size:
                out.start = p
            out.tokens.extend(run.tolist())
            out.probs.extend([prob] * run.size)
            break
        live = vals >= 0
        if not live.any():
            break
        uniq, inv, counts = np.unique(vals[live], return_inverse=True, return_counts=True)
        live_pos = pos[live]
        # most frequent child; ties to the one with the most recent occurrence
        best = int(np.lexsort((live_pos, counts[inv]))[-1])
        token = int(vals[live][best])
        prob *= float(counts[inv[best]]) / pos.size
        if prob < min_prob:
            break
        if out.start < 0:
            out.start = int(live_pos[best])
        out.tokens.append(token)
        out.probs.append(prob)
        pos = pos[vals == token] + 1
    out.score = float(sum(out.probs))
    return out


def speculate(arr: np.ndarray, context: np.ndarray, *, max_tokens: int, factor: float = 1.0,
              min_prob: float = 0.1, max_depth: int = 32, min_match: int = 1) -> SuffixDraft:
    """The best-scoring draft continuing `context` from occurrences inside `arr` (path-shaped).

    `arr` [T] int array (tokens >= 0, SEP between sequences); `context` [C] the query's tokens
    (for a per-request index, arr itself: the query's own final occurrence has no continuation
    and is never used). Match lengths `min_match..max_depth` are tried; a match of m tokens may
    draft up to `min(max_tokens, int(factor * m))` tokens.
    """
    best = SuffixDraft()
    ctx_len = min(int(context.shape[0]), max_depth)
    if ctx_len < max(min_match, 1) or max_tokens < 1 or arr.shape[0] < 2:
        return best
    ctx = context[-ctx_len:]  # [D]
    n = arr.shape[0]
    nxt = np.flatnonzero(arr[: n - 1] == ctx[-1]) + 1  # [O] continuation positions of 1-token matches
    m = 1
    while nxt.size:
        # extend the match one token to the left; a node whose occurrence set does not shrink
        # gives the same path with a larger budget, so only the last m of each set is scored
        grown = nxt
        if m < ctx_len:
            prev = nxt - m - 1
            ok = prev >= 0
            grown = nxt[ok][arr[prev[ok]] == ctx[-m - 1]]
        if m >= min_match and (grown.size != nxt.size or m >= ctx_len):
            budget = min(max_tokens, int(factor * m + 1e-6))
            draft = _path(arr, nxt, budget, min_prob)
            if draft.tokens and draft.score >= best.score:
                draft.match_len = m
                best = draft
        if m >= ctx_len:
            break
        nxt, m = grown, m + 1
    return best
