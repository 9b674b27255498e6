"""forward_many (asymagent/kv/batched_forward.py): several sequences' rows in one forward, every
logit, hidden state and cached key/value bit-identical to each sequence's own forward."""

import pytest
import torch

from asymagent.kv.attention import use_gqa_attention
from asymagent.kv.batched_forward import MAX_ROWS, SeqCall, batchable, forward_many
from asymagent.kv.lean_forward import attach, lean_of
from asymagent.modeling.packed_linear import kernel_available, pack_linears
from conftest import (compare_batched_with_alone as _compare, floor_linear_downs, make_tiny_llama,
                      make_tiny_qwen2, prefilled_caches as _caches)

needs_packed = pytest.mark.skipif(kernel_available() is not None,
                                  reason=f"no packed bf16 linear kernel: {kernel_available()}")


def _bf16_model(make=make_tiny_llama, **shape):
    model = make(**shape).to(torch.bfloat16)
    use_gqa_attention(model)
    assert pack_linears(model).packed > 0
    assert attach(model).fused
    return model


@needs_packed
@torch.inference_mode()
def test_rows_of_several_sequences_score_as_each_alone_tiny(cpu_kind):
    model = _bf16_model(hidden=128, heads=4, kv_heads=2, layers=2)
    _compare(model, [70, 5, 130, 33], [[1, 1, 1, 1], [4, 1, 7, 2], [1, 8, 1, 3], [5, 5, 5, 5],
                                       [2, 1, 6, 1], [1, 1, 1, 1]])


@needs_packed
@torch.inference_mode()
def test_up_to_max_rows_and_groups_of_three(cpu_kind):
    """Nine query heads over three key/value heads (the embedded verifier's grouping), ragged
    rows up to MAX_ROWS in all."""
    model = _bf16_model(hidden=144, heads=9, kv_heads=3, layers=2)
    _compare(model, [40, 300, 1, 64, 90, 12, 7, 2],
             [[1] * 8, [4, 1, 6, 1, 2, 1, 1, 16], [2, 3, 1, 9, 1, 4, 1, 1], [1] * 8], seed=1)


@needs_packed
@torch.inference_mode()
def test_qwen2_qkv_biases_score_as_each_alone(cpu_kind):
    """Qwen2 (the reference pair's family): random q/k/v biases added inside the fused kernel;
    its forwards batch (model_batchable) and every row keeps its own forward's bits."""
    from asymagent.kv.batched_forward import model_batchable

    model = _bf16_model(make_tiny_qwen2, hidden=128, heads=4, kv_heads=2, layers=2)
    assert lean_of(model).layers[0].qkv_bias is not None
    assert model_batchable(lean_of(model))
    _compare(model, [70, 5, 130, 33], [[1, 1, 1, 1], [4, 1, 7, 2], [1, 8, 1, 3], [2, 1, 6, 1]],
             seed=3)


@needs_packed
@pytest.mark.parametrize("make", [make_tiny_llama, make_tiny_qwen2], ids=["llama", "qwen2"])
@torch.inference_mode()
def test_floor_linear_down_projections_batch_with_each_rows_bits(monkeypatch, make, cpu_kind):
    """Down projections on F.linear (FloorLinear, rows padded to a floor of 2), as the reference
    pair's 1.5B has them on the AMX machine: the model batches (F.linear over every sequence's
    rows at once) and every row keeps its own forward's bits, a one-row decode included."""
    from asymagent.kv.batched_forward import model_batchable

    model = make(hidden=128, heads=4, kv_heads=2, layers=2).to(torch.bfloat16)
    use_gqa_attention(model)
    assert pack_linears(model).packed > 0
    floor_linear_downs(model, monkeypatch)
    assert attach(model).fused
    lean = lean_of(model)
    assert model_batchable(lean)
    _compare(model, [70, 5, 130, 33, 9], [[1, 1, 1, 1, 1], [4, 1, 7, 2, 1], [1, 8, 1, 3, 2],
                                          [2, 1, 6, 1, 1], [1, 1, 1, 1, 1]], seed=5)
    lean.layers[1].down.max_rows = MAX_ROWS - 1  # a batched forward could exceed its padded rows
    assert not model_batchable(lean)


@needs_packed
@torch.inference_mode()
def test_a_bias_outside_the_family_is_not_batchable():
    """A Llama whose o projection carries a bias is not on the fused road's shape: alone."""
    from asymagent.kv.batched_forward import model_batchable

    model = _bf16_model(hidden=128, heads=4, kv_heads=2, layers=2)
    lean = lean_of(model)
    assert model_batchable(lean)
    lay = lean.layers[0]
    lay.o.bias = torch.nn.Parameter(torch.zeros(lay.o.out_features, dtype=torch.bfloat16))
    assert not model_batchable(lean)


@needs_packed
@torch.inference_mode()
def test_refuses_more_rows_than_one_packed_call():
    model = _bf16_model(hidden=128, heads=4, kv_heads=2, layers=2)
    lean = lean_of(model)
    caches = _caches(model, [[1, 2, 3], [4, 5, 6]])
    calls = [SeqCall(lean, caches[0], [7] * 20, 1), SeqCall(lean, caches[1], [8] * 20, 1)]
    with pytest.raises(ValueError, match="rows"):
        forward_many(calls)
    assert not batchable(SeqCall(lean, caches[0], [7] * (MAX_ROWS + 1), 1))


@torch.inference_mode()
def test_float32_is_not_batchable():
    """float32 has no packed kernel: its forwards run one by one (run_one), never batched."""
    model = make_tiny_llama(hidden=64, heads=4, kv_heads=2, layers=2)
    use_gqa_attention(model)
    attach(model)
    cache = _caches(model, [[1, 2, 3]])[0]
    assert not batchable(SeqCall(lean_of(model), cache, [4], 1))


@pytest.mark.slow
@needs_packed
@torch.inference_mode()
def test_the_embedded_verifier_rows_score_as_each_alone(default_verifier, cpu_kind):
    """The embedded verifier's own shapes (30 layers, 9 heads over 3, vocab 49152), bf16."""
    import copy

    model = copy.deepcopy(default_verifier.model).to(torch.bfloat16)
    use_gqa_attention(model)
    pack_linears(model)
    assert attach(model).fused
    _compare(model, [300, 20, 700, 64, 5, 129, 1000, 2],
             [[1] * 8, [5, 1, 1, 4, 1, 8, 1, 3], [1, 2, 1, 1, 6, 1, 1, 1]], seed=2)
