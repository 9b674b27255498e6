"""The copy delta in the engine (SpecConfig.copy_weight): mode asym decodes argmax(v_c + w * copy delta).

A slow reference decodes the same target one token at a time with the verifier alone on the
compressed view plus the copy delta of asymagent/decoding/copy_delta.py; the engine, with drafts,
rounds, copied drafts and adaptive K, must emit exactly its tokens (every token is the target's
argmax at its position, so drafts change speed only).
"""

from __future__ import annotations

import pytest
import torch

from asymagent import Engine, SpecConfig
from asymagent.decoding.copy_delta import copy_delta_entries
from test_engine_models import make_model, noisy_copy, random_prompts

SEGMENT = [40, 41, 42, 43, 44, 45, 46]  # text only the removed middle holds
SEEN = 3  # the prompt ends with SEGMENT[:3] (copy_min_len 3): the full view's repeated suffix


def views(seed: int = 0, visible: list | None = None) -> tuple[list, list]:
    """(full prompt, compressed prompt): the middle (which holds SEGMENT) is cut, and the prompt
    ends with SEGMENT's first SEEN tokens, so only the full view can copy what follows.
    `visible`: tokens both views hold before the tail (e.g. the match with another continuation)."""
    head, middle, tail = random_prompts(3, length=20, seed=seed)
    visible = visible or []
    full = head + middle[:8] + SEGMENT + middle[8:] + visible + tail + SEGMENT[:SEEN]
    compressed = head + visible + tail + SEGMENT[:SEEN]
    return full, compressed


def reference(verifier, full: list, compressed: list, weight: float, n: int, rule: str = "removed") -> list:
    out: list = []
    with torch.no_grad():
        for _ in range(n):
            logits = verifier(torch.tensor([compressed + out])).logits[0, -1].float()  # [V]
            ids, vals = copy_delta_entries(full + out, compressed + out, min_len=SpecConfig().copy_min_len,
                                           rule=rule)
            logits[torch.from_numpy(ids)] += weight * torch.from_numpy(vals)
            out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("beta,rule", [(0.0, "removed"), (1.0, "removed"), (0.0, "unseen")])
def test_asym_emits_the_copy_target_token_for_token(beta, rule):
    verifier = make_model(seed=0)
    drafter = noisy_copy(verifier, 0.5) if beta == 0.0 else verifier  # beta 1: a = b (delta 0)
    weight = 60.0  # random-model logits spread widely: a weight that does steer some tokens
    engine = Engine(verifier=verifier, drafter=drafter,
                    spec=SpecConfig(k=3, beta=beta, copy_weight=weight, copy_rule=rule))
    steered = ruled = 0
    # under "unseen", also views where both hold the match followed by another token (50): the
    # rule then withholds the delta the default rule adds, so the two rules' targets differ
    cases = [(seed, None) for seed in range(3)]
    if rule == "unseen":
        cases += [(seed, SEGMENT[:SEEN] + [50]) for seed in range(3)]
    for seed, visible in cases:
        full, compressed = views(seed, visible)
        want = reference(verifier, full, compressed, weight, 16, rule)
        steered += want != reference(verifier, full, compressed, 0.0, 16)
        ruled += want != reference(verifier, full, compressed, weight, 16, "removed")
        r = engine.generate(full, mode="asym", max_new_tokens=16, compressed_prompt_ids=compressed)
        assert r.token_ids == want
        assert r.stats.rounds >= 1  # speculation ran (not only plain steps)
    assert steered >= 1  # the copy delta did change the target somewhere
    assert rule == "removed" or ruled >= 1  # and the rule decided it somewhere


def test_copy_delta_recovers_what_compression_removed():
    verifier = make_model(seed=0)
    full, compressed = views(0)
    off = Engine(verifier=verifier, drafter=verifier, spec=SpecConfig(k=2, copy_weight=0.0, beta=0.0))
    on = Engine(verifier=verifier, drafter=verifier, spec=SpecConfig(k=2, copy_weight=100.0, beta=0.0))
    r_off = off.generate(full, mode="asym", max_new_tokens=4, compressed_prompt_ids=compressed)
    r_on = on.generate(full, mode="asym", max_new_tokens=4, compressed_prompt_ids=compressed)
    assert r_off.token_ids[0] != SEGMENT[SEEN]  # the compressed view alone does not know it
    # with a weight that dominates the random model's logits asym continues the segment
    assert r_on.token_ids[:4] == SEGMENT[SEEN:SEEN + 4]


def test_no_compression_no_copy_delta():
    verifier = make_model(seed=0)
    full, _ = views(1)
    plain = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.5), spec=SpecConfig(k=3))
    copying = Engine(verifier=verifier, drafter=noisy_copy(verifier, 0.5),
                     spec=SpecConfig(k=3, copy_weight=5.0))
    for mode in ("spec", "asym"):
        assert (plain.generate(full, mode=mode, max_new_tokens=12).token_ids
                == copying.generate(full, mode=mode, max_new_tokens=12).token_ids)


def test_copy_weight_is_checked():
    with pytest.raises(ValueError, match="copy_weight"):
        SpecConfig(copy_weight=-1.0)


def test_copy_rule_is_checked():
    assert SpecConfig(copy_rule="unseen").copy_rule == "unseen"
    with pytest.raises(ValueError, match="copy_rule"):
        SpecConfig(copy_rule="always")
