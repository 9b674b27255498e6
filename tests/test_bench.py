"""Tests of `asymagent bench`: peer accounting, the JSON schema (docs/architecture.md §6), the CLI path."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from asymagent.evals.bench import bench
from asymagent.evals.bench.bench_peers import PeerStep, account, run_peer

MODE_KEYS = {"wall_s", "per_step_s", "output_tokens", "verifier_prefill_tokens", "verifier_flops",
             "fidelity_vs_full", "speedup_vs_full"}
SPEC_KEYS = {"acceptance_rate", "mean_accepted_len", "acceptance_by_position"}


@pytest.fixture(scope="module")
def tiny_setup():
    from conftest import make_tiny_smollm_engine

    from asymagent.evals.running.engine_setup import EngineSetup

    return EngineSetup(make_tiny_smollm_engine(), "tiny-verifier", "tiny-drafter", False)


class _Flops:
    def forward(self, t, c):
        return float(t)  # count fed tokens: makes the FLOPs sum easy to check


def test_account_reconstructs_drafts_and_accepts():
    """Prompt 40; forwards as transformers' prompt lookup makes them (see bench_peers docstring):
    prefill (40,0) emits 1; (2,40): 1 candidate, next cache 42 -> 1 accepted, emits 2;
    (3,42): 2 candidates, next cache 45 -> 2 accepted, emits 3; (6,45): 5 candidates, last
    forward: 12 out - 6 emitted - 1 = 5 accepted."""
    step = account(PeerStep([5] * 12, 0.1, [(40, 0), (2, 40), (3, 42), (6, 45)]), 40, _Flops())
    assert (step.drafted, step.accepted, step.rounds) == (8, 8, 3)
    assert step.verifier_prefill_tokens == 40 and step.verifier_flops == 51.0  # 40 + 2 + 3 + 6 fed
    assert step.reached_by_position == [3, 2, 1, 1, 1] and step.accepted_by_position == [3, 2, 1, 1, 1]
    # a rejection: (4,40) holds 3 candidates, the next cache is 41 -> 0 accepted, 1 token emitted
    step = account(PeerStep([5] * 3, 0.1, [(40, 0), (4, 40), (1, 41)]), 40, _Flops())
    assert (step.drafted, step.accepted) == (3, 0)
    assert step.reached_by_position == [1] and step.accepted_by_position == [0]


def test_peers_match_plain_greedy(tiny_setup):
    """All three peers decode greedily: same tokens as stock generate on the same prompt."""
    eng = tiny_setup.engine
    prompt = torch.randint(3, 1000, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    outs = {p: run_peer(p, eng.verifier, prompt, max_new_tokens=10, eos_ids=sorted(eng.eos_ids), pad_id=2,
                        flops=eng.flops, drafter=eng.drafter, prompt_lookup_tokens=4)
            for p in ("hf_generate", "hf_prompt_lookup", "hf_assisted")}
    ref = outs["hf_generate"].token_ids
    assert 1 <= len(ref) <= 10
    assert all(o.token_ids == ref for o in outs.values())
    assert outs["hf_generate"].drafted == 0 and outs["hf_generate"].verifier_prefill_tokens >= 60
    with pytest.raises(ValueError, match="unknown peer"):
        run_peer("vllm", eng.verifier, prompt, max_new_tokens=2, eos_ids=[2], pad_id=2, flops=eng.flops)


def test_workload_rules():
    w = bench.workload("records", 0, 12)
    assert w["steps"] == 12 and len(w["histories"]) == 12
    assert all(len(a) < len(b) for a, b in zip(w["histories"], w["histories"][1:]))  # histories grow
    with pytest.raises(ValueError, match="held-out"):
        bench.workload("records", 100_000, 2)
    with pytest.raises(ValueError, match="fewer than"):
        bench.workload("injection", 0, 40)


def test_bench_cli_writes_the_schema(tiny_setup, tmp_path, monkeypatch, capsys):
    """The `bench` verb end to end on a tiny engine: 2 steps, 1 repeat, every mode and peer."""
    import asymagent.evals.running.engine_setup as setup_mod

    monkeypatch.setattr(setup_mod, "build_engine", lambda *a, **k: tiny_setup)
    import asymagent.evals.bench.machine_limits as limits

    monkeypatch.setattr(limits, "MATMUL_N", 256)  # the same measurement, small and quick
    monkeypatch.setattr(limits, "COPY_MIB", 16)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "bench.json"
    args = p.parse_args(["--json", str(out), "--steps", "2", "--repeats", "1", "--max-new-tokens", "6"])
    assert bench.main(args) == 0
    data = json.loads(out.read_text())
    assert set(data) >= {"verifier", "drafter", "workload", "modes"}
    assert "partial" not in data  # the step-1 partial file was replaced by the finished run
    assert data["workload"]["steps"] == 2 and data["drafter"] == "tiny-drafter"
    from asymagent.evals.bench.llama_cpp_peer import available

    # the llama.cpp peer is optional: skipped with a note when llama-cpp-python does not load
    skipped = {bench.LLAMA_CPP} if available() is not None else set()
    assert set(data["modes"]) == set(bench.ALL_MODES) - skipped
    assert (data["settings"]["llama_cpp_note"].startswith("skipped") if skipped
            else data["modes"][bench.LLAMA_CPP]["decode_ms_per_token"] > 0)
    assert data["machine"]["copy_gbps"] > 0 and data["machine"]["matmul_tflops_bf16"] > 0
    assert data["machine"]["decode_bound_ms"] > 0 and data["runtime"]["dtype"] == "float32"
    assert data["modes"]["full"]["prefill_tok_s"] > 0 and data["modes"]["asym"]["decode_ms_per_token"] > 0
    for m, d in data["modes"].items():
        assert MODE_KEYS <= set(d), m
        assert len(d["per_step_s"]) == 2 and d["wall_s"] > 0
        if m in bench.SPECULATIVE:
            assert SPEC_KEYS <= set(d), m
    full = data["modes"]["full"]
    assert full["speedup_vs_full"] == 1.0 and full["fidelity_vs_full"] == 1.0
    # greedy and lossless: stock generate on the same rendered prompt, and spec, reproduce full
    assert data["modes"]["hf_generate"]["fidelity_vs_full"] == 1.0
    assert data["modes"]["spec"]["fidelity_vs_full"] == 1.0
    # step 2 holds a ~500-token listing, over the default tool_output budget (64 head + 32 tail
    # tokens), so the verifier's view in compressed/asym is shorter than the full one
    assert data["modes"]["asym"]["mean_compression_ratio"] < 1.0
    assert full["mean_compression_ratio"] == 1.0
    assert "hf_assisted" in capsys.readouterr().out  # the printed table

    from asymagent.evals.bench.report import write_results

    md = write_results(data, [], tmp_path / "results.md", notes="Hand-written analysis.")
    write_results(data, [], md)  # regenerating keeps the notes block
    text = md.read_text()
    assert text.count("Hand-written analysis.") == 1 and "| `hf_prompt_lookup` |" in text
    assert (tmp_path / "results" / "bench_cumulative_latency.png").stat().st_size > 1000  # a real PNG


def test_bench_requires_full(tiny_setup):
    w = bench.workload("records", 0, 1)
    with pytest.raises(ValueError, match="needs mode 'full'"):
        bench.run_bench(tiny_setup.engine, w, ["asym"], repeats=1, progress=False)
    with pytest.raises(ValueError, match="repeats"):
        bench.run_bench(tiny_setup.engine, w, ["full"], repeats=0, progress=False)


def test_hf_generate_prefix_reuse_prefills_only_new_tokens(tiny_setup):
    """A carried DynamicCache: the second, extending prompt prefills only its new tokens and
    decodes exactly what a cold `generate` on it decodes; a diverging prompt is cropped back to
    the common prefix first."""
    from asymagent.evals.bench.bench_peers import PeerPrefix

    eng = tiny_setup.engine
    g = torch.Generator().manual_seed(1)
    p1 = torch.randint(3, 1000, (60,), generator=g).tolist()
    p2 = p1 + torch.randint(3, 1000, (25,), generator=g).tolist()
    p3 = p1[:40] + torch.randint(3, 1000, (30,), generator=g).tolist()  # diverges at 40
    kw = dict(max_new_tokens=8, eos_ids=sorted(eng.eos_ids), pad_id=2, flops=eng.flops)
    prefix = PeerPrefix()
    first = run_peer("hf_generate", eng.verifier, p1, prefix=prefix, **kw)
    assert first.verifier_prefill_tokens == 60 and first.forwards[0] == (60, 0)
    for prompt, cached in ((p2, 60), (p3, 40)):
        warm = run_peer("hf_generate", eng.verifier, prompt, prefix=prefix, **kw)
        cold = run_peer("hf_generate", eng.verifier, prompt, **kw)
        assert warm.token_ids == cold.token_ids
        assert warm.forwards[0] == (len(prompt) - cached, cached)
        assert warm.verifier_prefill_tokens == len(prompt) - cached < cold.verifier_prefill_tokens
    with pytest.raises(ValueError, match="cannot reuse a prefix"):
        run_peer("hf_prompt_lookup", eng.verifier, p1, prefix=PeerPrefix(), **kw)


def test_short_chat_runs_every_variant_greedy_and_lossless_in_spec(tiny_setup):
    from asymagent.evals.suites.short_chat import VARIANTS, run

    before = tiny_setup.engine.spec
    res = run(tiny_setup.engine, ["Hello there, what is the weather?", "List three colours."],
              repeats=1, max_new_tokens=6)
    assert set(res) == {name for name, _, _ in VARIANTS}
    assert all(r["tokens"] > 0 and r["total_s"] > 0 for r in res.values())
    # spec is lossless against full at temperature 0, with and without adaptive K
    assert res["spec"]["same_as_full"] == 2 and res["spec+adaptive_k"]["same_as_full"] == 2
    assert tiny_setup.engine.spec is before  # the engine's own config is restored afterwards


def test_bootstrap_interval_brackets_the_ratio_and_collapses_without_noise():
    # two modes, 3 repeats x 4 steps; b is exactly half of a on every step and repeat
    a = [[2.0, 4.0, 6.0, 8.0]] * 3
    b = [[1.0, 2.0, 3.0, 4.0]] * 3
    assert bench.bootstrap_ratio(a, b, 4) == pytest.approx([2.0, 2.0])
    # noisy repeats: the interval widens and still brackets the ratio of the sums
    b_noisy = [[1.0, 2.0, 3.0, 4.0], [1.3, 2.5, 3.2, 4.4], [0.8, 1.9, 2.7, 3.9]]
    lo, hi = bench.bootstrap_ratio(a, b_noisy, 4)
    ratio = sum(a[0]) / (sum(map(sum, b_noisy)) / 3)
    assert lo < ratio < hi and hi - lo > 0.05
    assert bench.bootstrap_ratio(a, b_noisy, 4) == [lo, hi]  # seeded: same data, same interval


def test_each_compared_label_gets_its_own_suffix_store():
    from asymagent.evals.running.engine_setup import use_suffix_store

    class FakeEngine:
        suffix_store = None

    engine = FakeEngine()
    use_suffix_store(engine, "full")
    engine.suffix_store.add([1, 2, 3])
    use_suffix_store(engine, "asym")
    assert len(engine.suffix_store) == 0  # asym never sees full's responses
    use_suffix_store(engine, "full")
    assert len(engine.suffix_store) == 1


def test_dtype_labels_run_on_their_engine(tiny_setup):
    """'full@float32' runs mode full on the engine of that dtype (here the same tiny engine, so
    its tokens equal full's); peers take no '@dtype'."""
    bench.check_modes(["full", "full@float32", "asym@int8"], 1)
    with pytest.raises(ValueError, match="only our modes"):
        bench.check_modes(["full", "hf_generate@bfloat16"], 1)
    with pytest.raises(ValueError, match="unknown dtype"):
        bench.check_modes(["full", "full@float8"], 1)
    w = bench.workload("records", 0, 1)
    res = bench.run_bench(tiny_setup.engine, w, ["full", "full@float32"], repeats=1, progress=False,
                          max_new_tokens=4, engines={"float32": tiny_setup.engine})
    assert res["modes"]["full@float32"]["fidelity_vs_full"] == 1.0
    assert "full/full@float32" in res["pairs"]


def test_bench_engine_takes_a_model_drafter(tmp_path):
    """`asymagent bench MODEL --drafter MODEL` (a .gguf, a directory): the drafter is loaded as an
    LM drafter, as Engine.from_pretrained does, not read as a train-drafter .safetensors."""
    from conftest import make_tiny_llama

    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.modeling.loading import load_default_verifier

    tok = load_default_verifier().tokenizer
    for name, layers in (("verifier", 2), ("drafter", 1)):
        model = make_tiny_llama(vocab_size=len(tok), layers=layers, hidden=32, heads=4, kv_heads=2)
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    setup = build_engine(str(tmp_path / "verifier"), str(tmp_path / "drafter"), dtype="float32")
    assert not setup.fallback and "LM drafter" in setup.drafter
    assert setup.engine.drafter.config.num_hidden_layers == 1
    ids = setup.engine.tokenizer("hello")["input_ids"]
    assert len(setup.engine.generate(ids, mode="spec", max_new_tokens=3).token_ids) >= 1
