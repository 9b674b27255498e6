"""fused_gate: the acceptance gate as a Triton kernel (+ a tiny finishing one) and its dispatch.

Kernel 1 runs one program per (sequence, position) row of the [B, K+1, V] logits:
- sweep 1 over V reads v (verifier), a (drafter, full view), b (drafter, compressed view):
  online (max, sum-exp) of the three rows (and of proposal/T for exact sampling) and the argmax
  of the fused score v + beta * (a - b); no softmax is materialised;
- sweep 2 reads a and b again: the JSD terms, which need both log-sum-exps first (and, for
  exact sampling, v too: the online log-sum-exp of fused / T);
- sweep 3, only for acceptance="exact" at T > 0: the exponential race for the residual
  max(0, p - q) (rows < K) or the target p (row K);
- then the accept test of the row's draft, written with the row's JSD and candidate token.
Kernel 2 runs one program per sequence: first rejected position -> num_accepted, next_token.
Nothing syncs with the host. The math (and the order of the float operations that decide
argmax ties) is that of gate_reference.py, which is the definition.

The module imports without Triton (CPU dispatch needs only torch); kernels are jit-decorated on
first use. Under TRITON_INTERPRET=1 (set before triton is imported) they run on CPU for tests.
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
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    triton = None
    tl = None

RULE_CDA, RULE_GREEDY, RULE_SAMPLE = 0, 1, 2
_JIT_CACHE: dict[bool, tuple] = {}


def _gate_rows(v_ptr, a_ptr, b_ptr, g_ptr, d_ptr, u_ptr, e_ptr, jsd_ptr, cand_ptr, acc_ptr,
               K, V, stride_b, stride_r, g_stride_b, g_stride_r,
               beta, beta_bonus, log_gamma, temperature,
               RULE: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program = one row (b, i) of [B, K+1, V]; writes jsd[b,i], cand[b,i], acc[b,i]."""
    pid = tl.program_id(0)
    b = pid // (K + 1)
    i = pid % (K + 1)
    row = b.to(tl.int64) * stride_b + i.to(tl.int64) * stride_r
    g_row = b.to(tl.int64) * g_stride_b + i.to(tl.int64) * g_stride_r
    has_g = i < K
    g_len = tl.where(has_g, V, 0)  # the proposal has rows 0..K-1 only
    NEG = float("-inf")
    lanes = tl.arange(0, BLOCK_V)

    # sweep 1: online (max, sum-exp) of v, a, b (and proposal / T), rescaled once per block so
    # each element costs one exp per row (the special-function units are the other roofline)
    m_v = tl.full([], NEG, tl.float32)
    s_v = tl.full([], 0.0, tl.float32)
    m_a = tl.full([], NEG, tl.float32)
    s_a = tl.full([], 0.0, tl.float32)
    m_b = tl.full([], NEG, tl.float32)
    s_b = tl.full([], 0.0, tl.float32)
    m_g = tl.full([], NEG, tl.float32)
    s_g = tl.full([], 0.0, tl.float32)
    beta_row = tl.where(i == K, beta_bonus, beta)
    best_j = tl.full([BLOCK_V], NEG, tl.float32)  # fused argmax over jointly supported tokens
    idx_j = tl.full([BLOCK_V], 2147483647, tl.int32)
    best_m = tl.full([BLOCK_V], NEG, tl.float32)  # verifier argmax over tokens a view masks
    idx_m = tl.full([BLOCK_V], 2147483647, tl.int32)
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        mask = offs < V
        xv = tl.load(v_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        xa = tl.load(a_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        xb = tl.load(b_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        new = tl.maximum(m_v, tl.max(xv, axis=0))
        safe = tl.where(new == NEG, 0.0, new)  # an all -inf prefix: keep exp() NaN-free
        s_v = s_v * tl.exp(m_v - safe) + tl.sum(tl.exp(xv - safe), axis=0)
        m_v = new
        new = tl.maximum(m_a, tl.max(xa, axis=0))
        safe = tl.where(new == NEG, 0.0, new)
        s_a = s_a * tl.exp(m_a - safe) + tl.sum(tl.exp(xa - safe), axis=0)
        m_a = new
        new = tl.maximum(m_b, tl.max(xb, axis=0))
        safe = tl.where(new == NEG, 0.0, new)
        s_b = s_b * tl.exp(m_b - safe) + tl.sum(tl.exp(xb - safe), axis=0)
        m_b = new
        joint = (xa > NEG) & (xb > NEG)
        scaled = (xa - xb) * beta_row  # separate multiply and add: no FMA, reference-identical
        f = tl.where(joint, xv + scaled, NEG)
        better = f > best_j
        best_j = tl.where(better, f, best_j)
        idx_j = tl.where(better, offs, idx_j)
        fm = tl.where(mask & (joint == 0), xv, NEG)
        better = fm > best_m
        best_m = tl.where(better, fm, best_m)
        idx_m = tl.where(better, offs, idx_m)
        if RULE == 2:
            xg = tl.load(g_ptr + g_row + offs, mask=offs < g_len, other=NEG).to(tl.float32)
            xg = xg / temperature
            new = tl.maximum(m_g, tl.max(xg, axis=0))
            safe = tl.where(new == NEG, 0.0, new)
            s_g = s_g * tl.exp(m_g - safe) + tl.sum(tl.exp(xg - safe), axis=0)
            m_g = new
    lse_v = m_v + tl.log(s_v)
    lse_a = m_a + tl.log(s_a)
    lse_b = m_b + tl.log(s_b)
    lse_g = m_g + tl.log(s_g)
    masked_delta = lse_a - lse_b  # on masked tokens: makes log p_a - log p_b = 0
    top_j = tl.max(best_j, axis=0)
    tok_j = tl.min(tl.where(best_j == top_j, idx_j, 2147483647), axis=0)
    top_m = tl.max(best_m, axis=0)
    tok_m = tl.min(tl.where(best_m == top_m, idx_m, 2147483647), axis=0)
    scaled_m = masked_delta * beta_row
    top_m = top_m + scaled_m
    cand = tl.where(top_m > top_j, tok_m,
                    tl.where(top_m == top_j, tl.minimum(tok_j, tok_m), tok_j)).to(tl.int64)

    # sweep 2 (reads a and b; v too for sampling): JSD terms, online lse of fused / T
    jsd_acc = tl.zeros([BLOCK_V], tl.float32)
    m_f = tl.full([], NEG, tl.float32)
    s_f = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        mask = offs < V
        xa = tl.load(a_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        xb = tl.load(b_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        fin_a = xa > NEG
        fin_b = xb > NEG
        la = xa - lse_a
        lb = xb - lse_b
        pa = tl.exp(la)
        pb = tl.exp(lb)
        # log of the mixture (p_a + p_b) / 2; where both underflow, both terms are 0 anyway
        log_m = tl.log(tl.maximum(pa + pb, 1.1754943508222875e-38)) - 0.6931471805599453
        term = tl.where(fin_a, pa * (la - log_m), 0.0)  # 0 * log 0 = 0 where p_a = 0
        term += tl.where(fin_b, pb * (lb - log_m), 0.0)
        jsd_acc += tl.where(mask, term, 0.0)
        if RULE == 2:
            xv = tl.load(v_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            delta = tl.where(fin_a & fin_b, xa - xb, masked_delta)
            scaled = delta * beta_row
            ft = (xv + scaled) / temperature
            new = tl.maximum(m_f, tl.max(ft, axis=0))
            safe = tl.where(new == NEG, 0.0, new)
            s_f = s_f * tl.exp(m_f - safe) + tl.sum(tl.exp(ft - safe), axis=0)
            m_f = new
    jsd = tl.minimum(tl.maximum(0.5 * tl.sum(jsd_acc, axis=0), 0.0), 0.6931471805599453)
    lse_f = m_f + tl.log(s_f)

    # the accept test of this row's draft (rows < K)
    d = tl.load(d_ptr + b.to(tl.int64) * K + i, mask=has_g, other=0).to(tl.int64)
    d = tl.minimum(tl.maximum(d, 0), V - 1)  # never read out of the row (CPU input is checked)
    xv_d = tl.load(v_ptr + row + d).to(tl.float32)
    xb_d = tl.load(b_ptr + row + d).to(tl.float32)
    if RULE == 0:
        accept = (xv_d - lse_v) > (log_gamma - jsd) + (xb_d - lse_b)  # p_v > gamma_eff * p_b
    elif RULE == 1:
        accept = d == cand
    else:
        xa_d = tl.load(a_ptr + row + d).to(tl.float32)
        delta_d = tl.where((xa_d > NEG) & (xb_d > NEG), xa_d - xb_d, masked_delta)
        lp_d = (xv_d + delta_d * beta_row) / temperature - lse_f
        xg_d = tl.load(g_ptr + g_row + d, mask=has_g, other=0.0).to(tl.float32)
        lq_d = xg_d / temperature - lse_g
        u = tl.load(u_ptr + b.to(tl.int64) * K + i, mask=has_g, other=0.5)
        accept = tl.log(u) + lq_d < lp_d  # u * q(d) < p(d)

        # sweep 3: exponential race for the residual max(0, p - q) (rows < K) or p (row K)
        best_r = tl.full([BLOCK_V], -1.0, tl.float32)
        idx_r = tl.full([BLOCK_V], 2147483647, tl.int32)
        best_p = tl.full([BLOCK_V], -1.0, tl.float32)
        idx_p = tl.full([BLOCK_V], 2147483647, tl.int32)
        top_r = tl.zeros([BLOCK_V], tl.float32)
        e_row = b.to(tl.int64) * V
        for start in range(0, V, BLOCK_V):
            offs = start + lanes
            mask = offs < V
            xv = tl.load(v_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            xa = tl.load(a_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            xb = tl.load(b_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            xg = tl.load(g_ptr + g_row + offs, mask=offs < g_len, other=NEG).to(tl.float32)
            ex = tl.load(e_ptr + e_row + offs, mask=mask, other=1.0)
            delta = tl.where((xa > NEG) & (xb > NEG), xa - xb, masked_delta)
            scaled = delta * beta_row
            p = tl.exp((xv + scaled) / temperature - lse_f)
            q = tl.exp(xg / temperature - lse_g)
            r = tl.maximum(p - q, 0.0)
            score_r = tl.where(mask, r / ex, -1.0)
            score_p = tl.where(mask, p / ex, -1.0)
            top_r = tl.maximum(top_r, tl.where(mask, r, 0.0))
            better = score_r > best_r
            best_r = tl.where(better, score_r, best_r)
            idx_r = tl.where(better, offs, idx_r)
            better = score_p > best_p
            best_p = tl.where(better, score_p, best_p)
            idx_p = tl.where(better, offs, idx_p)
        top = tl.max(best_r, axis=0)
        tok_r = tl.min(tl.where(best_r == top, idx_r, 2147483647), axis=0)
        top = tl.max(best_p, axis=0)
        tok_p = tl.min(tl.where(best_p == top, idx_p, 2147483647), axis=0)
        use_r = has_g & (tl.max(top_r, axis=0) > 0.0)
        cand = tl.where(use_r, tok_r, tok_p).to(tl.int64)

    out = b.to(tl.int64) * (K + 1) + i
    tl.store(jsd_ptr + out, jsd)
    tl.store(cand_ptr + out, cand)
    tl.store(acc_ptr + b.to(tl.int64) * K + i, accept.to(tl.int32), mask=has_g)


def _gate_finish(acc_ptr, cand_ptr, n_ptr, next_ptr, K, BLOCK_K: tl.constexpr):
    """One program per sequence: num_accepted = first rejected position, next = cand there."""
    b = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.load(acc_ptr + b * K + ks, mask=ks < K, other=1)
    n = tl.min(tl.where((acc == 0) & (ks < K), ks, K), axis=0).to(tl.int64)
    tok = tl.load(cand_ptr + b * (K + 1) + n)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, tok)


def launch_config(vocab: int, device_type: str, block_v: int | None = None) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the rows kernel. On GPU 2048 lanes x 8 warps: ~122 registers,
    no spills on sm_90 (`python -m asymagent.kernels.bench --compile-only`); the interpreter
    pays per operation, so it takes whole rows of up to 8192 lanes."""
    if block_v is None:
        block_v = min(triton.next_power_of_2(vocab), 2048 if device_type == "cuda" else 8192)
    return block_v, 8 if block_v >= 2048 else 4


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off")


def jitted_kernels() -> tuple:
    """(rows kernel, finish kernel), jit-decorated for the current TRITON_INTERPRET setting."""
    if triton is None:
        raise RuntimeError("the Triton gate needs the `triton` package (pip install triton)")
    interpret = _interpreting()
    if interpret not in _JIT_CACHE:
        _JIT_CACHE[interpret] = (triton.jit(_gate_rows), triton.jit(_gate_finish))
    return _JIT_CACHE[interpret]


def fused_gate_triton(verifier_logits: torch.Tensor, drafter_logits: torch.Tensor | None,
                      base_logits: torch.Tensor | None, draft_tokens: torch.Tensor, *, beta: float,
                      gamma: float, acceptance: str = "cda", temperature: float = 0.0,
                      generator: GeneratorArg = None,
                      proposal_logits: torch.Tensor | None = None, fuse_bonus: bool = True,
                      noise: GateNoise | None = None, block_v: int | None = None) -> GateResult:
    """The Triton gate (CUDA, or CPU under TRITON_INTERPRET=1); same semantics as the reference."""
    batch, k, vocab = validate_gate_inputs(
        verifier_logits, drafter_logits, base_logits, draft_tokens, beta=beta, gamma=gamma,
        acceptance=acceptance, temperature=temperature, proposal_logits=proposal_logits)
    rows_kernel, finish_kernel = jitted_kernels()
    # one view: b = a gives delta 0 exactly (a - a) and JSD 0 up to rounding, as the reference
    verifier_logits, drafter_logits, base_logits, _ = gate_views(verifier_logits, drafter_logits,
                                                                 base_logits)
    device = verifier_logits.device
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
    jsd = torch.empty((batch, k + 1), dtype=torch.float32, device=device)  # [B, K+1]
    cand = torch.empty((batch, k + 1), dtype=torch.int64, device=device)  # [B, K+1]
    acc = torch.empty((batch, max(k, 1)), dtype=torch.int32, device=device)  # [B, K]
    block_v, num_warps = launch_config(vocab, device.type, block_v)
    # no FMA contraction of v + beta*D on GPU: keeps argmax ties identical to the reference
    options = {} if _interpreting() else {"enable_fp_fusion": False}
    rows_kernel[(batch * (k + 1),)](
        v, a, b, g, drafts, uniform, expo, jsd, cand, acc,
        k, vocab, v.stride(0), v.stride(1), g.stride(0), g.stride(1),
        float(beta), float(beta) if fuse_bonus else 0.0,
        math.log(gamma) if acceptance == "cda" else 0.0, max(float(temperature), 1e-30),
        RULE=rule, BLOCK_V=block_v, num_warps=num_warps, **options)
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)  # [B]
    next_token = torch.empty((batch,), dtype=torch.int64, device=device)  # [B]
    finish_kernel[(batch,)](acc, cand, num_accepted, next_token, k,
                            BLOCK_K=max(triton.next_power_of_2(max(k, 1)), 2), num_warps=1)
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
               fuse_bonus: bool = True, noise: GateNoise | None = None) -> GateResult:
    """Run the gate on logits [B, K+1, V] and drafts [B, K]; see gate_reference for semantics.

    `base_logits=None`: one drafter view (no compression); `drafter_logits=None` as well: no
    drafter rows, the target is the verifier (mode spec)."""
    kwargs = dict(beta=beta, gamma=gamma, acceptance=acceptance, temperature=temperature,
                  generator=generator, proposal_logits=proposal_logits, fuse_bonus=fuse_bonus,
                  noise=noise)
    args = (verifier_logits, drafter_logits, base_logits, draft_tokens)
    backend = gate_backend(verifier_logits.device)
    if backend == "triton":
        return fused_gate_triton(*args, **kwargs)
    if backend == "compile" and _COMPILED.get("failed") is None:
        validate_gate_inputs(*args, beta=beta, gamma=gamma, acceptance=acceptance,
                             temperature=temperature, proposal_logits=proposal_logits)
        try:
            return compiled_reference()(*args, **kwargs)
        except Exception as exc:  # a missing compiler must not take the engine down
            _COMPILED["failed"] = repr(exc)
            warnings.warn(f"torch.compile of the gate failed, using eager: {exc!r}")
    return fused_gate_reference(*args, **kwargs)
