"""`train-drafter --kind feature` end to end on a tiny random verifier (embedded tokenizer): teacher
rows, draft vocabulary, TTT steps, the budget honoured, an exported head the engine drafts with."""

from __future__ import annotations

import argparse
import json

import torch

from asymagent.engine import Engine
from asymagent.modeling.loading import LoadedModel
from asymagent.spec_config import SpecConfig
from asymagent.training.config import TrainConfig, add_arguments
from asymagent.training.feature_train import run

VOCAB = 49152  # the SmolLM2 tokenizer's vocabulary


def _loaded(tokenizer, make):
    model = make(vocab_size=VOCAB, layers=4, hidden=64, heads=4, kv_heads=2, seed=0)
    return LoadedModel(model, tokenizer, "tiny-random", "sha-of-tiny")


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(out=str(tmp_path / "run"), kind="feature", max_steps=4, seq_len=64, batch_size=2,
                lr=1e-3, self_turns=0, feature_tokens=1500, feature_vocab=3000, ttt_steps=2,
                feature_intermediate=96, no_progress=True, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def test_the_flags_exist():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--out", "x", "--kind", "feature", "--budget-min", "20", "--ttt-steps", "3"])
    assert (args.kind, args.budget_min, args.ttt_steps) == ("feature", 20.0, 3)
    assert p.parse_args(["--out", "x"]).kind == "model"  # the other kinds as they were


def test_feature_training_end_to_end(tmp_path, smollm_tokenizer):
    from conftest import make_tiny_llama

    loaded = _loaded(smollm_tokenizer, make_tiny_llama)
    card = run(_cfg(tmp_path), loaded=loaded)
    out = tmp_path / "run"
    assert json.loads((out / "card.json").read_text())["training"]["steps"] == 4
    assert card["teacher"]["tokens"] >= 1500 and card["teacher"]["s_per_1k_tokens"] > 0
    assert card["draft_vocab"] == 3000 and card["layers"] == [1, 2]
    assert len(card["heldout_agreement_by_step"]) == 2
    assert card["training"]["s_per_1k_tokens"] > 0
    # the engine drafts with it (reduced draft vocabulary) and says the verifier's tokens
    verifier = loaded.model
    engine = Engine(verifier=verifier, drafter=verifier,
                    spec=SpecConfig(k=3, lookup_ngram=0, draft_model=False, adaptive_k=False))
    engine.use_feature_head(str(out / "feature_head.safetensors"))
    assert engine.feature.weight.shape[0] == 3000
    full = Engine(verifier=verifier)
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        p = torch.randint(3, VOCAB, (20,), generator=g).tolist()
        r = engine.generate(p, mode="spec", max_new_tokens=10, cache_key=f"s{i}")
        assert r.token_ids == full.generate(p, mode="full", max_new_tokens=10, cache_key=f"f{i}").token_ids
        assert r.stats.draft_source.get("feature", 0) > 0


def test_the_budget_is_honoured(tmp_path, smollm_tokenizer):
    from conftest import make_tiny_llama

    loaded = _loaded(smollm_tokenizer, make_tiny_llama)
    budget_min = 0.1  # 6 s: teacher forwards at most 40% of it, training until it is spent
    card = run(_cfg(tmp_path, max_steps=0, budget_min=budget_min, feature_tokens=10 ** 6),
               loaded=loaded)
    assert card["teacher"]["seconds"] <= 0.4 * 60 * budget_min + 2.0
    assert card["training"]["steps"] >= 1
    # the training loop stops at the deadline (one step past it at most)
    assert card["wall_s"] - card["training"]["seconds"] <= 60 * budget_min + 5.0
