"""The copy delta (asymagent/decoding/copy_delta.py): counts against a slow reference, zero without compression."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from asymagent.decoding.copy_delta import copy_counts, copy_delta_entries, copy_delta_rows


def slow_counts(full: list, compressed: list, min_len: int = 2, max_len: int = 32):
    """Reference: try every suffix length from the longest down, count by plain list slicing."""
    def occurrences(arr, suffix):
        n, m = len(arr), len(suffix)
        return [arr[j + 1] for j in range(m - 1, n - 1) if arr[j - m + 1: j + 1] == suffix]

    for length in range(min(max_len, len(full) - 1), min_len - 1, -1):
        suffix = full[len(full) - length:]
        found = occurrences(full, suffix)
        if found:
            return dict(Counter(found)), dict(Counter(occurrences(compressed, suffix))), length
    return {}, {}, 0


def test_counts_equal_the_slow_reference_on_random_arrays():
    rng = random.Random(0)
    checked_nonempty = 0
    for _ in range(300):
        vocab = rng.choice([3, 5, 12])
        full = [rng.randrange(vocab) for _ in range(rng.randrange(2, 60))]
        cut = sorted(rng.sample(range(len(full) + 1), 2))
        compressed = full[: cut[0]] + full[cut[1]:]  # the middle removed, like a tool-output cut
        c_f, c_c, length = copy_counts(full, compressed, max_len=8)
        ref = slow_counts(full, compressed, max_len=8)
        assert ({int(k): int(v) for k, v in c_f.items()}, {int(k): int(v) for k, v in c_c.items()},
                length) == ref
        checked_nonempty += bool(c_f)
    assert checked_nonempty > 100  # the random arrays do exercise matches


def test_delta_is_positive_only_on_what_the_removed_text_holds():
    full = [5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 10, 1, 2]
    compressed = [5, 6, 7, 8, 9, 1, 2]  # "1 2 -> 3" was only in the removed middle
    ids, vals = copy_delta_entries(full, compressed)
    assert ids.tolist() == [3] and math.isclose(float(vals[0]), math.log(2.0), rel_tol=1e-6)
    # a continuation both views hold is not boosted
    ids, _ = copy_delta_entries(full[:-1], compressed[:-1])  # suffix "1": next 2 in both views
    assert ids.tolist() == []


def test_unseen_rule_boosts_only_where_the_compressed_view_has_no_copy_source():
    # the match "1 2" is followed by 3 in the removed middle and by 4 in text both views hold
    full = [1, 2, 3, 9, 9, 1, 2, 4, 8, 1, 2]
    compressed = [9, 9, 1, 2, 4, 8, 1, 2]
    ids, _ = copy_delta_entries(full, compressed)  # "removed": 3 is boosted over the visible 4
    assert ids.tolist() == [3]
    ids, _ = copy_delta_entries(full, compressed, rule="unseen")  # the verifier reads 1 2 -> 4 itself
    assert ids.tolist() == []
    # nowhere in the compressed view: both rules boost the removed continuation alike
    blind = [9, 9, 8, 1, 2]
    for rule in ("removed", "unseen"):
        ids, vals = copy_delta_entries(full, blind, rule=rule)
        assert sorted(ids.tolist()) == [3, 4] and np.allclose(vals, math.log(2.0))
    with pytest.raises(ValueError, match="rule"):
        copy_delta_entries(full, compressed, rule="sometimes")


def test_no_compression_no_delta():
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 20, size=300).tolist()
    tokens = rng.integers(0, 20, size=12).tolist()
    rows = copy_delta_rows(prefix, prefix, tokens, vocab_size=20)
    assert rows.shape == (12, 20) and torch.count_nonzero(rows) == 0


def test_recall_sources_point_at_the_removed_copy_the_verifier_missed():
    from asymagent.decoding.copy_delta import first_recall, recall_sources

    # full: ... 5 6 7 8 ... 5 6 7 | compressed lost the "5 6 7 8" occurrence
    full = [1, 2, 5, 6, 7, 8, 3, 4, 9, 5, 6, 7]
    comp = [1, 2, 3, 4, 9, 5, 6, 7]
    src = recall_sources(full, comp, emitted=4)
    assert list(src) == [5]  # token 8 follows the suffix 5 6 7 at full position 5
    assert recall_sources(full, comp, emitted=8).size == 0  # the verifier agrees with the copy
    assert recall_sources(full, full, emitted=4).size == 0  # no compression, no evidence
    # first_recall walks the output: no evidence at position 0 (suffix 5 6 7 ... 9?), then at 3
    hit = first_recall(full[:-3], comp[:-3], [5, 6, 7, 4])
    assert hit is not None and hit[0] == 3 and list(hit[1]) == [5]
    assert first_recall(full[:-3], comp[:-3], [5, 6, 7, 8]) is None


def test_copy_sources_any_length_reaches_below_the_longest_match():
    from asymagent.decoding.copy_delta import copy_sources, copy_sources_any_length

    # the longest repeated suffix "9 5 6 7" occurs in kept text (both views, same continuation 1);
    # the shorter "5 6 7" also occurs in removed text, followed by 8
    full = [9, 5, 6, 7, 1, 2, 5, 6, 7, 8, 3, 9, 5, 6, 7]
    comp = [9, 5, 6, 7, 1, 2, 3, 9, 5, 6, 7]
    assert copy_sources(full, comp)[0].size == 0  # the longest match sees no difference
    src, missing = copy_sources_any_length(full, comp)
    assert list(src) == [9] and missing == {8}
    assert copy_sources_any_length(full, full)[0].size == 0  # no compression, no evidence
