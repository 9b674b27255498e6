"""Drafter distillation end to end on a tiny random verifier: loss falls, resume is exact."""

from __future__ import annotations

import json

import pytest
import torch

from asymagent.modeling.drafter import build_drafter, load_drafter
from asymagent.training.distill import TrainConfig, lr_at, mean_kl, run
from asymagent.training.data import TokenStream, parse_mix
from asymagent.modeling.loading import LoadedModel

VOCAB = 49152  # the SmolLM2 tokenizer's vocabulary: the tiny verifier must cover its ids


def _loaded(tokenizer, make_tiny_llama):
    # 3 layers so the 2-layer drafter is a strict truncation; hidden 64 keeps each step ~0.1 s.
    model = make_tiny_llama(vocab_size=VOCAB, layers=3, hidden=64, heads=4, kv_heads=2, seed=0)
    # A random tiny model's residual stream is dominated by its (x8) embeddings, so its layers
    # barely move the output and there is nothing to distil; amplify the layers' output
    # projections so the third layer matters (KL of the 2-layer init on the probe batch goes from 0.0015 to 0.21 nats).
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(40.0)
            layer.self_attn.o_proj.weight.mul_(10.0)
    return LoadedModel(model, tokenizer, "tiny-random", "sha-of-tiny")


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(out=str(tmp_path / "run"), max_minutes=0, max_steps=16, seq_len=64, batch_size=2,
                lr=1e-3, ce_weight=0.0, warmup_steps=4, layers=2, draft_vocab=500, data_mix="agent:0.7,text:0.3", self_turns=0,
                eval_every=0, heldout_episodes=1, no_progress=True, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def test_trainer_end_to_end_loss_decreases_and_exports(tmp_path, smollm_tokenizer, tiny_llama):
    loaded = _loaded(smollm_tokenizer, tiny_llama)
    # A fixed batch from a seed the run never draws from (training uses seed 0).
    probe = TokenStream(smollm_tokenizer, 128, parse_mix("agent:1"), seed=99).batch(0, 2)  # [2, 128]
    before = mean_kl(loaded.model, build_drafter(loaded.model, 2), probe)
    card = run(_cfg(tmp_path), loaded=loaded)
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert len(history) == 16 and card["steps"] == 16
    # Export: layers + norm + draft vocab, loadable onto the verifier with its card.
    drafter = load_drafter(tmp_path / "run" / "drafter.safetensors", loaded.model)
    after = mean_kl(loaded.model, drafter, probe)
    # The drafter starts as the verifier's first 2 of 3 layers; 16 Adam steps of distillation
    # must cut the KL on unseen rows of the same distribution well below where it started
    # (measured 0.206 -> 0.102 nats, 0.50x); 0.8x leaves room for BLAS differences and is
    # still a bar that a broken gradient path (no change) cannot pass.
    assert after < 0.8 * before, (before, after)
    assert drafter.config.num_hidden_layers == 2
    assert drafter.model.embed_tokens is loaded.model.model.embed_tokens  # shared, not copied
    assert drafter.asymagent_draft_vocab.shape == (500,)
    assert drafter.asymagent_card["verifier_sha256"] == "sha-of-tiny"
    assert 0.0 <= card["heldout_top1_agreement_draft_vocab"] <= 1.0


def test_resume_matches_uninterrupted_run(tmp_path, smollm_tokenizer, tiny_llama):
    loaded = _loaded(smollm_tokenizer, tiny_llama)
    run(_cfg(tmp_path / "a", max_steps=6), loaded=loaded)
    run(_cfg(tmp_path / "b", max_steps=3), loaded=loaded)
    run(_cfg(tmp_path / "b", max_steps=6, resume=True), loaded=loaded)
    a = torch.load(tmp_path / "a" / "run" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "run" / "checkpoint.pt", weights_only=False)
    assert a["step"] == b["step"] == 6
    # Rows are a pure function of (seed, step) and the optimizer state is restored, so the two
    # runs do the same arithmetic; 1e-5 absorbs any reordering noise in fp32.
    for key, value in a["drafter"].items():
        assert torch.allclose(value, b["drafter"][key], atol=1e-5), key
    assert [h["loss"] for h in a["history"]] == pytest.approx([h["loss"] for h in b["history"]], abs=1e-4)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, smollm_tokenizer, tiny_llama):
    with pytest.raises(FileNotFoundError, match="checkpoint.pt"):
        run(_cfg(tmp_path, resume=True), loaded=_loaded(smollm_tokenizer, tiny_llama))


def test_config_validation_and_schedule():
    with pytest.raises(ValueError, match="layers"):
        TrainConfig(layers=0).validate()
    with pytest.raises(ValueError, match="max-minutes"):
        TrainConfig(max_minutes=0, max_steps=0).validate()
    cfg = TrainConfig(lr=1e-3, warmup_steps=10)
    assert lr_at(cfg, 0, 0.0) == pytest.approx(1e-4)  # warmup: (0+1)/10 of lr
    assert lr_at(cfg, 50, 0.0) == pytest.approx(1e-3)  # cosine starts at the full lr
    assert lr_at(cfg, 50, 1.0) == pytest.approx(1e-4)  # and ends at lr/10


def test_warm_start_continues_from_an_exported_drafter(tmp_path, smollm_tokenizer, tiny_llama):
    loaded = _loaded(smollm_tokenizer, tiny_llama)
    first = run(_cfg(tmp_path / "a", max_steps=8), loaded=loaded)
    exported = tmp_path / "a" / "run" / "drafter.safetensors"
    # Zero steps after the warm start is impossible (the loop runs until a budget is spent), so
    # check the copy directly, then that a short warm-started run records its ancestry.
    from asymagent.training.distill import warm_start_layers
    from asymagent.modeling.drafter import trainable_state_dict
    fresh = build_drafter(loaded.model, 2)
    summary = warm_start_layers(fresh, loaded.model, str(exported))
    source = trainable_state_dict(load_drafter(exported, loaded.model))
    for key, value in trainable_state_dict(fresh).items():
        assert torch.equal(value, source[key]), key
    assert summary["file"] == "drafter.safetensors" and summary["steps"] == first["steps"] == 8
    second = run(_cfg(tmp_path / "b", max_steps=2, init_from=str(exported)), loaded=loaded)
    assert second["warm_start"]["steps"] == 8 and second["steps"] == 2
    with pytest.raises(ValueError, match="--layers"):
        warm_start_layers(build_drafter(loaded.model, 1), loaded.model, str(exported))


def test_budget_is_wall_clock_raw_text_and_the_run_ends_with_a_verdict(tmp_path, smollm_tokenizer,
                                                                       tiny_llama, capsys):
    """A base model (no chat template) trains on raw-text transcripts; --max-minutes bounds the
    whole run, data and the closing evaluation included; the last line compares the drafter with
    the untrained layers:N and the suffix drafts alone."""
    import copy
    import time

    from asymagent.training.data import render_messages

    tok = copy.deepcopy(smollm_tokenizer)
    tok.chat_template = None
    text = tok.decode(render_messages(tok, [{"role": "user", "content": "hi"}], True))
    assert text == "user: hi\n\nassistant:"
    budget_s = 12.0
    t0 = time.monotonic()
    card = run(_cfg(tmp_path, max_minutes=budget_s / 60, max_steps=0, heldout_episodes=2),
               loaded=_loaded(tok, tiny_llama))
    wall = time.monotonic() - t0
    # the budget stops training early enough for the closing evaluation: at most one step
    # (~0.1-0.5 s here) and the evaluation's estimate error past it
    assert card["steps"] > 0 and wall < budget_s + 3.0, wall
    assert card["wall_minutes"] <= budget_s / 60 + 0.05
    for key in ("heldout_top1_agreement_layers_untrained", "heldout_top1_agreement_suffix_only"):
        assert 0.0 <= card[key] <= 1.0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("train-drafter: ") and "layers:2" in last and "suffix drafts alone" in last
    assert ("WORSE" in last) != card["drafter_beats_baselines"]


def test_verdict_says_plainly_when_the_drafter_is_worse():
    from asymagent.training.verdict import Verdict

    worse = Verdict(trained=0.0074, layers=0.31, suffix=0.12, n_layers=1, k=2, tokens=900)
    line = worse.line()
    assert "0.7%" in line and "WORSE than the untrained layers:1" in line
    assert "--drafter layers:1" in line and "WORSE than the suffix drafts alone" in line
    assert worse.per_round(0.5) == pytest.approx(0.75)
    best = Verdict(trained=0.6, layers=0.3, suffix=0.2, n_layers=2, k=3, tokens=900)
    assert "best of the three" in best.line() and "WORSE" not in best.line()
    assert best.as_card()["drafter_beats_baselines"] is True
