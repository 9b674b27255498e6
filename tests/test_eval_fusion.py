"""`asymagent eval fusion` (evals/running/fusion.py): the token-level measurement of delta-fusion."""

from __future__ import annotations

import json

import pytest
import torch

from asymagent.evals.running.fusion import (Variant, conversations, fused_logprobs, measure_conversation, parse_variants,
                                    report, token_classes)


def test_variants_parse_and_apply():
    assert [v.name for v in parse_variants("beta=1;beta=0.5,jsd_min=0.01;beta=2,jsd_scale=0.05")] == \
        ["beta=1", "beta=0.5,jsd_min=0.01", "beta=2,jsd_scale=0.05"]
    with pytest.raises(ValueError, match="bad variant"):
        Variant.parse("gamma=1")
    g = torch.Generator().manual_seed(0)
    lc, la, lb = (torch.log_softmax(torch.randn((4, 30), generator=g), -1) for _ in range(3))
    jsd = torch.tensor([0.0, 0.005, 0.02, 0.3])
    torch.testing.assert_close(fused_logprobs(lc, la, lb, jsd, Variant(beta=0.0)), lc)
    gated = fused_logprobs(lc, la, lb, jsd, Variant(beta=1.0, jsd_min=0.01))
    torch.testing.assert_close(gated[:2], lc[:2])  # JSD below the gate: no delta
    torch.testing.assert_close(gated[2:], torch.log_softmax(lc[2:] + la[2:] - lb[2:], -1))


def test_token_classes(smollm_tokenizer):
    tok = smollm_tokenizer
    tools = [{"type": "function", "function": {"name": "get_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]
    call = tok.encode('{"name": "get_order", "arguments": {"order_id": "A-17"}}', add_special_tokens=False)
    labels = token_classes(tok, tools, call, len(tok))
    assert set(labels) == {"grammar", "argument"}
    text = tok.decode(call[labels.index("argument"):])  # the first token the grammar does not force
    assert "A-17" in tok.decode([t for t, c in zip(call, labels) if c == "argument"])
    assert text
    assert token_classes(tok, tools, tok.encode("Hello there", add_special_tokens=False), len(tok)) == ["text"] * 2


@pytest.fixture(scope="module")
def perfect_drafter_engine(smollm_tokenizer):
    """An engine whose drafter IS the verifier: delta-fusion must reproduce v_f exactly."""
    from asymagent.context.views import CompressionConfig
    from asymagent.engine import Engine
    from conftest import make_tiny_llama

    tok = smollm_tokenizer
    verifier = make_tiny_llama(vocab_size=len(tok), layers=2, hidden=32, heads=4, kv_heads=2, max_positions=16384)
    gen = torch.Generator().manual_seed(3)  # an untied N(0, 1) head: peaked rows, views differ visibly
    verifier.lm_head.weight = torch.nn.Parameter(torch.randn((len(tok), 32), generator=gen))
    return Engine(verifier, verifier, tok, compression=CompressionConfig())


def test_a_drafter_equal_to_the_verifier_recovers_everything(perfect_drafter_engine):
    conv = conversations("domain:parcels", [100_000])[0]
    variants = [Variant(beta=1.0), Variant(beta=0.0)]
    positions = measure_conversation(perfect_drafter_engine, conv, variants, max_new_tokens=6, max_steps=3)
    assert positions and all(p.suite == "domain:parcels" for p in positions)
    result = report(positions, variants)
    overall = result["overall"]
    assert overall["kl_compressed"] > 1e-5  # compression changed the verifier's rows (fused KL is ~1e-10)
    fused, plain = overall["variants"]["beta=1"], overall["variants"]["beta=0"]
    assert fused["recovered_share"] == pytest.approx(1.0, abs=1e-3)
    assert fused["top1_fused"] == 1.0 and fused["broken"] == 0
    # beta 0 is mode compressed: nothing recovered, KL equal to compression's
    assert plain["recovered_share"] == pytest.approx(0.0, abs=1e-4)  # float rounding of a re-normalised row
    assert plain["top1_fused"] == overall["top1_compressed"]
    assert overall["top1_drafter"] == 1.0  # the drafter on the full view is v_f
    json.dumps(result)  # JSON-serialisable


def test_run_skips_conversations_already_measured(monkeypatch):
    import asymagent.evals.running.fusion as fusion

    calls = []

    def fake(engine, conv, variants, **kw):
        calls.append((conv.suite, conv.seed))
        return [fusion.Position(conv.suite, conv.seed, 0, "text", 0.1, 0.0, True, [0.05], [True])]

    monkeypatch.setattr(fusion, "measure_conversation", fake)
    saved = []
    done = [fusion.Position("domain:parcels", 0, 0, "text", 0.1, 0.0, True, [0.05], [True])]
    positions, _ = fusion.run(None, ["domain:parcels"], [Variant()], split="dev", episodes=2, done=done,
                              progress=False, on_conversation=lambda ps: saved.append(len(ps)))
    assert calls == [("domain:parcels", 1)]  # seed 0 came from the interrupted run
    assert len(positions) == 2 and saved == [2]
