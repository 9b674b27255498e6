"""The packed bf16 linear (asymagent/modeling/packed_linear.py): same bits as F.linear, fallbacks.

The packed kernel only runs where oneDNN has it (bf16 CPU); elsewhere `pack_linears` leaves the
model alone and these tests check that instead. Bit identity is what keeps greedy tokens
identical to the unpacked model's, so it is compared exactly (torch.equal), never with a tolerance.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from asymagent.engine import Engine
from asymagent.modeling import packed_linear
from asymagent.modeling.row_floor import pad_rows
from asymagent.modeling.packed_linear import (MAX_PACKED_ROWS, linear_floor, PackedLinear, pack_linears,
                                              packed_count, unpack_linears)
from asymagent.spec_config import SpecConfig
from test_engine_models import make_model, noisy_copy, random_prompts

HAVE_KERNEL = packed_linear.kernel_available() is None
needs_kernel = pytest.mark.skipif(not HAVE_KERNEL, reason="no oneDNN packed bf16 linear here")


def _linear(n_out: int, n_in: int, bias: bool = False, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_in, n_out, bias=bias)).to(torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("shape", [(576, 576), (192, 576), (1536, 576), (576, 1536), (256, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_rows_equal_f_linear_bit_for_bit(shape, bias):
    seq = _linear(*shape, bias=bias)
    ref = seq[0].weight.detach().clone(), None if seq[0].bias is None else seq[0].bias.detach().clone()
    assert pack_linears(seq).packed == 1 and type(seq[0]) is PackedLinear
    gen = torch.Generator().manual_seed(1)
    floor = linear_floor(torch.bfloat16, shape)  # one row runs as `floor` rows (asymagent/modeling/row_floor.py)
    with torch.inference_mode():
        for rows in list(range(1, MAX_PACKED_ROWS + 1)) + [17, 40]:
            x = torch.randn(rows, shape[1], generator=gen).to(torch.bfloat16)  # [rows, in]
            want = F.linear(pad_rows(x, floor, 0) if rows <= MAX_PACKED_ROWS else x, *ref)[:rows]
            assert torch.equal(seq(x), want), rows
            # a batched [1, rows, in] input (what the decoder layers pass) and row 0 alone: one
            # position, one score, whatever the row count (the reason for the floor)
            assert torch.equal(seq(x[None])[0], want), rows
            assert torch.equal(seq(x[:1])[0], seq(x)[0]), rows


@needs_kernel
def test_tied_head_stays_tied_and_follows_in_place_edits():
    from conftest import make_tiny_llama

    model = make_tiny_llama(vocab_size=256, layers=2, hidden=64, seed=0).to(torch.bfloat16).eval()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's
    keys = set(model.state_dict())
    report = pack_linears(model)
    assert report.packed == packed_count(model) == 2 * 7 + 1  # q k v o gate up down per layer + head
    assert report.extra_bytes == sum(m.weight.numel() * 2 for m in model.modules()
                                     if type(m) is PackedLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert set(model.state_dict()) == keys
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        before = model(ids).logits
        model.model.embed_tokens.weight.mul_(2)  # the tied head changes with it
        after = model(ids[:, :1]).logits
    assert not torch.equal(before[:, :1], after)
    unpack_linears(model)
    assert packed_count(model) == 0 and type(model.lm_head) is torch.nn.Linear
    with torch.inference_mode():
        assert torch.equal(model(ids[:, :1]).logits, after)


@needs_kernel
def test_autograd_and_float32_use_f_linear():
    seq = _linear(32, 16)
    pack_linears(seq)
    x = torch.randn(2, 16, dtype=torch.bfloat16, requires_grad=True)
    seq(x).sum().backward()  # the packed op has no backward: grad mode must route to F.linear
    assert x.grad is not None and seq[0].weight.grad is not None
    fp32 = torch.nn.Sequential(torch.nn.Linear(16, 32))
    assert pack_linears(fp32).packed == 0 and type(fp32[0]) is torch.nn.Linear


def test_env_switch_and_missing_kernel_leave_the_model_alone(monkeypatch):
    monkeypatch.setenv("ASYMAGENT_PACKED_LINEAR", "0")
    seq = _linear(32, 16)
    report = pack_linears(seq)
    assert report.packed == 0 and report.skipped_why and type(seq[0]) is torch.nn.Linear
    monkeypatch.delenv("ASYMAGENT_PACKED_LINEAR")
    monkeypatch.setattr(packed_linear, "kernel_available", lambda: "no op in this torch")
    assert pack_linears(seq).skipped_why == "no op in this torch"


@needs_kernel
def test_a_failing_kernel_warns_once_and_falls_back(monkeypatch):
    seq = _linear(32, 16)
    pack_linears(seq)
    monkeypatch.setitem(packed_linear._DISABLED, "why", None)

    def broken(*args):
        raise RuntimeError("oneDNN says no")

    monkeypatch.setattr(packed_linear, "packed_forward", broken)
    x = torch.randn(1, 16, dtype=torch.bfloat16)
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a, b = seq(x), seq(x)
    assert torch.equal(a, F.linear(x, seq[0].weight)) and torch.equal(a, b)
    assert sum("packed bf16 linear failed" in str(w.message) for w in caught) == 1


@needs_kernel
def test_a_layer_that_differs_stays_unpacked(monkeypatch):
    seq = _linear(32, 16)
    monkeypatch.setattr(packed_linear, "_identical", lambda *a, **k: False)
    with pytest.warns(RuntimeWarning, match="left unpacked"):
        report = pack_linears(seq)
    assert report.packed == 0 and report.not_identical == ["0"]
    assert type(seq[0]) is packed_linear.FloorLinear  # F.linear with its rows padded to its floor
    assert unpack_linears(seq) == 1 and type(seq[0]) is torch.nn.Linear


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_an_unpacked_layer_scores_a_row_alike_alone_and_among_rows(monkeypatch, bias):
    """The Qwen2.5-Coder 1.5B's down_proj shape: F.linear over 8,960 inputs gives one row other bits
    than the same row among 2+ rows on the Intel AMX machine; left unpacked, the layer pads its rows
    to F.linear's floor, so a one-token decode and a K+1 verify score a position alike."""
    seq = _linear(1536, 8960, bias=bias, seed=3)
    monkeypatch.setattr(packed_linear, "_identical", lambda *a, **k: False)
    with pytest.warns(RuntimeWarning, match="left unpacked"):
        pack_linears(seq)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 17, 8960, generator=g).to(torch.bfloat16)  # [1, 17, in]
    with torch.inference_mode():
        alone = torch.cat([seq(x[:, i:i + 1]) for i in range(17)], dim=1)  # [1, 17, out]
        for rows in (2, 3, 5, 17):
            assert torch.equal(seq(x[:, :rows]), alone[:, :rows]), rows
        if linear_floor(torch.bfloat16, (1536, 8960), packed=False) == 1:
            assert torch.equal(alone, F.linear(x, seq[0].weight, seq[0].bias))


@needs_kernel
@pytest.mark.parametrize("static_kv", [False, True])
def test_engine_packs_bf16_models_and_tokens_do_not_change(static_kv, monkeypatch):
    spec = SpecConfig(k=3, adaptive_k=False, beta=0.0, acceptance="greedy")

    def engine(packed: bool) -> Engine:
        monkeypatch.setenv("ASYMAGENT_PACKED_LINEAR", "1" if packed else "0")
        verifier = make_model(seed=0, head_scale=2.0).to(torch.bfloat16)
        drafter = noisy_copy(make_model(seed=0, head_scale=2.0), noise=1.0).to(torch.bfloat16)
        return Engine(verifier=verifier, drafter=drafter, spec=spec, static_kv=static_kv)

    on, off = engine(True), engine(False)
    assert on.runtime["packed_linears"] == 2 * (2 * 7 + 1) and off.runtime["packed_linears"] == 0
    for prompt in random_prompts(1, length=30, seed=5):
        for mode in ("full", "spec", "asym"):
            a = on.generate(prompt, mode=mode, max_new_tokens=12, cache_key=mode)
            b = off.generate(prompt, mode=mode, max_new_tokens=12, cache_key=mode)
            assert a.token_ids == b.token_ids, mode


@pytest.mark.slow
@needs_kernel
def test_embedded_default_logits_are_bit_identical():
    """The embedded verifier in bf16, 300 tokens of context: the logits of a one-token decode and
    of 2..16-row verify forwards equal the unpacked model's bit for bit."""
    from asymagent.kv.attention import use_gqa_attention
    from asymagent.modeling.loading import load_default_verifier

    model = load_default_verifier(dtype=torch.bfloat16).model
    use_gqa_attention(model)
    ids = torch.arange(1000, 1300)[None]  # [1, 300]
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values

        def step(rows: int) -> torch.Tensor:
            out = model(torch.arange(7, 7 + rows)[None], cache=cache, use_cache=True).logits
            cache.crop(-rows)
            return out  # [1, rows, V]

        rows = (1, 2, 4, 5, 9, 16)
        plain = {n: step(n) for n in rows}
        assert pack_linears(model).packed == 30 * 7 + 1
        for n in rows:
            assert torch.equal(step(n), plain[n]), n


@needs_kernel
def test_draft_head_rows_equal_f_linear():
    """The drafter's heads (reduced draft vocabulary and full) through packed modules: same bits."""
    from asymagent.decoding.model_drafter import DraftHead

    model = make_model(seed=0, head_scale=2.0).to(torch.bfloat16)
    pack_linears(model)
    head = DraftHead(model, torch.tensor([3, 9, 40, 41, 200]))
    assert type(head.draft_linear) is PackedLinear and type(head.head) is PackedLinear
    w = model.lm_head.weight
    hidden = torch.randn(4, w.shape[1]).to(torch.bfloat16)  # [4, H]
    assert torch.equal(head.draft_logits(hidden[0]), F.linear(hidden[0], w[head.vocab]).float())
    assert torch.equal(head.full_logits(hidden), F.linear(hidden, w).float())


@needs_kernel
def test_a_packed_model_copies_and_saves(tmp_path, monkeypatch):
    """deepcopy and torch.save leave the (uncopyable) packed tensor out; it is re-made on use
    (also for a copy made under inference_mode, whose weights have no version counter)."""
    import copy

    monkeypatch.setitem(packed_linear._DISABLED, "why", None)  # restored even if this fails

    seq = _linear(32, 16)
    pack_linears(seq)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        ref = seq(x)
        twin = copy.deepcopy(seq)
        assert type(twin[0]) is PackedLinear and torch.equal(twin(x), ref)
        assert twin[0].packed_weight is not None and twin[0].packed_weight is not seq[0].packed_weight
        torch.save(seq, tmp_path / "m.pt")
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
        assert torch.equal(loaded(x), ref)
    assert packed_linear._DISABLED["why"] is None  # nothing fell back
