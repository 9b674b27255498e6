"""Weight-only int8 / int4 linears (asymagent/modeling/weight_only.py, `--dtype int8w|int4w`).

Tiny random Llama and Qwen2 models made here, in the automatic dtype (bf16 on a CPU with a bf16
unit, float32 elsewhere). Greedy spec and asym (beta 0, no compression) must emit full's ids token
for token in the same dtype: full decodes one row through the low-bit kernel, a verify K+1 rows,
so a row must get the same bits alone as among others (checked on the model's own layers here,
probed per shape by `row_floor`). A kind whose op this torch lacks is skipped, and refused with a
clear error (checked by taking the op away).
"""

from __future__ import annotations

import pytest
import torch

from asymagent.engine import Engine
from asymagent.modeling import weight_only
from asymagent.modeling.cpu_dtype import auto_dtype, dtype_name, resolve_dtype
from asymagent.modeling.row_floor import ROW_COUNTS
from asymagent.modeling.weight_only import (KINDS, WeightOnlyLinear, WeightOnlyUnavailable, lowbit_count,
                                            op_missing, quantize_weights)
from asymagent.spec_config import SpecConfig
from conftest import make_tiny_llama, make_tiny_qwen2
from test_engine_models import greedy_modes_agree, random_prompts

MAKERS = {"llama": make_tiny_llama, "qwen2": make_tiny_qwen2}


def _kind(kind: str):
    why = op_missing(kind)
    return pytest.param(kind, marks=pytest.mark.skipif(why is not None, reason=f"{kind}: {why}"))


KIND_PARAMS = pytest.mark.parametrize("kind", [_kind(k) for k in KINDS])
FAMILY_PARAMS = pytest.mark.parametrize("family", sorted(MAKERS))
# the automatic dtype (bf16 here when the CPU has a bf16 unit) and float32 (a CPU without one)
DTYPE_PARAMS = pytest.mark.parametrize("dtype", sorted({auto_dtype("cpu"), torch.float32}, key=str))


def _model(family: str, seed: int = 0, head_scale: float = 2.0, dtype: torch.dtype | None = None):
    """A tiny model in `dtype` (default: the automatic one) with an untied, scaled head (peaked logits)."""
    model = MAKERS[family](vocab_size=256, hidden=64, layers=2, seed=seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        head = torch.randn(model.lm_head.weight.shape, generator=gen) * head_scale
        model.lm_head.weight = torch.nn.Parameter(head)
    return model.to(dtype or auto_dtype("cpu")).eval()


def test_dtype_names():
    assert resolve_dtype("int8w") == (auto_dtype("cpu"), "int8w")
    assert resolve_dtype("INT4W") == (auto_dtype("cpu"), "int4w")
    assert resolve_dtype("int8") == (torch.float32, "int8")  # dynamic int8 kept as it was
    with pytest.raises(ValueError, match="int4w"):
        resolve_dtype("int3w")


@KIND_PARAMS
@FAMILY_PARAMS
def test_quantize_swaps_decoder_linears_and_the_head_only(kind, family):
    model = _model(family)
    ref = _model(family)
    report = quantize_weights(model, kind)
    assert report.layers == lowbit_count(model) == 7 * 2 + 1  # q k v o gate up down, 2 layers; the head
    assert report.sources == {"min/max": 14, "int8: head": 1}
    assert report.lowbit_bytes < report.float_bytes  # int8: half of bf16, a quarter of float32
    assert set(report.floors.values()) <= set(weight_only.FLOOR_CANDIDATES)
    assert type(model.lm_head) is WeightOnlyLinear and model.lm_head.lowbit.kind == "int8w"
    assert type(model.model.embed_tokens) is torch.nn.Embedding and dtype_name(model) == kind
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, ref.model.layers[0].mlp.up_proj.weight)
    ids = torch.tensor(random_prompts(4, length=12, seed=2))  # [4, 12]
    with torch.inference_mode():
        low = torch.cat([model(ids[i:i + 1, :8]).logits for i in range(4)])  # 8 rows: the low-bit kernel
        full = torch.cat([ref(ids[i:i + 1, :8]).logits for i in range(4)])  # [4, 8, V]
    assert not torch.equal(low, full)  # the low-bit weights ran
    agree = (low.argmax(-1) == full.argmax(-1)).float().mean().item()
    assert agree > (0.9 if kind == "int8w" else 0.7), agree  # measured: int8w ~1.0, int4w ~0.9


@KIND_PARAMS
@FAMILY_PARAMS
@DTYPE_PARAMS
@pytest.mark.parametrize("cpu_kind", ["amx", "att8_lin4"], indirect=True)
def test_a_row_gets_the_same_bits_alone_and_among_others(kind, family, dtype, cpu_kind):
    """Each layer: rows of a 1..32-row call equal the same rows computed alone (decode vs verify);
    also with the low-bit kernels' floors forced to 4 (conftest `cpu_kind`: another CPU's)."""
    model = _model(family, dtype=dtype)
    quantize_weights(model, kind)
    g = torch.Generator().manual_seed(3)
    layers = [m for m in model.modules() if type(m) is WeightOnlyLinear]
    with torch.inference_mode():
        for layer in layers:
            x = torch.randn(32, layer.in_features, generator=g).to(layer.weight.dtype)  # [32, in]
            alone = torch.cat([layer(x[i:i + 1]) for i in range(32)])  # [32, out]
            for rows in ROW_COUNTS:
                assert torch.equal(layer(x[:rows]), alone[:rows]), (kind, rows)
            assert torch.equal(layer(x[None, :5]), alone[None, :5])  # [1, T, in] as in a forward


@KIND_PARAMS
@FAMILY_PARAMS
@DTYPE_PARAMS
def test_greedy_spec_and_asym_equal_full_in_the_same_dtype(kind, family, dtype):
    verifier = _model(family, seed=0, dtype=dtype)
    drafter = _model(family, seed=0, dtype=dtype)
    with torch.no_grad():  # a partial drafter: its head off the verifier's
        drafter.lm_head.weight.add_(torch.randn(drafter.lm_head.weight.shape,
                                                generator=torch.Generator().manual_seed(7)).to(drafter.dtype))
    quantize_weights(verifier, kind)
    quantize_weights(drafter, kind)
    spec = SpecConfig(k=3, adaptive_k=False, beta=0.0, acceptance="greedy")
    engine = Engine(verifier=verifier, drafter=drafter, spec=spec)
    assert engine.runtime["dtype"] == kind
    # the lean forward runs the low-bit layers through its unfused loop, or is off with a reason
    lean = engine.runtime["lean_forward"]["verifier"]
    assert lean == "on" or lean.startswith("off: "), lean
    assert greedy_modes_agree(engine) > 0  # the modes agree; rejections: the rollback path ran


def test_lean_forward_attaches_over_low_bit_layers():
    """On a bf16 CPU the lean forward's logits still equal transformers' (its own check) with the
    low-bit layers, through its unfused loop."""
    kind = next((k for k in KINDS if op_missing(k) is None), None)
    if kind is None:
        pytest.skip("no weight-only op in this torch")
    from asymagent.kv.lean_forward import attach

    model = _model("qwen2")
    quantize_weights(model, kind)
    report = attach(model)
    assert report.attached and not report.fused, report


def test_a_missing_op_is_a_clear_error(monkeypatch):
    op_missing.cache_clear()
    monkeypatch.delattr(torch, "_weight_int8pack_mm")
    try:
        assert "_weight_int8pack_mm" in op_missing("int8w")
        with pytest.raises(WeightOnlyUnavailable, match="--dtype int8w needs torch's CPU weight-only op"):
            quantize_weights(_model("llama"), "int8w")
    finally:
        op_missing.cache_clear()


@KIND_PARAMS
def test_a_kernel_without_batch_invariance_is_refused(monkeypatch, kind):
    monkeypatch.setattr(weight_only, "row_floor", lambda *a, **k: None)
    with pytest.raises(WeightOnlyUnavailable, match="other bits alone than among other rows"):
        quantize_weights(_model("llama"), kind)


@KIND_PARAMS
def test_load_model_takes_the_dtype_name(tmp_path, kind):
    from asymagent.modeling.loading import load_default_verifier, load_model

    tok = load_default_verifier(dtype="float32").tokenizer
    model = _model("llama")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype=kind)
    assert lowbit_count(loaded.model) == 14 + 1 and dtype_name(loaded.model) == kind  # 2 layers x 7, the head
    assert next(loaded.model.parameters()).dtype == auto_dtype("cpu")


@pytest.mark.parametrize("capability", ["AVX2", "AVX512"])
def test_low_bit_on_a_cpu_without_avx512_says_it_is_slow(tmp_path, monkeypatch, caplog, capability):
    from asymagent.modeling.loading import load_default_verifier, load_model

    kind = next((k for k in KINDS if op_missing(k) is None), None)
    if kind is None:
        pytest.skip("no weight-only op in this torch")
    tok = load_default_verifier(dtype="float32").tokenizer
    _model("llama").save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setenv("ASYMAGENT_LOWBIT_KERNEL", "torch")  # the warning is about torch's kernels (tiles: below)
    with caplog.at_level("WARNING", logger="asymagent"):
        load_model(tmp_path, dtype=kind)
    warned = [r for r in caplog.records if "were measured slower than the float weights" in r.getMessage()]
    assert len(warned) == (1 if capability == "AVX2" else 0)


def test_cli_dtype_choices(capsys):
    from asymagent.integrations import cli
    from asymagent.integrations.cli import build_parser

    parser, _ = build_parser()
    for verb in (["serve"], ["eval", "records"]):
        for kind in KINDS:
            assert parser.parse_args([*verb, "--dtype", kind]).dtype == kind
    with pytest.raises(SystemExit) as exit_:
        cli.main(["eval", "records", "--dtype", "int3w"])
    assert exit_.value.code == 2 and "unknown dtype 'int3w'" in capsys.readouterr().err
