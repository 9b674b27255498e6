"""Recall on evidence: bring back the removed text a step's output needed, and decode the step again.

After a step decodes on the compressed view, its output is checked against the full view's copy
evidence (asymagent/decoding/copy_delta.py `first_recall`): at the first output position where
the full view would copy a continuation that only its removed text holds (c_F > c_C) and the
emitted token is none of those, the tool outputs holding the copy sources are restored whole in
the conversation's views (`ContextViews.restore`, sticky, so later steps keep them and stay
append-stable), and the step is decoded again on the restored view (the verifier re-prefills
from the first restored message; its cache keeps everything before). At most
`CompressionConfig.max_recalls` times per step. The returned result's StepStats count the recalls
(`recalls`, `recall_prefill_tokens`) and sum the wall time, prefill tokens and FLOPs of every pass.
"""

from __future__ import annotations

from typing import Callable

from asymagent.decoding.copy_delta import first_recall

_SUMMED = ("wall_s", "prefill_s", "decode_s", "verifier_prefill_tokens", "drafter_prefill_tokens",
           "verifier_flops")


def recall_loop(views, full_ids: list, compressed_ids: list, result, decode: Callable, *,
                min_len: int = 3):
    """The step's final result after up to `views.config.max_recalls` recalls.

    `decode(compressed_ids)` decodes the step again on a new verifier view (same full view)."""
    for _ in range(views.config.max_recalls):
        hit = first_recall(full_ids, compressed_ids, result.token_ids, min_len=min_len)
        if hit is None or not views.restore([int(p) for p in hit[1] if p < len(full_ids)]):
            break
        compressed_ids = views.compressed_ids()
        before = result.stats
        result = decode(compressed_ids)
        s = result.stats
        s.recalls = before.recalls + 1
        s.recall_prefill_tokens = before.recall_prefill_tokens + s.verifier_prefill_tokens
        s.ttft_s += before.wall_s
        for name in _SUMMED:
            setattr(s, name, getattr(s, name) + getattr(before, name))
    return result
