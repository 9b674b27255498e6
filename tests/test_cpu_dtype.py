"""The CPU dtype choice (asymagent/modeling/cpu_dtype.py), bf16 greedy identity across modes, int8.

Greedy identity across modes holds *within* a dtype: mode full (one token per forward) and the
lossless speculative modes (K+1 rows per verify forward) must emit the same ids in bfloat16 as in
float32. Tiny random models (tests/conftest.py) cast to bfloat16; logits reach the gate as float32.
int8 (dynamic quantisation) quantises each forward's activations with one scale over all its
rows, so a K+1-row verify forward and a one-row decode forward can round differently: there the
test pins only that it runs and stays close to float32, and docs/results.md reports its fidelity.
"""

from __future__ import annotations

import pytest
import torch

from asymagent.engine import Engine
from asymagent.modeling import cpu_dtype
from asymagent.modeling.cpu_dtype import resolve_dtype, runtime_info
from asymagent.spec_config import SpecConfig
from test_engine_models import greedy_modes_agree, make_model, noisy_copy, random_prompts


@pytest.fixture
def no_probe_cache():
    cpu_dtype.cpu_bf16_support.cache_clear()
    yield
    cpu_dtype.cpu_bf16_support.cache_clear()


def test_resolve_names_and_auto(monkeypatch, no_probe_cache):
    assert resolve_dtype("float32") == (torch.float32, None)
    assert resolve_dtype("torch.bfloat16") == (torch.bfloat16, None)
    assert resolve_dtype(torch.float16) == (torch.float16, None)
    assert resolve_dtype("int8") == (torch.float32, "int8")
    assert resolve_dtype("auto", "cuda") == (torch.bfloat16, None)
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8")
    monkeypatch.setenv("ASYMAGENT_CPU_BF16", "0")  # as on a CPU without bf16 matrix units
    assert cpu_dtype.cpu_bf16_support() is None
    assert resolve_dtype(None) == (torch.float32, None)
    assert runtime_info()["auto_dtype"] == "float32"
    monkeypatch.delenv("ASYMAGENT_CPU_BF16")
    cpu_dtype.cpu_bf16_support.cache_clear()
    unit = cpu_dtype.cpu_bf16_support()
    assert unit in (None, "amx_bf16", "avx512_bf16")
    assert resolve_dtype("auto")[0] == (torch.bfloat16 if unit else torch.float32)


def test_for_device_resolves_only_auto(monkeypatch, no_probe_cache):
    assert cpu_dtype.for_device("auto", "cuda") == torch.bfloat16
    assert cpu_dtype.for_device(None, "cpu") == cpu_dtype.auto_dtype("cpu")
    assert cpu_dtype.for_device("int8", "cpu") == "int8"
    assert cpu_dtype.for_device(torch.float32, "cuda") == torch.float32
    monkeypatch.setenv("ASYMAGENT_CPU_BF16", "0")
    cpu_dtype.cpu_bf16_support.cache_clear()  # probed once per process: probe again
    assert cpu_dtype.for_device("auto", "cpu") == torch.float32


def _bf16(model):
    return model.to(torch.bfloat16)


def test_engine_reports_its_dtype():
    engine = Engine(verifier=_bf16(make_model(seed=0)))
    assert engine.runtime["dtype"] == "bfloat16"
    assert set(engine.runtime) >= {"auto_dtype", "cpu_bf16", "cpu_capability", "compile"}
    from asymagent.kv.attention import grouped_rows_exact
    assert engine.runtime["grouped_attention"] is grouped_rows_exact()  # bf16 on the CPU
    assert Engine(verifier=make_model(seed=0)).runtime["grouped_attention"] is False  # float32
    assert "bfloat16" in cpu_dtype.describe(engine.runtime)


@pytest.mark.parametrize("static_kv", [False, True])
def test_bf16_greedy_identity_across_modes(static_kv):
    verifier = _bf16(make_model(seed=0, head_scale=2.0))
    drafter = _bf16(noisy_copy(make_model(seed=0, head_scale=2.0), noise=1.0))  # partial drafter
    spec = SpecConfig(k=3, adaptive_k=False, beta=0.0, acceptance="greedy")
    engine = Engine(verifier=verifier, drafter=drafter, spec=spec, static_kv=static_kv)
    assert greedy_modes_agree(engine) > 0  # the modes agree; rejections: the rollback path ran in bf16 too


def test_logits_reach_the_gate_as_float32():
    from asymagent.kv.cache import ModelCache

    cache = ModelCache(_bf16(make_model(seed=0)))
    assert cache.forward_logits([5, 6, 7], keep=2).dtype == torch.float32


def test_int8_runs_and_stays_close_to_float32():
    from asymagent.modeling.quantize import quantize_int8

    ref = make_model(seed=0, head_scale=2.0)
    q = quantize_int8(make_model(seed=0, head_scale=2.0))
    assert cpu_dtype.dtype_name(q) == "int8"
    assert isinstance(q.model.layers[0].mlp.up_proj, torch.ao.nn.quantized.dynamic.Linear)
    assert isinstance(q.lm_head, torch.nn.Linear)  # the head (and so the logits) stay float
    ids = torch.tensor(random_prompts(8, length=20, seed=2))  # [8, 20]
    with torch.no_grad():
        a, b = ref(ids).logits.argmax(-1), q(ids).logits.argmax(-1)  # [8, 20]
    # int8 weights of a 2-layer model: top-1 agrees at nearly every position (measured 0.99+)
    assert (a == b).float().mean().item() > 0.9
    engine = Engine(verifier=q, drafter=make_model(seed=1, layers=1),
                    spec=SpecConfig(k=3, adaptive_k=False))
    out = engine.generate(random_prompts(1, length=20)[0], mode="asym", max_new_tokens=8)
    assert len(out.token_ids) == 8 and engine.runtime["dtype"] == "int8"
    with pytest.raises(ValueError, match="float32"):
        quantize_int8(_bf16(make_model(seed=0)))


@pytest.mark.parametrize("cap, unit", [("", "amx_bf16"), ("AVX512_CORE_AMX", "amx_bf16"),
                                       ("avx512_core_bf16", "avx512_bf16"), ("AVX2", None)])
def test_a_onednn_isa_cap_leaves_out_the_units_it_forbids(monkeypatch, no_probe_cache, cap, unit):
    """Under ONEDNN_MAX_CPU_ISA (an emulated CPU kind, `make test-cpu-kinds`) the bf16 unit is the
    one oneDNN may use: an AMX CPU capped at AVX512_CORE_BF16 is an AVX512-BF16 one, capped at
    AVX2 it has none (float32 chosen)."""
    monkeypatch.delenv("ASYMAGENT_CPU_BF16", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda path=cpu_dtype.CPUINFO: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    assert cpu_dtype.cpu_bf16_support() == unit
    assert cpu_dtype.auto_dtype("cpu") == (torch.float32 if unit is None else torch.bfloat16)
