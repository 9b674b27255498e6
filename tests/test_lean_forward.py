"""LeanForward (asymagent/kv/lean_forward.py): transformers' Llama forward as straight-line
code, the same logits and hidden states bit for bit, attached by the engine."""

import copy

import pytest
import torch

from asymagent.kv import growing_cache
from asymagent.kv.attention import use_gqa_attention
from asymagent.kv.cache import ModelCache
from asymagent.kv.growing_cache import GrowingCache
from asymagent.kv import lean_forward
from asymagent.kv.lean_forward import ATTR, attach, lean_of, why_not
from asymagent.modeling.packed_linear import kernel_available, pack_linears
from conftest import TINY_FAMILIES, floor_linear_downs, make_tiny_llama, make_tiny_qwen2

needs_packed = pytest.mark.skipif(kernel_available() is not None,
                                  reason=f"no packed bf16 linear kernel: {kernel_available()}")


FAMILIES = pytest.mark.parametrize("family", sorted(TINY_FAMILIES))


def _model(dtype=torch.float32, seed: int = 0, pack: bool = False, family: str = "llama"):
    model = TINY_FAMILIES[family](hidden=128, heads=4, kv_heads=2, layers=2, seed=seed).to(dtype)
    use_gqa_attention(model)
    if pack:
        assert pack_linears(model).packed > 0
    return model


def _run_both(model, lengths, seed: int = 0):
    """Feed the same chunks through transformers and through the lean forward (each on its own
    ModelCache); returns the pairs of logits [keep, V] and hidden states [T, H]."""
    g = torch.Generator().manual_seed(seed)
    plain, lean = ModelCache(model), ModelCache(model)
    pairs = []
    for n in lengths:
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        saved = getattr(model, ATTR)
        setattr(model, ATTR, None)  # transformers' forward
        a = plain.forward_logits(ids, keep=n)
        ha = plain.forward_hidden(ids[:1])
        setattr(model, ATTR, saved)
        b = lean.forward_logits(ids, keep=n)
        hb = lean.forward_hidden(ids[:1])
        pairs.append((n, a, b, ha, hb))
    assert lean_of(model) is not None
    return pairs


@FAMILIES
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_logits_and_hidden_states_as_transformers(dtype, family):
    """Prefill, decode steps and verify forwards: every logit and hidden state bit-identical."""
    model = _model(dtype, family=family)
    report = attach(model)
    assert report.attached and report.why is None
    for n, a, b, ha, hb in _run_both(model, [70, 1, 1, 5, 2, 33, 1, 100, 3]):
        assert torch.equal(a, b), f"{n}-token forward: logits differ"
        assert torch.equal(ha, hb), f"{n}-token forward: hidden states differ"


@needs_packed
@FAMILIES
def test_fused_packed_kernels_same_bits_as_the_separate_layers(family):
    """bf16 with packed linears: q|k|v (with Qwen2's biases) and gate|up run as one kernel each,
    same bits."""
    model = _model(torch.bfloat16, pack=True, family=family)
    report = attach(model)
    assert report.attached and report.fused
    for n, a, b, ha, hb in _run_both(model, [70, 1, 4, 1, 32, 33, 2]):
        assert torch.equal(a, b), f"{n}-token forward: logits differ"
        assert torch.equal(ha, hb)


@needs_packed
def test_a_weight_changed_in_place_is_fused_again():
    model = _model(torch.bfloat16, pack=True)
    assert attach(model).fused
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
        model.model.layers[1].mlp.up_proj.weight.add_(0.01)
    for n, a, b, _, _ in _run_both(model, [40, 1, 3]):
        assert torch.equal(a, b), f"{n}-token forward after an in-place change: logits differ"


def test_position_scored_the_same_whatever_the_forward_length():
    """bf16 on the CPU (aligned reads, grouped attention): a position's logits are the same in
    a 1..32-token forward through the lean forward, as through transformers'."""
    model = _model(torch.bfloat16, pack=kernel_available() is None)
    assert attach(model).attached
    lean = lean_of(model)
    ids = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(5))
    cache = GrowingCache(config=model.config, attend_align=growing_cache.ATTEND_ALIGN)
    rows = {}
    with torch.inference_mode():
        lean.body_forward(ids, cache)
        for t in (1, 2, 3, 5, 9, 16, 17, 24, 32):
            rows[t] = lean.logits(torch.arange(7, 7 + t)[None], cache, t)[0, 0]  # [V]
            cache.crop(-t)
    for t, row in rows.items():
        assert torch.equal(row, rows[1]), f"position scored differently in a {t}-token forward"


def test_mask_equals_transformers_mask_on_aligned_reads():
    from transformers.masking_utils import create_causal_mask

    model = _model(torch.bfloat16)
    lean = lean_forward.LeanForward(model, fuse=False)
    cache = GrowingCache(config=model.config, attend_align=growing_cache.ATTEND_ALIGN)
    with torch.inference_mode():
        for past, rows in ((0, 70), (70, 1), (71, 5), (76, 32), (108, 1), (109, 64)):
            x = torch.zeros(1, rows, model.config.hidden_size, dtype=torch.bfloat16)
            pos = (torch.arange(rows) + past)[None]
            want = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=None,
                                      cache=cache, position_ids=pos)
            got = lean._mask(cache, x, pos, past, rows)
            assert want is not None and torch.equal(got, want), (past, rows)
            lean.body_forward(torch.zeros(1, rows, dtype=torch.long), cache)  # advance the cache


def test_refused_models_and_switches(monkeypatch):
    model = _model()
    monkeypatch.setenv("ASYMAGENT_LEAN_FORWARD", "0")
    assert why_not(model) == "ASYMAGENT_LEAN_FORWARD=0"
    assert not attach(model).attached and getattr(model, ATTR, None) is None
    monkeypatch.delenv("ASYMAGENT_LEAN_FORWARD")
    assert attach(model).attached and lean_of(model) is not None
    monkeypatch.setenv("ASYMAGENT_LEAN_FORWARD", "off")  # turned off after attaching: not used
    assert lean_of(model) is None
    monkeypatch.delenv("ASYMAGENT_LEAN_FORWARD")
    biased = make_tiny_llama()
    biased.config.attention_bias = True
    assert "bias" in why_not(biased)
    assert why_not(make_tiny_qwen2()) is None  # Qwen2's q/k/v biases are its family's
    windowed = make_tiny_qwen2()
    windowed.config.use_sliding_window = True
    assert "sliding" in why_not(windowed)
    assert "LlamaForCausalLM" in why_not(torch.nn.Linear(2, 2))
    # a copy carries no LeanForward (its fused kernels belong to the original's weights)
    twin = copy.deepcopy(model)
    assert getattr(twin, ATTR) is None and lean_of(model) is not None


def test_a_model_that_differs_is_left_on_transformers(monkeypatch):
    """The attach-time check: a lean forward whose logits differ is not attached."""
    model = _model()
    real = lean_forward.LeanForward.logits

    def off_by_one_ulp(self, input_ids, cache, keep):
        out = real(self, input_ids, cache, keep)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    monkeypatch.setattr(lean_forward.LeanForward, "logits", off_by_one_ulp)
    report = attach(model)
    assert not report.attached and "differ" in report.why and lean_of(model) is None


@FAMILIES
def test_engine_attaches_and_reports(monkeypatch, family):
    from asymagent.engine import Engine

    engine = Engine(_model(seed=1, family=family), _model(seed=2, family=family))
    assert engine.runtime["lean_forward"] == {"verifier": "on", "drafter": "on"}
    assert lean_of(engine.verifier) is not None
    monkeypatch.setenv("ASYMAGENT_LEAN_FORWARD", "0")
    off = Engine(_model(seed=1, family=family))
    assert off.runtime["lean_forward"] == {"verifier": "off: ASYMAGENT_LEAN_FORWARD=0"}


@FAMILIES
@pytest.mark.parametrize("mode", ["full", "spec", "asym"])
def test_engine_greedy_tokens_equal_with_and_without(monkeypatch, mode, family):
    from asymagent.engine import Engine

    prompt = torch.randint(3, 256, (120,), generator=torch.Generator().manual_seed(9)).tolist()
    outs = []
    for off in ("0", "1"):
        monkeypatch.setenv("ASYMAGENT_LEAN_FORWARD", off)
        engine = Engine(_model(torch.bfloat16, seed=1, family=family),
                        _model(torch.bfloat16, seed=2, family=family))
        outs.append(engine.generate(prompt, mode=mode, max_new_tokens=24, temperature=0.0).token_ids)
    assert outs[0] == outs[1]


def test_a_hooked_model_runs_through_transformers():
    """Forward hooks on the model see every forward: with one registered, ModelCache calls the
    model's own forward (a hook's observations are the same either way)."""
    model = _model()
    assert attach(model).attached
    seen = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                             with_kwargs=True)
    try:
        assert lean_of(model) is None
        ModelCache(model).forward_logits([5, 6, 7], keep=1)
    finally:
        handle.remove()
    assert seen == [3] and lean_of(model) is not None


@needs_packed
@FAMILIES
@pytest.mark.parametrize("down", ["packed", "floor"])
def test_direct_road_same_bits_and_cache_as_the_general_loop(monkeypatch, family, down, cpu_kind):
    """bf16, packed, grouped rows: decode and verify forwards take the direct road (each layer one
    function, its checks made once per forward) and give the general loop's logits and cached keys
    and values bit for bit, through cache growth (a layer without room takes the general loop).
    `floor`: the down projections left on F.linear (FloorLinear, rows padded to its floor), as
    the reference pair's 1.5B has them."""
    model = _model(torch.bfloat16, pack=True, family=family)
    if down == "floor":
        floor_linear_downs(model, monkeypatch)
    assert attach(model).fused
    used = []
    real = lean_forward._direct_layer
    monkeypatch.setattr(lean_forward, "_direct_layer", lambda *a: used.append(1) or real(*a))
    g = torch.Generator().manual_seed(3)
    general, direct = ModelCache(model), ModelCache(model)
    lengths = [70, 1, 4, 1, 17, 32, 2] + [1] * 300 + [3, 33, 1]
    capacity = None
    for n in lengths:
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        with lean_forward.general_loop():
            before = len(used)
            a = general.forward_logits(ids, keep=n)
            assert len(used) == before, "general_loop() took the direct road"
        before = len(used)
        held = direct.cache.layers[0].buffers()[0].shape[-2] if direct.cache is not None else None
        b = direct.forward_logits(ids, keep=n)
        assert torch.equal(a, b), f"{n}-token forward: logits differ"
        grew = held is not None and direct.cache.layers[0].buffers()[0].shape[-2] != held
        if n <= 32 and held is not None and not grew:  # a forward that grows the cache: general loop
            assert len(used) - before == len(model.model.layers), f"a {n}-token forward left the direct road"
        capacity = capacity or direct.cache.layers[0].buffers()[0].shape[-2]
    assert direct.cache.layers[0].buffers()[0].shape[-2] > capacity, "the cache never grew"
    for la, lb in zip(general.cache.layers, direct.cache.layers):
        assert la.get_seq_length() == lb.get_seq_length() == sum(lengths)
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


@needs_packed
def test_direct_road_pads_packed_downs_beside_floor_linear_ones(monkeypatch, cpu_kind):
    """Layer 0's down projection a FloorLinear, layer 1's packed with a row floor of 2 (as on a
    CPU where one row alone differs): a one-row forward on the direct road must still give the
    packed down 2 rows (it checks every packed layer's floor, not layer 0's kinds only), and
    the logits and cache equal the general loop's."""
    from asymagent.modeling import packed_linear

    model = _model(torch.bfloat16, pack=True, family="qwen2")
    floor_linear_downs(model, monkeypatch, layers=(0,))
    assert attach(model).fused
    packed_down = model.model.layers[1].mlp.down_proj
    assert type(packed_down) is packed_linear.PackedLinear
    inter = model.config.intermediate_size
    real_floor = packed_linear._linear_floor
    monkeypatch.setattr(packed_linear, "_linear_floor", lambda dtype, shape, threads, packed:
                        2 if packed and shape[1] == inter else real_floor(dtype, shape, threads, packed))
    rows_seen, real_forward = [], packed_linear.packed_forward

    def spy(x, packed, bias=None):
        if packed is packed_down.current_packed():
            rows_seen.append(x.numel() // x.shape[-1])
        return real_forward(x, packed, bias)

    monkeypatch.setattr(packed_linear, "packed_forward", spy)
    g = torch.Generator().manual_seed(5)
    general, direct = ModelCache(model), ModelCache(model)
    for n in (70, 1, 3, 1, 1):
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        with lean_forward.general_loop():
            a = general.forward_logits(ids, keep=n)
        b = direct.forward_logits(ids, keep=n)
        assert torch.equal(a, b), f"{n}-token forward: logits differ"
    assert rows_seen and min(rows_seen) >= 2, rows_seen
    for la, lb in zip(general.cache.layers, direct.cache.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_direct_road_not_taken_in_float32(monkeypatch):
    """float32 has no packed kernels and no grouped rows: every layer runs the general loop."""
    model = _model(torch.float32)
    assert attach(model).attached
    monkeypatch.setattr(lean_forward, "_direct_layer", lambda *a: pytest.fail("direct road in float32"))
    cache = ModelCache(model)
    for n in (40, 1, 4, 1):
        cache.forward_logits(list(range(10, 10 + n)), keep=n)


@needs_packed
def test_direct_road_failure_falls_back_to_the_general_loop(monkeypatch):
    """A kernel failure on the direct road switches packing off (once, with a warning) and the
    general loop re-runs the layer: the same logits and cache as a forward without the road."""
    from asymagent.modeling import packed_linear

    model = _model(torch.bfloat16, pack=True)
    assert attach(model).fused
    monkeypatch.setitem(packed_linear._DISABLED, "why", None)  # restored after the test
    general, direct = ModelCache(model), ModelCache(model)
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(4)).tolist()
    for c in (general, direct):
        c.forward_logits(ids, keep=1)
    with lean_forward.general_loop():
        want = general.forward_logits([5, 6, 7], keep=3)

    def broken(*args):
        raise RuntimeError("kernel gone")

    monkeypatch.setattr(lean_forward, "_direct_layer", broken)
    with pytest.warns(RuntimeWarning, match="kernel gone"):
        got = direct.forward_logits([5, 6, 7], keep=3)
    assert packed_linear._DISABLED["why"] is not None
    assert torch.equal(got, want)
    for la, lb in zip(general.cache.layers, direct.cache.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
