"""The divergence gate in the engine (SpecConfig.jsd_min): asym fuses only where the drafter's views part.

A slow reference decodes argmax(v_c + beta_eff * (a - b)) one token at a time from fresh forwards
(v_c: the verifier on the compressed view; a, b: the drafter on the full and the compressed view;
beta_eff = beta where JSD(p_a || p_b) >= jsd_min, else 0). The engine, with drafts, rounds, plain
steps and adaptive K, must emit exactly its tokens; a threshold above ln 2 never fires, so asym
is then mode compressed token for token, and jsd_min = 0 is plain delta-fusion.
"""

from __future__ import annotations

import torch

from asymagent import Engine, SpecConfig
from asymagent.kernels.gate_reference import jsd_from_log_probs
from test_engine_models import make_model, noisy_copy, random_prompts

N = 16  # tokens per response
# the tiny random models' outputs hang mostly on the last tokens, so the drafter's views part
# by JSDs of ~1e-5..1e-4 nats; a large beta lets that delta steer tokens (2 of 3 responses)
BETA = 10.0


def views(seed: int) -> tuple[list, list]:
    """(full prompt, compressed prompt): the compressed view drops the middle."""
    head, middle, tail = random_prompts(3, length=16, seed=seed)
    return head + middle + tail, head + tail


def reference(verifier, drafter, full: list, compressed: list, beta: float,
              jsd_min: float) -> tuple[list, list]:
    """(tokens, JSD at each position) of the gated fused target, decoded one token at a time."""
    out, jsds = [], []
    with torch.no_grad():
        for _ in range(N):
            v = verifier(torch.tensor([compressed + out])).logits[0, -1].float()  # [V]
            a = drafter(torch.tensor([full + out])).logits[0, -1].float()  # [V]
            b = drafter(torch.tensor([compressed + out])).logits[0, -1].float()  # [V]
            jsd = float(jsd_from_log_probs(torch.log_softmax(a, -1), torch.log_softmax(b, -1)))
            on = beta if jsd >= jsd_min else 0.0
            out.append(int((v + (a - b) * on).argmax()))
            jsds.append(jsd)
    return out, jsds


def test_asym_gates_the_delta_token_for_token():
    verifier = make_model(seed=0)
    drafter = noisy_copy(verifier, 1.0)  # a drafter whose two views part by varying amounts
    cases = [views(seed) for seed in range(3)]
    plain = [reference(verifier, drafter, f, c, BETA, 0.0) for f, c in cases]
    jsds = sorted(j for _, js in plain for j in js)
    # a threshold between two middle JSDs with a clear gap (the engine's cached forwards round
    # differently from the fresh ones here, by ~1e-8 nats: far less than the gap)
    gaps = [(jsds[i + 1] - jsds[i], i) for i in range(len(jsds) // 4, 3 * len(jsds) // 4)]
    gap, i = max(gaps)
    assert gap > 2e-6
    mid = (jsds[i] + jsds[i + 1]) / 2
    fired = never = 0
    for jsd_min in (0.0, mid, 1.0):  # 1.0 > ln 2: the delta never fires
        engine = Engine(verifier=verifier, drafter=drafter,
                        spec=SpecConfig(k=3, beta=BETA, copy_weight=0.0, jsd_min=jsd_min))
        for (full, compressed), (plain_tokens, _) in zip(cases, plain):
            want, _ = reference(verifier, drafter, full, compressed, BETA, jsd_min)
            r = engine.generate(full, mode="asym", max_new_tokens=N, compressed_prompt_ids=compressed)
            assert r.token_ids == want, jsd_min
            assert r.stats.rounds >= 1  # speculation ran (not only plain steps)
            comp = engine.generate(full, mode="compressed", max_new_tokens=N,
                                   compressed_prompt_ids=compressed, cache_key="c")
            if jsd_min == 0.0:
                assert want == plain_tokens
                fired += want != comp.token_ids  # the delta steers some response
            elif jsd_min == 1.0:
                assert r.token_ids == comp.token_ids  # the delta never fires: mode compressed
                never += 1
    assert fired >= 1 and never == len(cases)


def test_jsd_min_is_validated():
    import pytest

    for bad in (-0.01, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ValueError, match="jsd_min"):
            SpecConfig(jsd_min=bad)
    assert SpecConfig().jsd_min == 0.0 and SpecConfig(jsd_min=0.05).jsd_min == 0.05
