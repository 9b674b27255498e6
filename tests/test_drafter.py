"""The drafter model: shared embeddings/head, save/load round trip, fingerprint-checked default."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import asymagent.modeling.drafter as drafter_mod
from asymagent.modeling.drafter import (
    DrafterMismatchError, build_drafter, card_path_for, load_default_drafter, load_drafter, save_drafter,
)


@pytest.fixture
def verifier(tiny_llama):
    return tiny_llama(vocab_size=256, layers=3, hidden=64, heads=4, kv_heads=2, seed=1)


def test_build_shares_embeddings_and_copies_first_layers(verifier):
    d = build_drafter(verifier, 2)
    assert type(d) is type(verifier) and d.config.num_hidden_layers == 2
    assert d.model.embed_tokens is verifier.model.embed_tokens
    assert d.lm_head.weight.data_ptr() == verifier.lm_head.weight.data_ptr()  # tied, not copied
    for a, b in zip(d.model.layers[1].parameters(), verifier.model.layers[1].parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()  # a copy it may train
    assert d.config.hidden_size == verifier.config.hidden_size
    assert verifier.config.num_hidden_layers == 3  # the verifier's config is untouched


def test_full_depth_drafter_reproduces_the_verifier(verifier):
    # With all 3 layers copied the drafter IS the verifier: same logits (fp32, same kernels).
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        assert torch.allclose(build_drafter(verifier, 3)(ids).logits, verifier(ids).logits, atol=1e-5)


def test_too_many_layers_is_a_clear_error(verifier):
    with pytest.raises(ValueError, match="exceed"):
        build_drafter(verifier, 4)


def test_save_load_round_trip(tmp_path, verifier):
    d = build_drafter(verifier, 2)
    vocab = torch.tensor([3, 5, 7, 200])
    path = save_drafter(d, tmp_path / "d.safetensors", vocab, card={"verifier_sha256": "abc"},
                        dtype=torch.float32)
    tensors = load_file(str(path))
    # Only the drafter's own weights ship: no embedding/head rows.
    assert not any("embed" in k or "lm_head" in k for k in tensors)
    loaded = load_drafter(path, verifier)
    assert torch.equal(loaded.asymagent_draft_vocab, vocab)
    assert loaded.asymagent_card == {"verifier_sha256": "abc"}
    ids = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, d(ids).logits, atol=1e-6)  # fp32 saved: exact


def test_load_rejects_bad_files(tmp_path, verifier):
    with pytest.raises(FileNotFoundError):
        load_drafter(tmp_path / "missing.safetensors", verifier)
    d = build_drafter(verifier, 1)
    good = save_drafter(d, tmp_path / "g.safetensors", torch.arange(10))
    tensors = load_file(str(good))
    no_vocab = {k: v for k, v in tensors.items() if k != "asymagent_draft_vocab"}
    save_file(no_vocab, str(tmp_path / "nv.safetensors"))
    with pytest.raises(DrafterMismatchError, match="asymagent_draft_vocab"):
        load_drafter(tmp_path / "nv.safetensors", verifier)
    out_of_range = dict(tensors, asymagent_draft_vocab=torch.tensor([0, 999]))  # vocab is 256
    save_file(out_of_range, str(tmp_path / "oor.safetensors"))
    with pytest.raises(DrafterMismatchError, match="outside"):
        load_drafter(tmp_path / "oor.safetensors", verifier)


def test_load_rejects_other_hidden_size(tmp_path, tiny_llama, verifier):
    other = tiny_llama(vocab_size=256, layers=2, hidden=32, heads=4, kv_heads=2)
    path = save_drafter(build_drafter(other, 1), tmp_path / "o.safetensors", torch.arange(5))
    with pytest.raises(DrafterMismatchError, match="hidden size"):
        load_drafter(path, verifier)


def test_default_drafter_checks_the_fingerprint(tmp_path, monkeypatch, verifier):
    weights = tmp_path / "drafter-smollm2.safetensors"
    monkeypatch.setattr(drafter_mod, "DEFAULT_DRAFTER_FILE", weights)
    monkeypatch.setattr(drafter_mod, "DEFAULT_CARD_FILE", card_path_for(weights))
    with pytest.raises(FileNotFoundError, match="train-drafter"):
        load_default_drafter(verifier, verifier_fingerprint="x")
    save_drafter(build_drafter(verifier, 1), weights, torch.arange(5), card={"verifier_sha256": "good"})
    with pytest.raises(DrafterMismatchError, match="bad"):
        load_default_drafter(verifier, verifier_fingerprint="bad")
    assert load_default_drafter(verifier, verifier_fingerprint="good").asymagent_card["verifier_sha256"] == "good"


@pytest.mark.slow
def test_shipped_drafter_matches_the_embedded_verifier(default_verifier):
    card = json.loads(drafter_mod.DEFAULT_CARD_FILE.read_text())
    assert card["verifier_sha256"] == default_verifier.fingerprint
    assert drafter_mod.DEFAULT_DRAFTER_FILE.stat().st_size <= 30 * 2**20  # issue 5: <= 30 MB
    d = load_default_drafter(default_verifier.model, verifier_fingerprint=default_verifier.fingerprint)
    assert d.config.num_hidden_layers == card["layers"]
    assert len(d.asymagent_draft_vocab) == card["draft_vocab_size"]
