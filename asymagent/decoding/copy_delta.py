"""Copy delta: what the full view could copy at a position that the compressed view cannot.

Delta-fusion adds beta (log a - log b) to the compressed-view verifier's row, where a and b are
the drafter on the full and on the compressed view. A small drafter barely reacts to what
compression removed (its two views differ by a JSD of ~0.004 on the suites; docs/drafter.md).
Most of what the verifier loses under compression is literal text that agent turns copy: ids,
paths, field values from the middle of a long tool output. This module measures that directly
on the two token arrays, like suffix drafting does (asymagent/decoding/suffix_match.py):

- the *match* is the longest suffix of the full view (length 2..max_len) that occurred earlier in
  it with a continuation; c_F(x) counts the tokens x that followed its earlier occurrences;
- c_C(x) counts the same in the compressed view, for the same suffix;
- the copy delta is log((1 + c_F(x)) / (1 + c_C(x))) on the tokens with c_F(x) > c_C(x), 0
  elsewhere: positive exactly on continuations that only the removed text holds.

Two rules say when it applies (`RULES`, SpecConfig.copy_rule):
- "removed" (the default before 2026-12-05): whenever the full view has such continuations;
- "unseen" (SpecConfig's default): only where the compressed view holds no occurrence of the
  match at all (c_C empty).
  Where it holds some, the verifier already reads a copy source for this suffix and picks among
  its continuations; a removed-only alternative boosted by weight x log 2 (4 nats at weight 6)
  can override that pick. "unseen" leaves the delta to positions where the verifier is blind.

The gate adds `copy_weight` x this delta to the fused row (`fuse(..., copy=...)`): with no
compression the two views are equal and the delta is 0, so every lossless property of the
engine is untouched; with compression it moves the compressed verifier toward what the full view
would copy. Measured in `asymagent eval fusion` (variants `copy=W`, docs/evals.md).
"""

from __future__ import annotations

import numpy as np

from asymagent.spec_config import COPY_RULES as RULES


def _match_sets(arr: np.ndarray, suffix: np.ndarray, max_len: int) -> list:
    """[positions j (suffix of length L ends at j, j + 1 < len(arr)) for L = 1..]: shrinking sets."""
    n = len(arr)
    if n < 2 or len(suffix) == 0:
        return []
    cand = np.nonzero(arr[: n - 1] == suffix[-1])[0]  # ends of length-1 matches with a next token
    out = [cand]
    for length in range(2, min(max_len, len(suffix)) + 1):
        cand = cand[cand >= length - 1]
        cand = cand[arr[cand - (length - 1)] == suffix[-length]]
        if cand.size == 0:
            break
        out.append(cand)
    return out


def copy_counts(full: np.ndarray, compressed: np.ndarray, *, min_len: int = 2,
                max_len: int = 32) -> tuple[dict, dict, int]:
    """(c_F, c_C, L): continuation counts of the full view's longest repeated suffix of length
    L >= min_len in both views ({} and 0 when the full view has none)."""
    full = np.asarray(full, dtype=np.int64)
    compressed = np.asarray(compressed, dtype=np.int64)
    sets_f = _match_sets(full, full, max_len)
    if len(sets_f) < min_len:
        return {}, {}, 0
    length = len(sets_f)
    ends_f = sets_f[-1]
    suffix = full[len(full) - length:]
    sets_c = _match_sets(compressed, suffix, length)
    ends_c = sets_c[length - 1] if len(sets_c) >= length else np.zeros(0, dtype=np.int64)
    count = lambda arr, ends: dict(zip(*np.unique(arr[ends + 1], return_counts=True)))  # noqa: E731
    return count(full, ends_f), count(compressed, ends_c), length


def copy_delta_entries(full, compressed, *, rule: str = "removed", **kw) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, delta values): log((1 + c_F) / (1 + c_C)) where c_F > c_C (float32); under
    rule "unseen" nothing where the compressed view holds the match too (module docstring)."""
    if rule not in RULES:
        raise ValueError(f"copy delta rule must be one of {RULES}, got {rule!r}")
    c_f, c_c, _ = copy_counts(full, compressed, **kw)
    ids, vals = [], []
    if rule == "unseen" and c_c:
        return np.asarray(ids, dtype=np.int64), np.asarray(vals, dtype=np.float32)
    for tok, cf in c_f.items():
        cc = c_c.get(tok, 0)
        if cf > cc:
            ids.append(int(tok))
            vals.append(np.log((1.0 + cf) / (1.0 + cc)))
    return np.asarray(ids, dtype=np.int64), np.asarray(vals, dtype=np.float32)


def copy_delta_rows(full_prefix, compressed_prefix, tokens, vocab_size: int, **kw):
    """Dense delta rows [T, V] (torch float32) for predicting tokens[i] after prefix + tokens[:i]."""
    import torch

    full_prefix, compressed_prefix = list(full_prefix), list(compressed_prefix)
    rows = torch.zeros(len(tokens), vocab_size)
    for i in range(len(tokens)):
        ids, vals = copy_delta_entries(np.asarray(full_prefix + list(tokens[:i])),
                                       np.asarray(compressed_prefix + list(tokens[:i])), **kw)
        keep = ids < vocab_size
        if keep.any():
            rows[i, torch.from_numpy(ids[keep])] = torch.from_numpy(vals[keep])
    return rows  # [T, V]


class CopyDelta:
    """The copy delta of one request's two views, added to the verifier's rows by the Decoder.

    `full` and `compressed` are the request's Views (their `generated` list is shared, so they
    grow together); rows are computed for the K+1 positions of a round from the views plus the
    round's drafts. `weight` is SpecConfig.copy_weight.
    """

    def __init__(self, full, compressed, weight: float, *, min_len: int = 2, max_len: int = 32,
                 rule: str = "removed") -> None:
        self.full, self.compressed, self.weight = full, compressed, float(weight)
        self.options = dict(min_len=min_len, max_len=max_len, rule=rule)
        self._prompts = (np.asarray(full.prompt, dtype=np.int64), np.asarray(compressed.prompt, dtype=np.int64))

    def rows(self, drafts: list, like):
        """weight x delta rows [len(drafts) + 1, V] on `like`'s device (row j: after drafts[:j])."""
        import torch

        rows = torch.zeros(len(drafts) + 1, like.shape[-1], dtype=like.dtype)
        generated = list(self.full.generated)
        for j in range(len(drafts) + 1):
            tail = np.asarray(generated + list(drafts[:j]), dtype=np.int64)
            ids, vals = copy_delta_entries(np.concatenate([self._prompts[0], tail]),
                                           np.concatenate([self._prompts[1], tail]), **self.options)
            keep = ids < like.shape[-1]
            if keep.any():
                rows[j, torch.from_numpy(ids[keep])] = torch.from_numpy(self.weight * vals[keep]).to(like.dtype)
        return rows.to(like.device)  # [K+1, V]


def copy_sources(full, compressed, *, min_len: int = 3, max_len: int = 32) -> tuple[np.ndarray, set]:
    """(positions, tokens): where the full view's longest repeated suffix (length >= min_len) is
    followed by a continuation x with c_F(x) > c_C(x) (text only the removed part holds), the
    positions j + 1 of `full` holding such an x, and the set of those x; empty when none."""
    full = np.asarray(full, dtype=np.int64)
    compressed = np.asarray(compressed, dtype=np.int64)
    c_f, c_c, length = copy_counts(full, compressed, min_len=min_len, max_len=max_len)
    missing = {int(t) for t, n in c_f.items() if n > c_c.get(t, 0)}
    if not missing:
        return np.zeros(0, dtype=np.int64), missing
    ends = _match_sets(full, full[len(full) - length:], length)[length - 1]
    nxt = ends + 1
    return nxt[np.isin(full[nxt], list(missing))], missing


def copy_sources_any_length(full, compressed, *, min_len: int = 3, max_len: int = 32) -> tuple[np.ndarray, set]:
    """`copy_sources` at the longest repeated suffix length L (max_len down to min_len) at which
    some continuation is more frequent in the full view than in the compressed (c_F > c_C): the
    longest match often ends in text both views hold (an earlier call), while a slightly shorter
    one reaches the rows the compressed view removed."""
    full = np.asarray(full, dtype=np.int64)
    compressed = np.asarray(compressed, dtype=np.int64)
    sets_f = _match_sets(full, full, max_len)
    for length in range(len(sets_f), min_len - 1, -1):
        ends_f = sets_f[length - 1]
        sets_c = _match_sets(compressed, full[len(full) - length:], length)
        ends_c = sets_c[length - 1] if len(sets_c) >= length else np.zeros(0, dtype=np.int64)
        c_f = dict(zip(*np.unique(full[ends_f + 1], return_counts=True)))
        c_c = dict(zip(*np.unique(compressed[ends_c + 1], return_counts=True)))
        missing = {int(t) for t, n in c_f.items() if n > c_c.get(t, 0)}
        if missing:
            nxt = ends_f + 1
            return nxt[np.isin(full[nxt], list(missing))], missing
    return np.zeros(0, dtype=np.int64), set()


def recall_sources(full, compressed, emitted: int, *, min_len: int = 3, max_len: int = 32) -> np.ndarray:
    """Evidence for a recall at one position: where in `full` the copy the verifier missed comes from.

    With the full view's longest repeated suffix (length >= min_len), the tokens x with
    c_F(x) > c_C(x) are continuations only the removed text holds. When the token the verifier
    emitted is not one of them (it does not agree with the copy), returns the positions j + 1 of
    `full` where such an x follows an occurrence of the suffix (the spans to bring back);
    otherwise, or without such an x, an empty array.
    """
    src, missing = copy_sources(full, compressed, min_len=min_len, max_len=max_len)
    if not missing or int(emitted) in missing:
        return np.zeros(0, dtype=np.int64)
    return src


def first_recall(full_prompt, compressed_prompt, tokens, *, min_len: int = 3,
                 max_len: int = 32) -> tuple[int, np.ndarray] | None:
    """(position t in `tokens`, recall_sources there) at the first output position where the full
    view's copy evidence disagrees with the emitted token; None when it never does."""
    full_prompt, compressed_prompt = list(full_prompt), list(compressed_prompt)
    for t in range(len(tokens)):
        src = recall_sources(full_prompt + list(tokens[:t]), compressed_prompt + list(tokens[:t]),
                             tokens[t], min_len=min_len, max_len=max_len)
        if src.size:
            return t, src
    return None
