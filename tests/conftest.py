"""Shared fixtures: tiny randomly initialised Llama models and the embedded tokenizer.

Tiny models are made in the test (no downloads). The real SmolLM2 tokenizer comes from the
embedded GGUF package (loaded once per machine, then cached by asymagent.modeling.loading).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_tiny_llama(vocab_size: int = 256, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, seed: int = 0, max_positions: int = 2048):
    """A randomly initialised LlamaForCausalLM small enough for unit tests (fp32, eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    model = LlamaForCausalLM(config)
    # Random init gives near-uniform logits; scale the head so distributions are peaked enough
    # to make acceptance tests meaningful (both accept and reject paths get exercised).
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    model.eval()
    return model


def make_tiny_qwen2(vocab_size: int = 256, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, seed: int = 0, max_positions: int = 2048):
    """A randomly initialised Qwen2ForCausalLM of the reference pair's layout (q/k/v biases, rope
    theta 1e6, tied head, GQA) small enough for unit tests (fp32, eval mode)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True, rope_theta=1e6,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)  # peaked distributions, as make_tiny_llama
        for layer in model.model.layers:  # random biases (init leaves them 0: a bias bug hides)
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    model.eval()
    return model


TINY_FAMILIES = {"llama": make_tiny_llama, "qwen2": make_tiny_qwen2}


def floor_linear_downs(model, monkeypatch, floor: int = 2, layers=None) -> None:
    """Make every packed down projection of `model` a FloorLinear, as `pack_linears` makes a
    layer whose packed bits differ from F.linear's (the reference pair's 1.5B on the AMX
    machine), with F.linear's row floor forced to `floor` (that machine's: one row alone
    padded to two): the road a real model takes where this machine's kernels agree. `layers`:
    only these decoder layers (the reference pair's 0.5B has 5 of its 24 so)."""
    from asymagent.modeling import packed_linear

    real = packed_linear._linear_floor
    monkeypatch.setattr(packed_linear, "_linear_floor",
                        lambda dtype, shape, threads, packed: real(dtype, shape, threads, packed)
                        if packed else max(floor, real(dtype, shape, threads, packed)))
    for index, layer in enumerate(model.model.layers):
        if layers is not None and index not in layers:
            continue
        down = layer.mlp.down_proj
        assert type(down) is packed_linear.PackedLinear
        down.__class__ = packed_linear.FloorLinear
        down.packed_weight, down.packed_key = None, None


# The row floors other CPU kinds probe (docs/cpu.md), to run the floor-dependent tests as if on
# them: (attention floor, linear floor, grouped rows exact). "amx": this Intel AMX machine's own;
# "avx512_bf16": an AMD EPYC with AVX512-BF16 and no AMX (issue 53: attention 4, a linear over
# 1536 inputs 2); "att8_lin4": the largest candidates (row_floor.py); "per_head": a kernel whose
# grouped rows do not give the per-head bits (the grouped path off), with the AMD floors.
CPU_KINDS = {"amx": (2, 1, True), "avx512_bf16": (4, 2, True), "att8_lin4": (8, 4, True),
             "per_head": (4, 2, False)}


def force_floors(monkeypatch, attention: int, linear: int, grouped: bool) -> None:
    """Make this machine's probes answer as another CPU kind's: `attention_floor` at least
    `attention`, every linear floor (packed, F.linear, the weight-only kernels) at least `linear`,
    `grouped_rows_exact()` `grouped`. At least: a floor under this machine's own would make rows
    differ for real, a larger one is a floor on this machine too (its rows agree from its own
    floor on, so they agree padded further). The probes' cached functions are patched (their
    functools caches and the on-disk record never see the forced values)."""
    from asymagent.kv import attention as attention_mod
    from asymagent.modeling import packed_linear, weight_only

    real_attention = attention_mod._attention_floor
    monkeypatch.setattr(attention_mod, "_attention_floor",
                        lambda dtype, threads: max(attention, real_attention(dtype, threads)))
    real_grouped = attention_mod._grouped_rows_exact
    monkeypatch.setattr(attention_mod, "_grouped_rows_exact",
                        lambda threads: grouped and real_grouped(threads))
    real_linear = packed_linear._linear_floor
    monkeypatch.setattr(packed_linear, "_linear_floor", lambda dtype, shape, threads, packed:
                        max(linear, real_linear(dtype, shape, threads, packed)))
    real_lowbit = weight_only._row_floor

    def lowbit(kind, dtype, shape, threads, kernel="torch"):
        floor = real_lowbit(kind, dtype, shape, threads, kernel)
        return None if floor is None else max(linear, floor)

    monkeypatch.setattr(weight_only, "_row_floor", lowbit)


@pytest.fixture(params=sorted(CPU_KINDS))
def cpu_kind(request, monkeypatch):
    """The test runs once per CPU kind of CPU_KINDS, with this machine's floors forced to that
    kind's (`force_floors`); the kind's name."""
    force_floors(monkeypatch, *CPU_KINDS[request.param])
    return request.param


@pytest.fixture
def tiny_llama():
    return make_tiny_llama


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The real SmolLM2 tokenizer (vocab 49152), from the embedded GGUF package."""
    from asymagent.modeling.loading import load_default_verifier

    try:
        return load_default_verifier().tokenizer
    except FileNotFoundError as exc:  # pragma: no cover - the Makefile always installs it
        pytest.skip(f"embedded verifier not installed: {exc}")


@pytest.fixture(scope="session")
def default_verifier():
    """The embedded SmolLM2-135M-Instruct verifier (slow tests only)."""
    from asymagent.modeling.loading import load_default_verifier

    return load_default_verifier()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def make_tiny_smollm_engine():
    """Engine over a random 2-layer verifier with the real SmolLM2 vocabulary (49152) and a
    1-layer drafter sharing its embeddings and head; default CompressionConfig. For tests that
    need real chat rendering (evals, bench) at tiny-model cost."""
    from asymagent.modeling.drafter import build_drafter
    from asymagent.engine import Engine
    from asymagent.modeling.loading import load_default_verifier
    from asymagent.context.views import CompressionConfig

    tok = load_default_verifier().tokenizer
    verifier = make_tiny_llama(vocab_size=len(tok), layers=2, hidden=32, heads=4, kv_heads=2,
                               max_positions=16384)
    drafter = build_drafter(verifier, num_layers=1)
    return Engine(verifier, drafter, tok, compression=CompressionConfig(), max_sessions=8)


# ------------------------------------------------------------- the CLI's checks (test_cli_*.py)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any attempt to read weights fails the test: the checks must refuse first."""
    from asymagent.modeling import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    for name in ("load_model", "load_gguf", "load_default_verifier"):
        monkeypatch.setattr(loading, name, refuse)


@pytest.fixture
def run_cli(capsys):
    """run_cli(argv) -> (exit code, stderr) of `asymagent ARGV` run in this process."""
    from asymagent.integrations import cli

    def run(argv) -> tuple[int, str]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        return exit_info.value.code, capsys.readouterr().err

    return run


def prefilled_caches(model, prompts):
    """A GrowingCache per prompt, prefilled through the lean forward (as the engine does)."""
    from asymagent.kv.batched_forward import SeqCall, run_one
    from asymagent.kv.growing_cache import for_model
    from asymagent.kv.lean_forward import lean_of

    lean = lean_of(model)
    caches = []
    for p in prompts:
        cache = for_model(model)
        run_one(SeqCall(lean, cache, p, keep=None))
        caches.append(cache)
    return caches


def _cached_kv(cache, layer):
    keys, values = cache.layers[layer].keys, cache.layers[layer].values
    return keys.clone(), values.clone()


def compare_batched_with_alone(model, prompt_lens, steps, seed=0):
    """Two identical sets of sequences (`prompt_lens` random tokens each, prefilled); each step of
    `steps` feeds every sequence its number of tokens, one set one forward per sequence
    (`run_one`), the other one `forward_many`: logits, hidden states and every layer's cached
    keys and values compared bit for bit (asymagent/kv/batched_forward.py). Call under
    `torch.inference_mode()`."""
    from asymagent.kv.batched_forward import SeqCall, batchable, forward_many, run_one
    from asymagent.kv.lean_forward import lean_of

    lean = lean_of(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in prompt_lens]
    alone, together = prefilled_caches(model, prompts), prefilled_caches(model, prompts)
    for rows in steps:  # rows per sequence this step; keep: logits of the last rows, or hidden
        ids = [torch.randint(0, vocab, (r,), generator=g).tolist() for r in rows]
        keeps = [None if j % 3 == 2 else max(1, r - j % 2) for j, r in enumerate(rows)]
        one = [run_one(SeqCall(lean, c, i, k)) for c, i, k in zip(alone, ids, keeps)]
        calls = [SeqCall(lean, c, i, k) for c, i, k in zip(together, ids, keeps)]
        assert all(batchable(c) for c in calls)
        many = forward_many(calls)
        for j, (a, b) in enumerate(zip(one, many)):
            assert a.shape == b.shape
            assert torch.equal(a, b), f"step {rows}, sequence {j}: outputs differ " \
                f"(max {(a.float() - b.float()).abs().max().item():.3g})"
        for ca, cb in zip(alone, together):
            assert ca.get_seq_length() == cb.get_seq_length()
            for layer in range(model.config.num_hidden_layers):
                ka, va = _cached_kv(ca, layer)
                kb, vb = _cached_kv(cb, layer)
                assert torch.equal(ka, kb) and torch.equal(va, vb)


def _pair_missing() -> str | None:
    """Why the reference pair cannot run here (its part packages missing), or None."""
    from asymagent.modeling.pairs import PairNotInstalledError, check_pair

    try:
        check_pair("qwen2.5-coder")
    except PairNotInstalledError as exc:
        return str(exc)
    return None


PAIR_MISSING = _pair_missing()


def pair_marks() -> list:
    """The marks of a module that runs the reference pair: `pair`, `slow`, and skipped cleanly
    where its parts are not installed (`make setup-pair`; CI never downloads its 1.6 GB)."""
    return [pytest.mark.pair, pytest.mark.slow,
            pytest.mark.skipif(PAIR_MISSING is not None, reason=f"the pair is not installed: {PAIR_MISSING}")]


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray (2 CPUs) for one test module's Ray runs; skipped where Ray is not installed."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
