"""The shipped default drafter with the engine: acceptance on a fixed held-out transcript (slow)."""

from __future__ import annotations

import pytest

from asymagent.evals.probes.drafter_measure import heldout_conversations
from asymagent.training.data import render_messages

pytestmark = pytest.mark.slow

# Measured on the shipped drafter: python -m asymagent.evals.probes.drafter_measure --json ... reports
# "per_prompt_mean_accepted_len"; its first entry is this very transcript (same seed, K=4,
# T=0, 32 new tokens). The floor sits below that measurement to absorb BLAS differences
# between machines (greedy argmax ties can flip), see docs/drafter.md.
MEASURED = 1.333  # runs/drafter/measure.json, per_prompt_mean_accepted_len[0] (24 rounds, 32 tokens)
# 1.2 = 32 tokens in ~27 rounds: ~3 rounds of slack for flipped greedy ties. This is the honest
# floor of the drafter we ship; issue 5's 2.0 bar is NOT met (docs/drafter.md, "Targets").
FLOOR = 1.2


def test_default_drafter_acceptance_on_held_out_transcript(default_verifier):
    from asymagent.modeling.drafter import load_default_drafter
    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig

    drafter = load_default_drafter(default_verifier.model, verifier_fingerprint=default_verifier.fingerprint)
    engine = Engine(verifier=default_verifier.model, drafter=drafter, tokenizer=default_verifier.tokenizer,
                    spec=SpecConfig(k=4, lookup_ngram=0, adaptive_k=False))  # the drafter alone at fixed K
    conv = heldout_conversations(1)[0]
    ids = render_messages(default_verifier.tokenizer, conv, add_generation_prompt=True)
    spec = engine.generate(ids, mode="spec", max_new_tokens=32, temperature=0.0, seed=0, cache_key="s")
    full = engine.generate(ids, mode="full", max_new_tokens=32, temperature=0.0, seed=0, cache_key="f")
    assert spec.token_ids == full.token_ids  # greedy spec is lossless
    assert spec.stats.mean_accepted_len >= FLOOR, (spec.stats.mean_accepted_len, MEASURED)
