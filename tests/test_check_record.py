"""The record of the engine start's bit-identity checks (asymagent/modeling/check_record.py):
read back for the same weights, machine, threads and code; run afresh when any of them changes;
never recorded for weights without a stamp (built or changed in memory)."""

from __future__ import annotations

import pytest
import torch

from asymagent.kv import lean_forward
from asymagent.kv.attention import use_gqa_attention
from asymagent.kv.lean_forward import attach
from asymagent.modeling import check_record, packed_linear, probe_cache, weights_stamp
from asymagent.modeling.packed_linear import FloorLinear, PackedLinear, kernel_available, pack_linears
from conftest import make_tiny_qwen2

pytestmark = pytest.mark.skipif(kernel_available() is not None,
                                reason=f"no packed bf16 linear kernel: {kernel_available()}")


@pytest.fixture
def record(tmp_path, monkeypatch):
    """The record in a fresh cache; spies counting the checks actually run."""
    monkeypatch.setenv("ASYMAGENT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ASYMAGENT_PROBE_CACHE", raising=False)
    runs = {"identical": 0, "lean": 0}
    identical, same = packed_linear._identical, lean_forward._same_as_transformers

    def count_identical(*a, **k):
        runs["identical"] += 1
        return identical(*a, **k)

    def count_same(*a, **k):
        runs["lean"] += 1
        return same(*a, **k)

    monkeypatch.setattr(packed_linear, "_identical", count_identical)
    monkeypatch.setattr(lean_forward, "_same_as_transformers", count_same)
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"stands for the file the weights were read from")
    return runs, weights


def _loaded(weights, seed: int = 0):
    """A tiny bf16 qwen2 marked as `load_model` marks a model read from `weights`."""
    model = make_tiny_qwen2(hidden=128, heads=4, kv_heads=2, layers=2, seed=seed).to(torch.bfloat16)
    weights_stamp.mark(model, f"sha-{seed}", [weights], "torch.bfloat16:None")
    return model


def _start(model):
    """What Engine.__init__ does to a model: grouped attention, packed linears, the lean forward."""
    use_gqa_attention(model)
    report = pack_linears(model)
    lean = attach(model)
    kinds = {name: type(m).__name__ for name, m in model.named_modules()
             if type(m) in (PackedLinear, FloorLinear)}
    return report, lean, kinds


def _logits(model) -> list:
    """A 35-token prefill, then 1-, 4- and 1-token forwards (the packed rows): their logits."""
    from asymagent.kv.cache import ModelCache

    cache = ModelCache(model)
    return [cache.forward_logits(ids, keep=len(ids)) for ids in
            (list(range(5, 40)), [7], [9, 11, 13, 2], [250])]


def test_the_second_start_reads_the_record_and_runs_as_the_first(record, monkeypatch):
    runs, weights = record
    first = _start(_loaded(weights))
    assert runs["identical"] > 0 and runs["lean"] == 1
    checked = dict(runs)
    first_model = _loaded(weights)  # another model over the same weights, its checks run
    monkeypatch.setenv("ASYMAGENT_PROBE_CACHE", "0")
    _start(first_model)
    monkeypatch.delenv("ASYMAGENT_PROBE_CACHE")
    checked = {k: 2 * v for k, v in checked.items()}
    model = _loaded(weights)
    second = _start(model)
    assert runs == checked  # no check ran again
    assert second[0].packed == first[0].packed and second[0].not_identical == first[0].not_identical
    assert second[1] == first[1] and second[1].attached and second[2] == first[2]
    # the layers were not packed at the start (the lean forward's fused copies replace q, k, v,
    # gate, up); the rest are packed on their first packed forward, with the same bits
    assert all(m.packed_weight is None for m in model.modules() if type(m) is PackedLinear)
    for a, b in zip(_logits(model), _logits(first_model)):
        assert torch.equal(a, b)


def test_the_checks_first_start_drops_the_copies_the_fused_kernels_replace(record):
    """The lean check's transformers forward re-made q, k, v, gate and up's own packed copies,
    which the lean forward never reads (~2 GB on the reference pair): dropped again."""
    _, weights = record
    model = _loaded(weights)
    _, lean, _ = _start(model)
    assert lean.fused
    for lay in model.asymagent_lean.layers:
        assert all(m.packed_weight is None for m in (lay.q, lay.k, lay.v, lay.gate, lay.up))
        assert lay.o.packed_weight is not None  # packed by the check, kept: the road reads it


@pytest.mark.parametrize("change", ["threads", "weights_file", "in_place", "machine", "code",
                                    "switch", "record_off", "no_stamp"])
def test_a_changed_key_checks_again(record, monkeypatch, change):
    runs, weights = record
    _start(_loaded(weights))
    checked = dict(runs)
    model = _loaded(weights)
    if change == "threads":
        threads = torch.get_num_threads()
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    elif change == "weights_file":
        weights.write_bytes(b"another file, another size")
        model = _loaded(weights)
    elif change == "in_place":
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(1)  # the same values, written
    elif change == "machine":
        monkeypatch.setattr(probe_cache, "machine_key", lambda: "another CPU or torch")
    elif change == "code":
        monkeypatch.setattr(check_record, "code_stamp", lambda: "edited sources")
    elif change == "switch":
        monkeypatch.setenv("ASYMAGENT_ROW_FLOORS", "0")
    elif change == "record_off":
        monkeypatch.setenv("ASYMAGENT_PROBE_CACHE", "0")
    elif change == "no_stamp":
        model = make_tiny_qwen2(hidden=128, heads=4, kv_heads=2, layers=2, seed=0).to(torch.bfloat16)
    _start(model)
    assert runs["identical"] == 2 * checked["identical"] and runs["lean"] == 2, change


def test_a_recorded_difference_is_kept(record, monkeypatch):
    """A layer the check found unlike F.linear stays a FloorLinear on the start that reads the
    record (as a lean forward found unlike transformers' stays off)."""
    runs, weights = record
    real = packed_linear._identical
    monkeypatch.setattr(packed_linear, "_identical",
                        lambda module, packed, seed: False if module.out_features == 128 and
                        module.in_features == 256 else real(module, packed, seed))
    monkeypatch.setattr(lean_forward, "_same_as_transformers", lambda m, lean: "differs (test)")
    with pytest.warns(RuntimeWarning, match="differ from F.linear"):
        first = _start(_loaded(weights))
    monkeypatch.setattr(packed_linear, "_identical", lambda *a, **k: pytest.fail("checked again"))
    monkeypatch.setattr(lean_forward, "_same_as_transformers", lambda *a: pytest.fail("checked again"))
    with pytest.warns(RuntimeWarning, match="differ from F.linear"):
        second = _start(_loaded(weights))
    assert first[0].not_identical and second[0].not_identical == first[0].not_identical
    assert second[2] == first[2] and "FloorLinear" in second[2].values()
    assert not second[1].attached and second[1].why == "differs (test)"


def test_load_model_marks_weights_read_from_files(tmp_path):
    """`load_model` stamps a model read from a directory of safetensors; moving or writing a
    parameter voids the stamp."""
    from transformers import AutoTokenizer  # noqa: F401 - the directory load reads a tokenizer
    from asymagent.modeling.loading import load_model

    pytest.importorskip("tokenizers")
    model = make_tiny_qwen2(hidden=64, heads=4, kv_heads=2, layers=1, seed=0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    _write_tokenizer(tmp_path)
    loaded = load_model(tmp_path, dtype=torch.bfloat16)
    assert weights_stamp.stamp(loaded.model) is not None
    assert loaded.files and all(str(f).endswith(".safetensors") for f in loaded.files)
    with torch.no_grad():
        loaded.model.lm_head.weight.add_(0)
    assert weights_stamp.stamp(loaded.model) is None


def _write_tokenizer(folder) -> None:
    """A word-level tokenizer over the tiny model's 256 ids (enough for AutoTokenizer to load)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(str(folder))
