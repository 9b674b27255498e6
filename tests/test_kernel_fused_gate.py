"""The Triton gate kernels against the torch reference (CPU via TRITON_INTERPRET=1; GPU if present).

Triton reads TRITON_INTERPRET when it is imported (its own library functions are decorated
then), so the interpreter tests run in a child pytest process with the variable set:
`test_interpreter_suite` starts it; the child runs the tests marked `interpreted`.
Equality is exact for accepted counts and tokens: the kernel computes the fused scores with the
same float operations in the same order as the reference (argmax ties break identically), and
consumes the same uniforms and exponentials for sampling. JSD sums V terms in a different order
(lane-wise, then across lanes, then across slices), hence the 1e-4 tolerance (observed
differences are ~1e-6). The kernels split each row over V (kernels/gate_kernels.py); on CPU a
fixed small split (INTERPRET_SPLITS) is always used, and the split tests force others.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from asymagent.kernels import GateNoise, draw_gate_noise, fused_gate, fused_gate_reference
from asymagent.kernels.fused_gate import fused_gate_triton, split_plan, triton

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [
    pytest.mark.skipif(triton is None, reason="needs the triton package"),
    # the interpreter evaluates both sides of tl.where with numpy (-inf - -inf in masked lanes)
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]
interpreted = pytest.mark.skipif(not IN_INTERPRETER,
                                 reason="runs in the TRITON_INTERPRET=1 child process")

RUNS = [  # (rule, temperature, fuse_bonus); exact at T=0 runs the greedy code path
    ("cda", 0.0, True), ("greedy", 0.0, True), ("exact", 1.0, True), ("exact", 0.7, False),
]
RUNS_MASKED = RUNS + [("cda", 0.0, False)]  # the interpreter is slow: fuse_bonus x cda once


@pytest.mark.skipif(IN_INTERPRETER, reason="this is the child process")
def test_interpreter_suite():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu",
           "-W", "ignore::RuntimeWarning", __file__]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert f"{N_INTERPRETED} passed" in proc.stdout, tail  # every interpreted test ran


@pytest.mark.skipif(IN_INTERPRETER, reason="needs the compiling (non-interpreted) triton")
def test_kernel_compiles_for_hopper_without_spills():
    # No GPU is needed to compile: Triton ships ptxas. This catches GPU-only compile errors
    # (the interpreter accepts more than the compiler) and register spills in CI.
    import pathlib

    from asymagent.kernels.bench import compile_report, parse_args

    tools = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists():
        pytest.skip("this triton build has no NVIDIA backend tools")
    rows = compile_report(parse_args(["--compile-only", "--arch", "90"]))
    assert {(r["rule"], r["views"]) for r in rows} == {("cda", 2), ("greedy", 2), ("exact", 2),
                                                       ("exact", 1), ("greedy", 1)}
    assert {r["kernel"] for r in rows} == {"gate_stats", "gate_jsd", "gate_race", "gate_finish",
                                           "gate_fused"}
    for row in rows:
        assert row["local_bytes"] == 0 and row["spill_stores"] == 0, row  # no register spills
        assert row["registers"] <= 255, row  # the per-thread hardware limit


def make_case(batch: int, k: int, vocab: int, scale: float, dtype: torch.dtype, seed: int,
              masked: bool = False):
    """Correlated views (so drafts get accepted sometimes) and drafts near the drafter's argmax."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, k + 1, vocab)
    common = torch.randn(shape, generator=g) * scale
    ver = common + 0.5 * scale * torch.randn(shape, generator=g)
    aug = common + 0.5 * scale * torch.randn(shape, generator=g)
    base = aug + 0.3 * scale * torch.randn(shape, generator=g)
    drafts = aug[:, :k].argmax(-1)  # [B, K]
    swap = torch.rand((batch, k), generator=g) < 0.3
    drafts = torch.where(swap, torch.randint(0, vocab, (batch, k), generator=g), drafts)
    if masked:  # a constraint on the verifier, a reduced draft vocabulary, a base-view mask
        ver[..., vocab // 2:] = float("-inf")
        aug[..., (3 * vocab) // 4:] = float("-inf")
        base[..., vocab // 3: vocab // 2] = float("-inf")
    return ver.to(dtype), aug.to(dtype), base.to(dtype), drafts


def assert_same(kernel, ref, label):
    assert torch.equal(kernel.num_accepted, ref.num_accepted), label
    assert torch.equal(kernel.next_token, ref.next_token), label
    assert torch.allclose(kernel.jsd, ref.jsd, atol=1e-4, rtol=0), label


# CASES, masked/fp16, multi-block/hand-built/dispatch, no drafts, split plan, SPLIT_CASES,
# masked slices + ties, bench rows, one launch, divergence gate
N_INTERPRETED = 12 + 2 + 3 + 1 + 1 + 4 + 2 + 1 + 3 + 3
CASES = [  # (V, K, B, scale, dtype): every V x K pair, B / scale / dtype rotating over them
    (50, 1, 1, 1.0, torch.float32), (50, 2, 3, 4.0, torch.bfloat16),
    (50, 5, 1, 0.3, torch.float32), (50, 8, 3, 2.0, torch.bfloat16),
    (1000, 1, 3, 2.0, torch.bfloat16), (1000, 2, 1, 1.0, torch.float32),
    (1000, 5, 3, 4.0, torch.float32), (1000, 8, 1, 0.3, torch.bfloat16),
    (4099, 1, 1, 4.0, torch.float32), (4099, 2, 3, 0.3, torch.bfloat16),
    (4099, 5, 1, 2.0, torch.bfloat16), (4099, 8, 3, 1.0, torch.float32),
]


@interpreted
@pytest.mark.parametrize("vocab, k, batch, scale, dtype", CASES)
def test_kernel_matches_reference(vocab, k, batch, scale, dtype):
    ver, aug, base, drafts = make_case(batch, k, vocab, scale, dtype, seed=vocab + k)
    noise = draw_gate_noise(batch, k, vocab, generator=torch.Generator().manual_seed(k))
    for rule, temp, fuse_bonus in RUNS:
        kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp,
                      fuse_bonus=fuse_bonus, noise=noise)
        ref = fused_gate_reference(ver, aug, base, drafts, **kwargs)
        out = fused_gate_triton(ver, aug, base, drafts, **kwargs)
        assert_same(out, ref, (rule, temp, fuse_bonus))


@interpreted
@pytest.mark.parametrize("beta, gamma", [(0.0, 0.5), (2.0, 0.3)])
def test_kernel_matches_reference_masked_and_fp16(beta, gamma):
    ver, aug, base, drafts = make_case(3, 4, 300, 2.0, torch.float16, seed=5, masked=True)
    proposal = aug[:, :4].clone()
    proposal[..., 100:] = float("-inf")  # drafts sampled from a reduced vocabulary
    noise = draw_gate_noise(3, 4, 300, generator=torch.Generator().manual_seed(1))
    for rule, temp, fuse_bonus in RUNS_MASKED:
        for prop in ((None, proposal) if rule == "exact" else (None,)):
            kwargs = dict(beta=beta, gamma=gamma, acceptance=rule, temperature=temp,
                          fuse_bonus=fuse_bonus, noise=noise, proposal_logits=prop)
            ref = fused_gate_reference(ver, aug, base, drafts, **kwargs)
            out = fused_gate_triton(ver, aug, base, drafts, **kwargs)
            assert torch.isfinite(out.jsd).all()
            assert_same(out, ref, (rule, temp, fuse_bonus, prop is None))


@interpreted
def test_kernel_multi_block_online_rescaling():
    # V = 1000 in blocks of 128 lanes (7 full blocks and a partial one): the running
    # (max, sum-exp) is rescaled across blocks; the first blocks of some rows are all -inf.
    ver, aug, base, drafts = make_case(2, 3, 1000, 3.0, torch.float32, seed=9)
    ver[0, :, :300] = float("-inf")
    aug[1, :, :260] = float("-inf")
    base[1, :, :400] = float("-inf")
    drafts = drafts.clamp_min(400)  # drafts the verifier allows
    noise = draw_gate_noise(2, 3, 1000, generator=torch.Generator().manual_seed(2))
    for rule, temp, fuse_bonus in RUNS:
        kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp,
                      fuse_bonus=fuse_bonus, noise=noise)
        ref = fused_gate_reference(ver, aug, base, drafts, **kwargs)
        out = fused_gate_triton(ver, aug, base, drafts, block_v=128, **kwargs)
        assert_same(out, ref, (rule, temp, fuse_bonus))


@interpreted
def test_kernel_hand_built_cases():
    # identical views: JSD = 0; disjoint supports: JSD = ln 2 (natural log)
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 3).log()[None]  # [1, 3, 4]
    same = fused_gate_triton(probs, probs, probs, torch.tensor([[0, 0]]), beta=1.0, gamma=0.5)
    assert (same.jsd.abs() < 1e-6).all()
    # p_v = p_b and gamma_eff = gamma = 0.5: p_v(d) > 0.5 p_b(d) holds, every draft passes
    assert same.num_accepted.tolist() == [2] and same.next_token.tolist() == [0]
    aug = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 3).log()[None]
    base = torch.tensor([[0.0, 0.0, 0.5, 0.5]] * 3).log()[None]
    ver = torch.tensor([[0.6, 0.1, 0.15, 0.15]] * 3).log()[None]
    apart = fused_gate_triton(ver, aug, base, torch.tensor([[2, 1]]), beta=1.0, gamma=0.5)
    assert torch.allclose(apart.jsd, torch.full((1, 3), math.log(2.0)), atol=1e-6)
    # draft 2: p_v = 0.15 > gamma/2 * p_b = 0.125 passes; draft 1: p_b = 0 < p_v passes too
    assert apart.num_accepted.tolist() == [2] and apart.next_token.tolist() == [0]
    # first reject: draft 3 has p_v = 0.03 < 0.5 * p_b = 0.05 with identical drafter views
    low = torch.tensor([[0.5, 0.3, 0.17, 0.03]] * 3).log()[None]
    first = fused_gate_triton(low, probs, probs, torch.tensor([[3, 0]]), beta=1.0, gamma=0.5)
    assert first.num_accepted.tolist() == [0] and first.next_token.tolist() == [0]


@interpreted
def test_dispatch_env_forces_triton_on_cpu(monkeypatch):
    ver, aug, base, drafts = make_case(2, 4, 64, 1.0, torch.float32, seed=3)
    # strided views, as sliced out of [B, S, V] model outputs: rows 1..3 of 5 positions
    ver, aug, base, drafts = ver[:, 1:4], aug[:, 1:4], base[:, 1:4], drafts[:, 1:3]
    assert not ver.is_contiguous()
    monkeypatch.setenv("ASYMAGENT_GATE", "triton")
    forced = fused_gate(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    monkeypatch.setenv("ASYMAGENT_GATE", "torch")
    eager = fused_gate(ver, aug, base, drafts, beta=1.0, gamma=0.5)
    assert_same(forced, eager, "dispatch")


VIEWS = ("two", "one", "none")  # base and drafter rows; base_logits=None; drafter_logits=None too


def run_views(ver, aug, base, drafts, label, views=VIEWS, runs=RUNS, **launch):
    """Kernel == reference for every rule of `runs` and every drafter-view layout of `views`."""
    k, vocab = drafts.shape[1], ver.shape[-1]
    noise = draw_gate_noise(ver.shape[0], k, vocab, generator=torch.Generator().manual_seed(k))
    for rule, temp, fuse_bonus in runs:
        for layout in views:
            a = None if layout == "none" else aug
            b = base if layout == "two" else None
            kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp,
                          fuse_bonus=fuse_bonus, noise=noise,
                          proposal_logits=aug[:, :k] if layout == "none" else None)
            ref = fused_gate_reference(ver, a, b, drafts, **kwargs)
            out = fused_gate_triton(ver, a, b, drafts, **kwargs, **launch)
            assert_same(out, ref, (label, rule, temp, fuse_bonus, layout))
            if layout == "one":
                assert (out.jsd == 0).all()  # one view: exactly 0, as the reference


@interpreted
def test_split_kernel_no_drafts():
    # K = 0, one row per sequence: asym's fused plain step (decoding/round.py) calls the gate so
    ver, aug, base, drafts = make_case(2, 0, 300, 2.0, torch.float32, seed=11)
    assert drafts.shape == (2, 0)
    run_views(ver, aug, base, drafts, "K=0")

def test_split_plan_covers_every_column_once():
    import importlib

    gate = importlib.import_module("asymagent.kernels.fused_gate")  # the module, not the function
    cuda = torch.device("cuda")
    for vocab in (1, 50, 1000, 4099, 151936, 262144):
        for block_v in (16, 128, 1024):
            for forced in (None, 1, 2, 3, 7, 10 ** 6):
                for rows in (1, 9, 576):
                    plan = split_plan(rows, vocab, block_v, torch.device("cpu"), forced)
                    n, chunk = plan
                    assert chunk % block_v == 0 and n >= 1
                    assert (n - 1) * chunk < vocab <= n * chunk, (vocab, block_v, forced, plan)
                    assert n <= -(-vocab // block_v)  # never more slices than blocks
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gate, "sm_count", lambda device: 132)
        # small batches get many slices, large ones few: ~PROGRAMS_PER_SM x 132 programs
        assert split_plan(9, 151936, 1024, cuda) == (75, 2048)
        assert split_plan(576, 151936, 1024, cuda) == (2, 76800)
        assert split_plan(2000, 151936, 1024, cuda)[0] == 1


SPLIT_CASES = [  # (V, K, B, BLOCK_V, forced splits) -> slices: none divides V evenly
    (1000, 2, 2, 64, 5),  # 4 slices of 256, the last 232 wide
    (777, 3, 1, 32, 7),  # 7 slices of 128, the last 9 wide
    (300, 2, 1, 16, 19),  # 19 one-block slices, the last 12 wide
    (1000, 1, 3, 128, 1),  # no split: one program sweeps the whole row
]


@interpreted
@pytest.mark.parametrize("vocab, k, batch, block_v, splits", SPLIT_CASES)
def test_split_kernel_matches_reference(vocab, k, batch, block_v, splits):
    ver, aug, base, drafts = make_case(batch, k, vocab, 2.0, torch.bfloat16, seed=vocab + splits)
    run_views(ver, aug, base, drafts, (vocab, splits), block_v=block_v, splits=splits)


@interpreted
def test_split_kernel_masked_slices():
    # whole slices -inf in one view at a time, a row masked only in its first or last slice, a
    # verifier row masked everywhere (cda/greedy: emits token 0 as the reference's argmax)
    vocab, k, batch = 600, 2, 3  # BLOCK_V 32, splits 6 -> 5 slices of 128 (the last 88 wide)
    ver, aug, base, drafts = make_case(batch, k, vocab, 3.0, torch.float32, seed=11)
    ver[0, :, :256] = float("-inf")  # the first two slices of every verifier row
    aug[0, 1, 128:384] = float("-inf")  # two middle slices of one full-view row
    base[1, :, 512:] = float("-inf")  # the ragged last slice of the compressed view
    base[2, 0, :128] = float("-inf")
    aug[2, 2, 512:] = float("-inf")
    drafts[0] = torch.tensor([300, 5])  # allowed in v, masked in v
    drafts[1, 1] = 600 - 1  # in the ragged last slice
    run_views(ver, aug, base, drafts, "masked", block_v=32, splits=6)
    ver[2, 1] = float("-inf")  # a verifier row with nothing allowed
    for rule in ("cda", "greedy"):
        for b in (base, None):
            kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, block_v=32, splits=6)
            out = fused_gate_triton(ver, aug, b, drafts, **kwargs)
            kwargs.pop("block_v"), kwargs.pop("splits")
            assert_same(out, fused_gate_reference(ver, aug, b, drafts, **kwargs), (rule, "all -inf"))


@interpreted
def test_split_kernel_ties_across_slice_boundaries():
    # BLOCK_V 16, 4 slices of 64 columns: the row maximum sits on both sides of a boundary and
    # again later; the first index must win for the fused argmax (cda, greedy) and for the
    # exponential race (exact, with equal Exp(1) draws the race is an argmax of p)
    vocab, k = 256, 2
    ver = torch.randn(2, k + 1, vocab, generator=torch.Generator().manual_seed(3))
    ver[0, :, [63, 64, 200]] = 9.0  # last lane of slice 0, first lane of slice 1, slice 3
    ver[1, :, [128, 191, 192]] = 9.0  # first and last lane of slice 2, first of slice 3
    aug = torch.randn(2, k + 1, vocab, generator=torch.Generator().manual_seed(4))
    base = aug.clone()  # two views that agree: delta 0 exactly, the fused score is v
    drafts = torch.tensor([[64, 63], [191, 128]])
    noise = GateNoise(uniform=torch.full((2, k), 0.5), exponential=torch.ones(2, vocab))
    for rule, temp, fuse_bonus in RUNS:
        for b in (base, None):
            kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp,
                          fuse_bonus=fuse_bonus, noise=noise)
            ref = fused_gate_reference(ver, aug, b, drafts, **kwargs)
            out = fused_gate_triton(ver, aug, b, drafts, block_v=16, splits=4, **kwargs)
            assert_same(out, ref, (rule, temp, b is None))
            if rule == "greedy":  # the first index of the tie is the argmax: 63 / 128
                assert out.num_accepted.tolist() == [0, 0]
                assert out.next_token.tolist() == [63, 128]


@interpreted
def test_bench_gpu_rows_code_path(monkeypatch):
    # the GPU bench's row code, run on CPU with a stand-in timer (times nothing real)
    from asymagent.kernels import bench

    monkeypatch.setattr(bench, "_time_ms", lambda fn, device: (fn(), 1.0)[1])
    args = bench.parse_args(["--vocabs", "300", "--ks", "2", "--batches", "1", "--peak-gbps",
                             "1000", "--variants", "kernel", "kernel_s1", "eager", "graph"])
    (row,) = bench.bench_gpu(args, device="cpu")
    assert row["splits"] == 2 and row["kernel_ms"] == row["eager_ms"] == row["graph_ms"] == 1.0
    assert row["x_of_bound"] == 1.0 / row["bound_ms"] and row["speedup_vs_eager"] == 1.0


ONE_LAUNCH_CASES = [  # (V, K, B, BLOCK_V, splits): uneven slices, one slice, B up to the limit
    (1000, 3, 2, 64, 5), (777, 2, 1, 32, 1), (300, 1, 8, 16, 3),
]


@interpreted
@pytest.mark.parametrize("vocab, k, batch, block_v, splits", ONE_LAUNCH_CASES)
def test_one_launch_and_separate_passes_match_reference(vocab, k, batch, block_v, splits):
    # gate_fused (the finish in the last program of each row / sequence) and the separate
    # passes give the reference's verdicts; called twice, so the counters were left at 0
    ver, aug, base, drafts = make_case(batch, k, vocab, 2.0, torch.float32, seed=vocab + k,
                                       masked=vocab == 1000)
    for rule in ("cda", "greedy"):
        for b in (base, None):
            kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule)
            ref = fused_gate_reference(ver, aug, b, drafts, **kwargs)
            for fused in (True, False, True):
                out = fused_gate_triton(ver, aug, b, drafts, block_v=block_v, splits=splits,
                                        fused=fused, **kwargs)
                assert_same(out, ref, (rule, b is None, fused))
    import importlib

    dispatch = importlib.import_module("asymagent.kernels.fused_gate")  # the module
    counters = dispatch.fused_counters(ver.device, batch * (k + 1) + batch)
    assert int(counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("batch, vocab", [(1, 151936), (8, 151936), (64, 49152)])
def test_gate_on_cuda_one_launch_and_captured(batch, vocab):
    # one launch (B <= 8) and the passes equal the reference; a CUDA graph of the dispatched
    # gate replays to the same verdicts on new inputs (the counters reset every replay)
    k = 8
    cases = [tuple(t.cuda() for t in make_case(batch, k, vocab, 3.0, torch.bfloat16, seed=s))
             for s in (1, 2, 3)]
    kwargs = dict(beta=1.0, gamma=0.5, acceptance="cda")
    refs = [fused_gate_reference(*case, **kwargs) for case in cases]
    for fused in (True, False):
        assert_same(fused_gate_triton(*cases[0], fused=fused, **kwargs), refs[0], fused)
    static = [t.clone() for t in cases[0]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fused_gate(*static, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_gate(*static, **kwargs)
    for case, ref in zip(cases + cases, refs + refs):
        for dst, src in zip(static, case):
            dst.copy_(src)
        graph.replay()
        assert_same(out, ref, ("graph", batch))


@pytest.mark.gpu
@pytest.mark.parametrize("vocab, k, batch", [(49152, 2, 1), (151936, 8, 16), (262144, 4, 3)])
def test_kernel_on_cuda_matches_reference(vocab, k, batch):
    torch.manual_seed(vocab)
    ver, aug, base, drafts = (t.cuda() for t in make_case(batch, k, vocab, 3.0,
                                                          torch.bfloat16, seed=k))
    noise = draw_gate_noise(batch, k, vocab, device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(0))
    for rule, temp, fuse_bonus in RUNS:
        kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp,
                      fuse_bonus=fuse_bonus, noise=noise)
        ref = fused_gate_reference(ver, aug, base, drafts, **kwargs)
        out = fused_gate(ver, aug, base, drafts, **kwargs)  # CUDA dispatches to Triton
        # fp fusion is off in the kernel, so the fused scores are bit-identical to torch's;
        # only lse-based threshold tests could differ, and only within float rounding.
        assert_same(out, ref, (vocab, rule, temp, fuse_bonus))


DIVERGENCE_CASES = [  # (V, K, B, BLOCK_V, splits, masked): uneven slices, masks, one slice
    (1000, 3, 4, 64, 5, True), (300, 2, 3, 16, 3, False), (777, 1, 5, 32, 1, False),
]


@interpreted
@pytest.mark.parametrize("vocab, k, batch, block_v, splits, masked", DIVERGENCE_CASES)
def test_divergence_gate_matches_reference(vocab, k, batch, block_v, splits, masked):
    # jsd_min between two rows' JSDs (far from every row's, so the kernel's differently summed
    # JSD decides alike): some rows take the fused target, the others the verifier's own; every
    # rule, the separate passes and (cda / greedy) the one launch, two views and one
    ver, aug, base, drafts = make_case(batch, k, vocab, 2.0, torch.float32, seed=vocab + k,
                                       masked=masked)
    base = base + 2.0 * torch.randn(base.shape, generator=torch.Generator().manual_seed(k)) \
        * torch.linspace(0.0, 1.0, batch)[:, None, None]  # views apart by a growing amount
    drafts = ver[:, :k].argmax(-1)  # drafts the verifier likes: rounds run past row 0
    jsd = fused_gate_reference(ver, aug, base, drafts, beta=1.0, gamma=0.5).jsd.flatten()
    values = jsd.sort().values
    gaps = values[1:] - values[:-1]
    cut = int(gaps[len(gaps) // 4: 3 * len(gaps) // 4 + 1].argmax()) + len(gaps) // 4
    assert gaps[cut] > 1e-3, values
    jsd_min = float(values[cut] + values[cut + 1]) / 2
    assert 0 < int((jsd >= jsd_min).sum()) < jsd.numel()
    noise = draw_gate_noise(batch, k, vocab, generator=torch.Generator().manual_seed(k))
    for rule, temp, fuse_bonus in RUNS:
        for b in (base, None):
            kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp,
                          fuse_bonus=fuse_bonus, noise=noise, jsd_min=jsd_min)
            ref = fused_gate_reference(ver, aug, b, drafts, **kwargs)
            for fused in ((True, False) if temp == 0.0 else (False,)):
                out = fused_gate_triton(ver, aug, b, drafts, block_v=block_v, splits=splits,
                                        fused=fused, **kwargs)
                assert_same(out, ref, (rule, temp, fuse_bonus, b is None, fused))
    # the gate changes some row's fused argmax here (else the comparison above proves little):
    # every row alone as a K = 0 call, whose next token is that row's fused argmax
    rows = [t.reshape(-1, 1, vocab) for t in (ver, aug, base)]
    none = torch.zeros((rows[0].shape[0], 0), dtype=torch.long)
    plain = fused_gate_reference(*rows, none, beta=1.0, gamma=0.5, acceptance="greedy")
    gated = fused_gate_reference(*rows, none, beta=1.0, gamma=0.5, acceptance="greedy",
                                 jsd_min=jsd_min)
    assert not torch.equal(plain.next_token, gated.next_token)
    # gated calls take the separate passes by default (the one launch would spill on sm_90)
    from asymagent.kernels.fused_gate import one_launch

    assert one_launch(batch, vocab, False, "greedy") and not one_launch(batch, vocab, False,
                                                                        "greedy", gated=True)
