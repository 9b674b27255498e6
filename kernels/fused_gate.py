"""fused_gate: the acceptance gate's dispatch and the launch of its split-V Triton kernels.

The kernels (kernels/gate_kernels.py) cut every (sequence, position) row of the [B, K+1, V]
logits into S slices and run one program per (row, slice), flash-decoding style, so a small
batch still fills the chip; a last tiny kernel per sequence merges the slices' partials:
- pass 1 reads v (verifier), a (drafter, full view), b (drafter, compressed view): online
  (max, sum-exp) of each row (and of proposal/T for exact sampling) and the argmax of the fused
  score v + beta * (a - b); no softmax is materialised;
- pass 2 reads a and b again: the JSD terms, which need both log-sum-exps first (and, for exact
  sampling, v too: the online log-sum-exp of fused / T); skipped with one drafter view;
- pass 3, only for acceptance="exact" at T > 0: the exponential race for the residual
  max(0, p - q) (rows < K) or the target p (row K);
- the finish, one program per sequence: accept tests, first reject -> num_accepted, next_token.
With the divergence gate (jsd_min > 0, two views) pass 1 also keeps the verifier's own argmax
and pass 2 the log-sum-exp of v / T, so the race and the finish pick per row once its JSD is
known (beta_eff = beta * [JSD >= jsd_min], gate_reference.gated_beta).
Nothing syncs with the host. The math (and the order of the float operations that decide
argmax ties) is that of gate_reference.py, which is the definition. `split_plan` picks S from
(B, K+1, V) and the SM count; on CPU (the interpreter) a fixed small S.

The module imports without Triton (CPU dispatch needs only torch); the kernels module is
imported on first use. Under TRITON_INTERPRET=1 (set before triton is imported) the kernels run
on CPU for tests.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from asymagent.kernels.gate_reference import (
    GateNoise,
    GateResult,
    GeneratorArg,
    draw_gate_noise,
    fused_gate_reference,
    gate_views,
    validate_gate_inputs,
)

try:  # the module must import on machines without Triton (CPU dispatch needs only torch)
    import triton
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    triton = None

RULE_CDA, RULE_GREEDY, RULE_SAMPLE = 0, 1, 2
# Programs per SM the split aims for: a few resident programs per SM hide memory latency, a
# few waves hide the tail (an estimate to tune with `kernels.bench --splits`, not measured).
PROGRAMS_PER_SM = 8
INTERPRET_SPLITS = 2  # CPU/interpreter: a fixed small split, so the merging is always exercised
# Batches up to this run the whole gate as ONE launch (gate_fused: the finish in the last
# program of each row / sequence, atomic counters) for cda and greedy; larger batches fill the
# chip with the separate passes anyway, whose launches a CUDA graph makes cheap.
FUSED_MAX_BATCH = 8
# With two views the one launch sweeps each row's JSD in ONE program (the row's last): ~V/1024
# dependent iterations on one SM, so it only pays for short rows; longer ones take the passes,
# whose JSD pass runs on every slice at once (an estimate: the bench times both, graph_fused /
# graph_passes).
FUSED_TWO_VIEW_MAX_V = 16384
_SM_COUNT: dict = {}
_COUNTERS: dict = {}  # device -> int32 zeros: gate_fused's row / sequence counters


def launch_config(vocab: int, device_type: str, block_v: int | None = None) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the sweeps: 8 elements per thread (one 128-bit load per bf16 row).

    GPU default 1024 lanes x 4 warps: 147 registers, no spills for the cda/greedy stats pass on
    sm_90, so 3 programs fit an SM (`python -m asymagent.kernels.bench --compile-only`; 2048 x 8
    takes 158 and fits one); a choice from the register counts, not yet timed. The interpreter
    pays per operation, so it takes slices of up to 8192 lanes, sized so a row splits into
    INTERPRET_SPLITS slices."""
    if block_v is None:
        if device_type == "cuda":
            block_v = min(triton.next_power_of_2(vocab), 1024)
        else:
            block_v = min(max(triton.next_power_of_2(-(-vocab // INTERPRET_SPLITS)), 16), 8192)
    return block_v, max(1, min(8, block_v // 256))


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (cached)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def split_plan(rows: int, vocab: int, block_v: int, device: torch.device,
               splits: int | None = None) -> tuple[int, int]:
    """(S slices per row, CHUNK columns per slice) for R = B*(K+1) rows of V columns.

    CUDA: enough slices that R*S reaches PROGRAMS_PER_SM x the SM count, never more slices than
    BLOCK_V blocks (V=151936 in 1024-blocks on 132 SMs: B=1, K=8 is 9 rows x 75 slices of two
    blocks; B=64, K=8 is 576 rows x 2 slices). Elsewhere (the interpreter) a fixed INTERPRET_SPLITS.
    `splits` forces a count. CHUNK is a multiple of BLOCK_V; S is recomputed from it, so no slice
    is empty and only the last one may be ragged.
    """
    blocks = -(-vocab // block_v)
    if splits is None:
        if device.type == "cuda":
            splits = -(-PROGRAMS_PER_SM * sm_count(device) // rows)
        else:
            splits = INTERPRET_SPLITS
    splits = max(1, min(int(splits), blocks))
    chunk = -(-blocks // splits) * block_v
    return -(-vocab // chunk), chunk


def fused_counters(device: torch.device, size: int) -> torch.Tensor:
    """int32 zeros for gate_fused's counters (it leaves them at 0). Cached per device, so a call
    (and a CUDA graph recording one) launches only the kernel; the engine uses one stream per
    device at a time, which sharing them requires. While a graph is being captured a buffer
    that is not cached yet is made inside the capture (its zeroing becomes a graph node)."""
    key = str(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        buf = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        if capturing:
            return buf
        _COUNTERS[key] = buf
    return buf


def one_launch(batch: int, vocab: int, one_view: bool, acceptance: str,
               temperature: float = 0.0, gated: bool = False) -> bool:
    """Whether fused_gate_triton's default is the one-launch kernel for this call.

    Not with the divergence gate (`gated`): its extra argmax takes gate_fused past the register
    budget on sm_90 (168 registers and 3 spill stores, `python -m asymagent.kernels.bench
    --compile-only`), so gated calls take the passes (the kernel still computes it correctly
    when asked with fused=True, as the interpreter tests do)."""
    if gated or (acceptance == "exact" and temperature > 0.0):
        return False
    return batch <= FUSED_MAX_BATCH and (one_view or vocab <= FUSED_TWO_VIEW_MAX_V)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off")


def gate_kernels():
    """The kernels module (imported on first use: triton reads TRITON_INTERPRET at its import)."""
    if triton is None:
        raise RuntimeError("the Triton gate needs the `triton` package (pip install triton)")
    import importlib

    return importlib.import_module("asymagent.kernels.gate_kernels")


def fused_gate_triton(verifier_logits: torch.Tensor, drafter_logits: torch.Tensor | None,
                      base_logits: torch.Tensor | None, draft_tokens: torch.Tensor, *, beta: float,
                      gamma: float, acceptance: str = "cda", temperature: float = 0.0,
                      generator: GeneratorArg = None,
                      proposal_logits: torch.Tensor | None = None, fuse_bonus: bool = True,
                      noise: GateNoise | None = None, block_v: int | None = None,
                      splits: int | None = None, fused: bool | None = None,
                      jsd_min: float = 0.0) -> GateResult:
    """The Triton gate (CUDA, or CPU under TRITON_INTERPRET=1); same semantics as the reference.

    `block_v` and `splits` override the launch (tests, tuning); see `launch_config`, `split_plan`.
    `fused`: one launch (gate_fused) or the separate passes; None = `one_launch`'s choice (cda /
    greedy at B <= FUSED_MAX_BATCH, one view or V <= FUSED_TWO_VIEW_MAX_V; exact sampling
    always takes the passes). `jsd_min` > 0: the divergence gate (see gate_reference)."""
    batch, k, vocab = validate_gate_inputs(
        verifier_logits, drafter_logits, base_logits, draft_tokens, beta=beta, gamma=gamma,
        acceptance=acceptance, temperature=temperature, proposal_logits=proposal_logits,
        jsd_min=jsd_min)
    kern = gate_kernels()
    # one view (base_logits=None): delta 0 and JSD 0 exactly, the kernels never read a
    verifier_logits, drafter_logits, base_logits, one_view = gate_views(
        verifier_logits, drafter_logits, base_logits)
    device = verifier_logits.device
    gate = float(jsd_min) > 0.0 and not one_view  # one view: JSD 0 and delta 0, nothing to gate
    # one layout for the three logit tensors: [B, K+1, V] with unit stride over V
    v, a, b = (t if t.stride(-1) == 1 else t.contiguous()
               for t in (verifier_logits, drafter_logits, base_logits))
    if not (a.stride() == v.stride() == b.stride()):
        v, a, b = v.contiguous(), a.contiguous(), b.contiguous()
    drafts = draft_tokens.long().contiguous()  # [B, K]
    sampling = acceptance == "exact" and float(temperature) > 0.0
    rule = RULE_CDA if acceptance == "cda" else (RULE_SAMPLE if sampling else RULE_GREEDY)
    g = a if proposal_logits is None else proposal_logits
    if g.stride(-1) != 1:
        g = g.contiguous()
    if sampling:
        if noise is None:
            noise = draw_gate_noise(batch, k, vocab, device=device, generator=generator)
        uniform = noise.uniform.float().contiguous()  # [B, K]
        expo = noise.exponential.float().contiguous()  # [B, V]
    else:
        uniform = expo = torch.empty(1, device=device)  # not read by the non-sampling rules
    rows = batch * (k + 1)
    block_v, num_warps = launch_config(vocab, device.type, block_v)
    n_split, chunk = split_plan(rows, vocab, block_v, device, splits)
    block_s = max(triton.next_power_of_2(n_split), 2)
    part = torch.empty((kern.NF, rows * n_split), dtype=torch.float32, device=device)
    ipart = torch.empty((kern.NI, rows * n_split), dtype=torch.int32, device=device)
    jsd = torch.empty((batch, k + 1), dtype=torch.float32, device=device)  # [B, K+1]
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)  # [B]
    next_token = torch.empty((batch,), dtype=torch.int64, device=device)  # [B]
    beta_bonus = float(beta) if fuse_bonus else 0.0
    temp = max(float(temperature), 1e-30)
    strides = (v.stride(0), v.stride(1))
    g_strides = (g.stride(0), g.stride(1))
    # no FMA contraction of v + beta*D on GPU: keeps argmax ties identical to the reference
    options = {} if _interpreting() else {"enable_fp_fusion": False}
    grid = (rows, n_split)
    if fused is None:
        fused = one_launch(batch, vocab, one_view, acceptance, temperature, gate)
    if fused and not sampling:
        counters = fused_counters(device, rows + batch)
        kern.gate_fused[grid](v, a, b, g, drafts, uniform, part, ipart, counters, jsd,
                              num_accepted, next_token, k, vocab, chunk, n_split, *strides,
                              *g_strides, float(beta), beta_bonus,
                              math.log(gamma) if acceptance == "cda" else 0.0, temp,
                              float(jsd_min), RULE=rule, ONE_VIEW=one_view, GATE=gate,
                              BLOCK_V=block_v, BLOCK_S=block_s, num_warps=num_warps, **options)
        return GateResult(num_accepted=num_accepted, next_token=next_token, jsd=jsd)
    kern.gate_stats[grid](v, a, b, g, part, ipart, k, vocab, chunk, n_split, *strides, *g_strides,
                          float(beta), beta_bonus, temp, RULE=rule, ONE_VIEW=one_view,
                          GATE=gate, BLOCK_V=block_v, num_warps=num_warps, **options)
    if not one_view:
        kern.gate_jsd[grid](v, a, b, part, k, vocab, chunk, n_split, *strides, float(beta),
                            beta_bonus, temp, RULE=rule, GATE=gate, BLOCK_V=block_v,
                            BLOCK_S=block_s, num_warps=num_warps, **options)
    if sampling:
        kern.gate_race[grid](v, a, b, g, expo, part, ipart, k, vocab, chunk, n_split, *strides,
                             *g_strides, float(beta), beta_bonus, temp, float(jsd_min),
                             ONE_VIEW=one_view, GATE=gate, BLOCK_V=block_v, BLOCK_S=block_s,
                             num_warps=num_warps, **options)
    kern.gate_finish[(batch,)](v, a, b, g, drafts, uniform, part, ipart, jsd, num_accepted,
                               next_token, k, vocab, n_split, *strides, *g_strides, float(beta),
                               beta_bonus, math.log(gamma) if acceptance == "cda" else 0.0, temp,
                               float(jsd_min), RULE=rule, ONE_VIEW=one_view, GATE=gate,
                               BLOCK_S=block_s, num_warps=1, **options)
    return GateResult(num_accepted=num_accepted, next_token=next_token, jsd=jsd)


BACKENDS = ("triton", "torch", "compile")
_COMPILED: dict[str, object] = {}


def gate_backend(device: torch.device) -> str:
    """'triton', 'torch' or 'compile'. ASYMAGENT_GATE forces one; else CUDA -> triton, else torch.

    CPU stays on the eager reference by default: torch.compile runs it ~5-15x faster per call
    (docs/kernels.md) but its first call compiles for 10-90 s on a 2-core machine, which only
    a long-lived server amortises; ASYMAGENT_GATE=compile opts in.
    """
    forced = os.environ.get("ASYMAGENT_GATE", "").strip().lower()
    if forced not in ("",) + BACKENDS:
        raise ValueError(f"ASYMAGENT_GATE must be one of {BACKENDS}, got {forced!r}")
    if forced:
        return forced
    return "triton" if device.type == "cuda" and triton is not None else "torch"


def compiled_reference():
    """The torch.compile'd reference (built once per process; falls back to eager on failure)."""
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(fused_gate_reference, dynamic=None)
    return _COMPILED["fn"]


def fused_gate(verifier_logits: torch.Tensor, drafter_logits: torch.Tensor | None,
               base_logits: torch.Tensor | None, draft_tokens: torch.Tensor, *, beta: float,
               gamma: float, acceptance: str = "cda", temperature: float = 0.0,
               generator: GeneratorArg = None, proposal_logits: torch.Tensor | None = None,
               fuse_bonus: bool = True, noise: GateNoise | None = None,
               jsd_min: float = 0.0) -> GateResult:
    """Run the gate on logits [B, K+1, V] and drafts [B, K]; see gate_reference for semantics.

    `base_logits=None`: one drafter view (no compression); `drafter_logits=None` as well: no
    drafter rows, the target is the verifier (mode spec). `jsd_min` > 0: the delta only where
    the drafter's two views diverge (JSD >= jsd_min)."""
    kwargs = dict(beta=beta, gamma=gamma, acceptance=acceptance, temperature=temperature,
                  generator=generator, proposal_logits=proposal_logits, fuse_bonus=fuse_bonus,
                  noise=noise, jsd_min=jsd_min)
    args = (verifier_logits, drafter_logits, base_logits, draft_tokens)
    backend = gate_backend(verifier_logits.device)
    if backend == "triton":
        return fused_gate_triton(*args, **kwargs)
    if backend == "compile" and _COMPILED.get("failed") is None:
        validate_gate_inputs(*args, beta=beta, gamma=gamma, acceptance=acceptance,
                             temperature=temperature, proposal_logits=proposal_logits,
                             jsd_min=jsd_min)
        try:
            return compiled_reference()(*args, **kwargs)
        except Exception as exc:  # a missing compiler must not take the engine down
            _COMPILED["failed"] = repr(exc)
            warnings.warn(f"torch.compile of the gate failed, using eager: {exc!r}")
    return fused_gate_reference(*args, **kwargs)
