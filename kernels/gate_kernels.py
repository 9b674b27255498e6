"""The gate's Triton kernels, split over V (flash-decoding style): partial sweeps + a tiny reduction.

The logits are [B, K+1, V]; a *row* is one (sequence b, position i), R = B*(K+1) rows. Each row is
cut into S slices of CHUNK columns (a multiple of BLOCK_V) and every pass runs one program per
(row, slice), so a small batch still fills the chip (B=1, K=8 is 9 rows; with S=60 it is 540
programs on a 132-SM H200). Passes, each writing per-(row, slice) partials into `part` (floats,
[NF, R*S]) and `ipart` (token ids, [NI, R*S]):

1. `gate_stats` reads v, b (and a, and the proposal g for exact sampling) over its slice: the
   lane-wise online (max, sum-exp) of each row, one exp per element and no cross-lane reduction
   inside the loop; the fused argmax over jointly supported tokens and the verifier argmax over
   masked ones (first index on ties). With one drafter view (ONE_VIEW: b = a, delta 0 and JSD 0
   exactly) the fused score is v itself, a is never read, and the log-sum-exp of v / T for exact
   sampling is taken here too.
2. `gate_jsd` (two views only) merges the slices' (max, sum) of a and b into log-sum-exps and
   sweeps a and b again: the JSD terms (and the online log-sum-exp of fused / T for exact).
3. `gate_race` (exact at T > 0 only): the exponential race for the residual max(0, p - q)
   (rows < K) and for the target p.
4. `gate_finish`, one program per sequence: merges every row's partials (log-sum-exps, argmax,
   race, JSD), runs each draft's accept test and stops at the first reject: num_accepted,
   next_token and jsd.

The divergence gate (GATE, two views and jsd_min > 0: beta_eff = beta * [JSD >= jsd_min],
gate_reference.gated_beta) needs a row's JSD before its beta, and the JSD is known only after
pass 2. So pass 1 also keeps the verifier's own argmax (the fused argmax at beta_eff = 0) and,
for exact sampling, pass 2 also the log-sum-exp of v / T; the race and the finish merge the
row's JSD first and pick the gated or the fused statistics per row.

Merging is exact for the argmax (slices are in index order: the largest value, then the
smallest index among equal ones, is the first index overall) and reorders only float sums (the
log-sum-exps and the JSD), which the reference computes in yet another order anyway. The fused
score of every element is computed with the reference's float operations (no FMA: the launch
disables fp fusion), so argmax ties break exactly as in gate_reference.py.

This module imports triton and jit-decorates at import: fused_gate.py imports it on first use, so
TRITON_INTERPRET (read by triton at its own import) decides compiled or interpreted kernels.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Helpers called inside the kernels: jit functions when compiling; plain functions under the
# interpreter, which re-patches triton.language on every nested jit call (~2 ms each, most of
# an interpreted gate call otherwise) but runs a plain function with the language patched.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off")
helper = (lambda fn: fn) if _INTERPRETED else triton.jit

if _INTERPRETED:  # tl.max/sum/min are jit functions too: reduce the interpreter's numpy data
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    def _reduced(x, op):
        """The scalar tl.tensor of numpy's `op` over a 1-D interpreter tensor (numpy data)."""
        data = np.array([op(x.handle.data, axis=0)], dtype=x.handle.data.dtype)  # [1] as triton's
        return tl.tensor(TensorHandle(data, x.handle.dtype), x.type.scalar)

    def _rmax(x):
        return _reduced(x, np.max)

    def _rmin(x):
        return _reduced(x, np.min)

    def _rsum(x):
        return _reduced(x, np.sum)
else:
    @triton.jit
    def _rmax(x):
        return tl.max(x, axis=0)

    @triton.jit
    def _rmin(x):
        return tl.min(x, axis=0)

    @triton.jit
    def _rsum(x):
        return tl.sum(x, axis=0)

# float partials, one [R*S] plane each: (max, sum-exp) pairs, argmax values, JSD sum, race values
# (kernels read module globals only as constexpr)
# (F_TOPV: the verifier's argmax over every token; F_MF0, F_SF0: v / T; both GATE only)
(F_MV, F_SV, F_MA, F_SA, F_MB, F_SB, F_MG, F_SG, F_MF, F_SF,
 F_TOPJ, F_TOPM, F_JSD, F_TOPR, F_TOPP, F_MAXR, F_TOPV, F_MF0, F_SF0) = (
    tl.constexpr(n) for n in range(19))
NF = 19
# token-id partials: fused argmax (joint support), verifier argmax (masked), race winners,
# verifier argmax (every token; GATE only)
I_TOKJ, I_TOKM, I_TOKR, I_TOKP, I_TOKV = (tl.constexpr(n) for n in range(5))
NI = 5


@helper
def _online(m, s, x):
    """Lane-wise running (max, sum exp(x - max)) updated with x: ONE exp per element.

    With d = x - m, exp(-|d|) is either exp(x - m) (x <= m: s += it) or exp(m - x) (x > m: the
    old sum is rescaled by it and x counts 1). x = -inf adds nothing (and -inf - -inf is guarded).
    """
    d = x - m
    e = tl.where(x == float("-inf"), 0.0, tl.exp(-tl.abs(d)))
    grow = d > 0.0
    s = tl.where(grow, s * e + 1.0, s + e)
    m = tl.maximum(m, x)
    return m, s


@helper
def _merge(m, s):
    """(max, sum-exp) of (max, sum-exp) pairs along axis 0; pairs with max -inf count 0."""
    top = _rmax(m)
    safe = tl.where(top == float("-inf"), 0.0, top)
    total = _rsum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - safe)))
    return top, total


@helper
def _lse(part_ptr, off, ss, smask, F_M: tl.constexpr, F_S: tl.constexpr, RS):
    """Log-sum-exp of one row from its slices' (max, sum-exp) partials; -inf if all masked."""
    m = tl.load(part_ptr + F_M * RS + off + ss, mask=smask, other=float("-inf"))
    s = tl.load(part_ptr + F_S * RS + off + ss, mask=smask, other=0.0)
    top, total = _merge(m, s)
    return top + tl.log(total)


@helper
def _first_max(best, idx):
    """(max value, smallest index holding it) along axis 0: argmax with the first index on ties."""
    top = _rmax(best)
    return top, _rmin(tl.where(best == top, idx, 2147483647))


@helper
def _first_max_of(part_ptr, ipart_ptr, off, ss, smask, F_TOP: tl.constexpr, I_TOK: tl.constexpr,
                  RS, EMPTY):
    """The slices' argmax partials of one row merged: (value, first index)."""
    best = tl.load(part_ptr + F_TOP * RS + off + ss, mask=smask, other=EMPTY)
    idx = tl.load(ipart_ptr + I_TOK * RS + off + ss, mask=smask, other=2147483647)
    return _first_max(best, idx)


@helper
def _store_sums(part_ptr, F_M: tl.constexpr, F_S: tl.constexpr, RS, out, m, s):
    """Store a slice's lane-wise (max, sum-exp) merged into one pair."""
    top, total = _merge(m, s)
    tl.store(part_ptr + F_M * RS + out, top)
    tl.store(part_ptr + F_S * RS + out, total)


@helper
def _store_argmax(part_ptr, ipart_ptr, F_TOP: tl.constexpr, I_TOK: tl.constexpr, RS, out, best,
                  idx):
    """Store a slice's lane-wise argmax merged into (value, first index)."""
    top, tok = _first_max(best, idx)
    tl.store(part_ptr + F_TOP * RS + out, top)
    tl.store(ipart_ptr + I_TOK * RS + out, tok)


@helper
def _row_jsd(part_ptr, off, ss, smask, RS):
    """A row's JSD from its slices' partial sums of terms: 1/2 sum, clamped to [0, ln 2]."""
    jsd_part = tl.load(part_ptr + F_JSD * RS + off + ss, mask=smask, other=0.0)
    return tl.minimum(tl.maximum(0.5 * _rsum(jsd_part), 0.0), 0.6931471805599453)


@helper
def _slice(K, V, CHUNK, stride_b, stride_r, g_stride_b, g_stride_r):
    """This program's row and slice: (b, i, row offset, proposal row offset, lo, hi, g_hi, r)."""
    r = tl.program_id(0)
    b = r // (K + 1)
    i = r % (K + 1)
    row = b.to(tl.int64) * stride_b + i.to(tl.int64) * stride_r
    g_row = b.to(tl.int64) * g_stride_b + i.to(tl.int64) * g_stride_r
    lo = tl.program_id(1) * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    g_hi = tl.where(i < K, hi, 0)  # the proposal has rows 0..K-1 only
    return i, row, g_row, lo, hi, g_hi, r


@helper
def _row_partials(r, S, BLOCK_S: tl.constexpr):
    """(R*S plane stride, slice lanes, their mask, offset of row r's first slice) of the partials."""
    ss = tl.arange(0, BLOCK_S)
    return tl.num_programs(0) * S, ss, ss < S, r.to(tl.int64) * S


@triton.jit
def gate_stats(v_ptr, a_ptr, b_ptr, g_ptr, part_ptr, ipart_ptr,
               K, V, CHUNK, S, stride_b, stride_r, g_stride_b, g_stride_r,
               beta, beta_bonus, temperature,
               RULE: tl.constexpr, ONE_VIEW: tl.constexpr, GATE: tl.constexpr,
               BLOCK_V: tl.constexpr):
    """Pass 1, one program per (row, slice): online (max, sum-exp) of the rows and the argmaxes."""
    _stats(v_ptr, a_ptr, b_ptr, g_ptr, part_ptr, ipart_ptr, K, V, CHUNK, S, stride_b, stride_r,
           g_stride_b, g_stride_r, beta, beta_bonus, temperature, RULE, ONE_VIEW, GATE, BLOCK_V)


@helper
def _stats(v_ptr, a_ptr, b_ptr, g_ptr, part_ptr, ipart_ptr,
           K, V, CHUNK, S, stride_b, stride_r, g_stride_b, g_stride_r,
           beta, beta_bonus, temperature,
           RULE: tl.constexpr, ONE_VIEW: tl.constexpr, GATE: tl.constexpr,
           BLOCK_V: tl.constexpr):
    """gate_stats' body (also the first part of gate_fused). GATE: the verifier's argmax too."""
    i, row, g_row, lo, hi, g_hi, r = _slice(K, V, CHUNK, stride_b, stride_r, g_stride_b,
                                            g_stride_r)
    NEG = float("-inf")
    lanes = tl.arange(0, BLOCK_V)
    beta_row = tl.where(i == K, beta_bonus, beta)
    m_v = tl.full([BLOCK_V], NEG, tl.float32)
    s_v = tl.zeros([BLOCK_V], tl.float32)
    m_a = tl.full([BLOCK_V], NEG, tl.float32)
    s_a = tl.zeros([BLOCK_V], tl.float32)
    m_b = tl.full([BLOCK_V], NEG, tl.float32)
    s_b = tl.zeros([BLOCK_V], tl.float32)
    m_g = tl.full([BLOCK_V], NEG, tl.float32)  # proposal / T (exact sampling)
    s_g = tl.zeros([BLOCK_V], tl.float32)
    m_f = tl.full([BLOCK_V], NEG, tl.float32)  # v / T with one view (exact sampling)
    s_f = tl.zeros([BLOCK_V], tl.float32)
    best_j = tl.full([BLOCK_V], NEG, tl.float32)  # fused argmax over jointly supported tokens
    idx_j = tl.full([BLOCK_V], 2147483647, tl.int32)
    best_m = tl.full([BLOCK_V], NEG, tl.float32)  # verifier argmax over tokens a view masks
    idx_m = tl.full([BLOCK_V], 2147483647, tl.int32)
    best_v = tl.full([BLOCK_V], NEG, tl.float32)  # verifier argmax over every token (GATE)
    idx_v = tl.full([BLOCK_V], 2147483647, tl.int32)
    for start in range(lo, hi, BLOCK_V):
        offs = start + lanes
        mask = offs < hi
        xv = tl.load(v_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        xb = tl.load(b_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        m_v, s_v = _online(m_v, s_v, xv)
        if GATE:  # the fused argmax of a row the gate turns off (beta_eff = 0: v itself)
            better = xv > best_v
            best_v = tl.where(better, xv, best_v)
            idx_v = tl.where(better, offs, idx_v)
        m_b, s_b = _online(m_b, s_b, xb)
        if ONE_VIEW:  # delta = 0: the fused score is v (the reference's `fused = v`)
            better = xv > best_j
            best_j = tl.where(better, xv, best_j)
            idx_j = tl.where(better, offs, idx_j)
            if RULE == 2:
                m_f, s_f = _online(m_f, s_f, xv / temperature)
        else:
            xa = tl.load(a_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            m_a, s_a = _online(m_a, s_a, xa)
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
            xg = tl.load(g_ptr + g_row + offs, mask=offs < g_hi, other=NEG).to(tl.float32)
            m_g, s_g = _online(m_g, s_g, xg / temperature)
    RS = tl.num_programs(0) * S  # R * S: the stride between partial planes
    out = r.to(tl.int64) * S + tl.program_id(1)
    _store_sums(part_ptr, F_MV, F_SV, RS, out, m_v, s_v)
    _store_sums(part_ptr, F_MB, F_SB, RS, out, m_b, s_b)
    _store_argmax(part_ptr, ipart_ptr, F_TOPJ, I_TOKJ, RS, out, best_j, idx_j)
    if not ONE_VIEW:
        _store_sums(part_ptr, F_MA, F_SA, RS, out, m_a, s_a)
        _store_argmax(part_ptr, ipart_ptr, F_TOPM, I_TOKM, RS, out, best_m, idx_m)
    if GATE:
        _store_argmax(part_ptr, ipart_ptr, F_TOPV, I_TOKV, RS, out, best_v, idx_v)
    if RULE == 2:
        _store_sums(part_ptr, F_MG, F_SG, RS, out, m_g, s_g)
        if ONE_VIEW:
            _store_sums(part_ptr, F_MF, F_SF, RS, out, m_f, s_f)


@triton.jit
def gate_jsd(v_ptr, a_ptr, b_ptr, part_ptr, K, V, CHUNK, S, stride_b, stride_r,
             beta, beta_bonus, temperature,
             RULE: tl.constexpr, GATE: tl.constexpr, BLOCK_V: tl.constexpr,
             BLOCK_S: tl.constexpr):
    """Pass 2 (two views), one program per (row, slice): JSD terms (+ online lse of fused / T,
    and with GATE of v / T: the target of a row the gate turns off)."""
    i, row, _, lo, hi, _, r = _slice(K, V, CHUNK, stride_b, stride_r, 0, 0)
    NEG = float("-inf")
    RS, ss, smask, first = _row_partials(r, S, BLOCK_S)
    lse_a = _lse(part_ptr, first, ss, smask, F_MA, F_SA, RS)
    lse_b = _lse(part_ptr, first, ss, smask, F_MB, F_SB, RS)
    masked_delta = lse_a - lse_b  # on masked tokens: makes log p_a - log p_b = 0
    beta_row = tl.where(i == K, beta_bonus, beta)
    lanes = tl.arange(0, BLOCK_V)
    jsd_acc = tl.zeros([BLOCK_V], tl.float32)
    m_f = tl.full([BLOCK_V], NEG, tl.float32)
    s_f = tl.zeros([BLOCK_V], tl.float32)
    m_f0 = tl.full([BLOCK_V], NEG, tl.float32)  # v / T (GATE)
    s_f0 = tl.zeros([BLOCK_V], tl.float32)
    for start in range(lo, hi, BLOCK_V):
        offs = start + lanes
        mask = offs < hi
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
            m_f, s_f = _online(m_f, s_f, (xv + scaled) / temperature)
            if GATE:
                m_f0, s_f0 = _online(m_f0, s_f0, xv / temperature)
    out = first + tl.program_id(1)
    tl.store(part_ptr + F_JSD * RS + out, _rsum(jsd_acc))
    if RULE == 2:
        _store_sums(part_ptr, F_MF, F_SF, RS, out, m_f, s_f)
        if GATE:
            _store_sums(part_ptr, F_MF0, F_SF0, RS, out, m_f0, s_f0)


@triton.jit
def gate_race(v_ptr, a_ptr, b_ptr, g_ptr, e_ptr, part_ptr, ipart_ptr,
              K, V, CHUNK, S, stride_b, stride_r, g_stride_b, g_stride_r,
              beta, beta_bonus, temperature, jsd_min,
              ONE_VIEW: tl.constexpr, GATE: tl.constexpr, BLOCK_V: tl.constexpr,
              BLOCK_S: tl.constexpr):
    """Pass 3 (exact at T > 0), one program per (row, slice): the exponential races.

    Residual max(0, p - q) (rows < K) and target p, each scored w / E with the sequence's Exp(1)
    vector E; the winners per slice and the largest residual (0: p == q, fall back to p).
    GATE: the row's JSD (pass 2) decides its beta first (beta_eff = 0 below jsd_min)."""
    i, row, g_row, lo, hi, g_hi, r = _slice(K, V, CHUNK, stride_b, stride_r, g_stride_b,
                                            g_stride_r)
    NEG = float("-inf")
    RS, ss, smask, first = _row_partials(r, S, BLOCK_S)
    lse_g = _lse(part_ptr, first, ss, smask, F_MG, F_SG, RS)
    lse_f = _lse(part_ptr, first, ss, smask, F_MF, F_SF, RS)
    if not ONE_VIEW:
        masked_delta = (_lse(part_ptr, first, ss, smask, F_MA, F_SA, RS)
                        - _lse(part_ptr, first, ss, smask, F_MB, F_SB, RS))
    beta_row = tl.where(i == K, beta_bonus, beta)
    if GATE:
        on = _row_jsd(part_ptr, first, ss, smask, RS) >= jsd_min
        beta_row = tl.where(on, beta_row, 0.0)
        lse_f = tl.where(on, lse_f, _lse(part_ptr, first, ss, smask, F_MF0, F_SF0, RS))
    lanes = tl.arange(0, BLOCK_V)
    best_r = tl.full([BLOCK_V], -1.0, tl.float32)
    idx_r = tl.full([BLOCK_V], 2147483647, tl.int32)
    best_p = tl.full([BLOCK_V], -1.0, tl.float32)
    idx_p = tl.full([BLOCK_V], 2147483647, tl.int32)
    top_r = tl.zeros([BLOCK_V], tl.float32)
    e_row = (r // (K + 1)).to(tl.int64) * V
    for start in range(lo, hi, BLOCK_V):
        offs = start + lanes
        mask = offs < hi
        xv = tl.load(v_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        xg = tl.load(g_ptr + g_row + offs, mask=offs < g_hi, other=NEG).to(tl.float32)
        ex = tl.load(e_ptr + e_row + offs, mask=mask, other=1.0)
        if ONE_VIEW:
            p = tl.exp(xv / temperature - lse_f)
        else:
            xa = tl.load(a_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            xb = tl.load(b_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
            delta = tl.where((xa > NEG) & (xb > NEG), xa - xb, masked_delta)
            scaled = delta * beta_row
            p = tl.exp((xv + scaled) / temperature - lse_f)
        q = tl.exp(xg / temperature - lse_g)
        res = tl.maximum(p - q, 0.0)
        score_r = tl.where(mask, res / ex, -1.0)
        score_p = tl.where(mask, p / ex, -1.0)
        top_r = tl.maximum(top_r, tl.where(mask, res, 0.0))
        better = score_r > best_r
        best_r = tl.where(better, score_r, best_r)
        idx_r = tl.where(better, offs, idx_r)
        better = score_p > best_p
        best_p = tl.where(better, score_p, best_p)
        idx_p = tl.where(better, offs, idx_p)
    out = first + tl.program_id(1)
    _store_argmax(part_ptr, ipart_ptr, F_TOPR, I_TOKR, RS, out, best_r, idx_r)
    _store_argmax(part_ptr, ipart_ptr, F_TOPP, I_TOKP, RS, out, best_p, idx_p)
    tl.store(part_ptr + F_MAXR * RS + out, _rmax(top_r))


@triton.jit
def gate_finish(v_ptr, a_ptr, b_ptr, g_ptr, d_ptr, u_ptr, part_ptr, ipart_ptr,
                jsd_ptr, n_ptr, next_ptr, K, V, S, stride_b, stride_r, g_stride_b, g_stride_r,
                beta, beta_bonus, log_gamma, temperature, jsd_min,
                RULE: tl.constexpr, ONE_VIEW: tl.constexpr, GATE: tl.constexpr,
                BLOCK_S: tl.constexpr):
    """One program per sequence: merge each row's slices, test its draft, stop at the first reject."""
    _finish(tl.program_id(0).to(tl.int64), tl.num_programs(0) * (K + 1) * S,
            v_ptr, a_ptr, b_ptr, g_ptr, d_ptr, u_ptr, part_ptr, ipart_ptr, jsd_ptr, n_ptr,
            next_ptr, K, V, S, stride_b, stride_r, g_stride_b, g_stride_r, beta, beta_bonus,
            log_gamma, temperature, jsd_min, RULE, ONE_VIEW, GATE, BLOCK_S)


@helper
def _finish(b, RS, v_ptr, a_ptr, b_ptr, g_ptr, d_ptr, u_ptr, part_ptr, ipart_ptr,
            jsd_ptr, n_ptr, next_ptr, K, V, S, stride_b, stride_r, g_stride_b, g_stride_r,
            beta, beta_bonus, log_gamma, temperature, jsd_min,
            RULE: tl.constexpr, ONE_VIEW: tl.constexpr, GATE: tl.constexpr,
            BLOCK_S: tl.constexpr):
    """gate_finish's body for sequence b (int64); RS = R * S, the partial planes' stride.

    GATE: a row whose JSD is under jsd_min takes beta_eff = 0 (the verifier's own argmax, and
    for exact sampling its own log-sum-exp of v / T)."""
    ss = tl.arange(0, BLOCK_S)
    smask = ss < S
    NEG = float("-inf")
    n = tl.zeros([], tl.int64) + K
    tok = tl.zeros([], tl.int64)
    found = tl.zeros([], tl.int32)
    for i in range(0, K + 1):
        first = (b * (K + 1) + i) * S
        row = b * stride_b + i * stride_r
        has_g = i < K
        beta_row = tl.where(i == K, beta_bonus, beta)
        lse_v = _lse(part_ptr, first, ss, smask, F_MV, F_SV, RS)
        lse_b = _lse(part_ptr, first, ss, smask, F_MB, F_SB, RS)
        top_j, tok_j = _first_max_of(part_ptr, ipart_ptr, first, ss, smask, F_TOPJ, I_TOKJ, RS,
                                     NEG)
        if ONE_VIEW:
            jsd = tl.zeros([], tl.float32)
            masked_delta = tl.zeros([], tl.float32)
            cand = tok_j.to(tl.int64)
        else:
            lse_a = _lse(part_ptr, first, ss, smask, F_MA, F_SA, RS)
            masked_delta = lse_a - lse_b
            jsd = _row_jsd(part_ptr, first, ss, smask, RS)
            top_m, tok_m = _first_max_of(part_ptr, ipart_ptr, first, ss, smask, F_TOPM, I_TOKM,
                                         RS, NEG)
            top_m = top_m + masked_delta * beta_row
            cand = tl.where(top_m > top_j, tok_m,
                            tl.where(top_m == top_j, tl.minimum(tok_j, tok_m), tok_j)).to(tl.int64)
            if GATE:  # below jsd_min: beta_eff = 0, the verifier's own argmax
                on = jsd >= jsd_min
                beta_row = tl.where(on, beta_row, 0.0)
                _, tok_v = _first_max_of(part_ptr, ipart_ptr, first, ss, smask, F_TOPV, I_TOKV,
                                         RS, NEG)
                cand = tl.where(on, cand, tok_v.to(tl.int64))
        cand = tl.where(cand == 2147483647, 0, cand)  # every token masked: argmax says index 0

        d = tl.load(d_ptr + b * K + i, mask=has_g, other=0).to(tl.int64)
        d = tl.minimum(tl.maximum(d, 0), V - 1)  # never read out of the row (CPU input is checked)
        xv_d = tl.load(v_ptr + row + d).to(tl.float32)
        xb_d = tl.load(b_ptr + row + d).to(tl.float32)
        if RULE == 0:
            accept = (xv_d - lse_v) > (log_gamma - jsd) + (xb_d - lse_b)  # p_v > gamma_eff p_b
        elif RULE == 1:
            accept = d == cand
        else:
            lse_g = _lse(part_ptr, first, ss, smask, F_MG, F_SG, RS)
            lse_f = _lse(part_ptr, first, ss, smask, F_MF, F_SF, RS)
            if GATE:
                lse_f = tl.where(on, lse_f, _lse(part_ptr, first, ss, smask, F_MF0, F_SF0, RS))
            if ONE_VIEW:
                lp_d = xv_d / temperature - lse_f
            else:
                xa_d = tl.load(a_ptr + row + d).to(tl.float32)
                delta_d = tl.where((xa_d > NEG) & (xb_d > NEG), xa_d - xb_d, masked_delta)
                lp_d = (xv_d + delta_d * beta_row) / temperature - lse_f
            xg_d = tl.load(g_ptr + b * g_stride_b + i * g_stride_r + d, mask=has_g,
                           other=0.0).to(tl.float32)
            lq_d = xg_d / temperature - lse_g
            u = tl.load(u_ptr + b * K + i, mask=has_g, other=0.5)
            accept = tl.log(u) + lq_d < lp_d  # u * q(d) < p(d)
            _, tok_r = _first_max_of(part_ptr, ipart_ptr, first, ss, smask, F_TOPR, I_TOKR, RS,
                                     -1.0)
            _, tok_p = _first_max_of(part_ptr, ipart_ptr, first, ss, smask, F_TOPP, I_TOKP, RS,
                                     -1.0)
            max_r = _rmax(tl.load(part_ptr + F_MAXR * RS + first + ss, mask=smask, other=0.0))
            cand = tl.where(has_g & (max_r > 0.0), tok_r, tok_p).to(tl.int64)
        tl.store(jsd_ptr + b * (K + 1) + i, jsd)
        stop = (found == 0) & ((i == K) | (accept == 0))
        n = tl.where(stop, i, n)
        tok = tl.where(stop, cand, tok)
        found = tl.where(stop, 1, found)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, tok)


@helper
def _jsd_sum(a_ptr, b_ptr, row, lo, hi, lse_a, lse_b, BLOCK_V: tl.constexpr):
    """Sum of the JSD terms of columns [lo, hi) of one row (gate_jsd's sweep, cda/greedy)."""
    NEG = float("-inf")
    lanes = tl.arange(0, BLOCK_V)
    jsd_acc = tl.zeros([BLOCK_V], tl.float32)
    for start in range(lo, hi, BLOCK_V):
        offs = start + lanes
        mask = offs < hi
        xa = tl.load(a_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        xb = tl.load(b_ptr + row + offs, mask=mask, other=NEG).to(tl.float32)
        la = xa - lse_a
        lb = xb - lse_b
        pa = tl.exp(la)
        pb = tl.exp(lb)
        log_m = tl.log(tl.maximum(pa + pb, 1.1754943508222875e-38)) - 0.6931471805599453
        term = tl.where(xa > NEG, pa * (la - log_m), 0.0)
        term += tl.where(xb > NEG, pb * (lb - log_m), 0.0)
        jsd_acc += tl.where(mask, term, 0.0)
    return _rsum(jsd_acc)


@triton.jit
def gate_fused(v_ptr, a_ptr, b_ptr, g_ptr, d_ptr, u_ptr, part_ptr, ipart_ptr, count_ptr,
               jsd_ptr, n_ptr, next_ptr, K, V, CHUNK, S, stride_b, stride_r, g_stride_b,
               g_stride_r, beta, beta_bonus, log_gamma, temperature, jsd_min,
               RULE: tl.constexpr, ONE_VIEW: tl.constexpr, GATE: tl.constexpr,
               BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr):
    """The whole gate in ONE launch (cda / greedy; small batches), one program per (row, slice).

    Each program runs pass 1 on its slice, then counts itself done on its row (an atomic
    counter, acquire-release): the row's last program merges the row's log-sum-exps, sweeps the
    whole row for its JSD (two views; the row was just read, so mostly from L2) and counts the
    row done on its sequence; the sequence's last row runs the finish. Counters are left at 0
    for the next call (one stream at a time uses them: fused_gate.py)."""
    _stats(v_ptr, a_ptr, b_ptr, g_ptr, part_ptr, ipart_ptr, K, V, CHUNK, S, stride_b, stride_r,
           g_stride_b, g_stride_r, beta, beta_bonus, temperature, RULE, ONE_VIEW, GATE, BLOCK_V)
    r = tl.program_id(0)
    R = tl.num_programs(0)
    RS = R * S
    tl.debug_barrier()  # every thread's partial stores happen before the release below
    done = tl.atomic_add(count_ptr + r, 1)  # acq_rel: this slice's partials are published
    if done == S - 1:  # the row's last slice: every partial of the row is visible here
        tl.store(count_ptr + r, 0)
        seq = r // (K + 1)
        if not ONE_VIEW:
            i = r % (K + 1)
            row = seq.to(tl.int64) * stride_b + i.to(tl.int64) * stride_r
            ss = tl.arange(0, BLOCK_S)
            smask = ss < S
            first = r.to(tl.int64) * S
            lse_a = _lse(part_ptr, first, ss, smask, F_MA, F_SA, RS)
            lse_b = _lse(part_ptr, first, ss, smask, F_MB, F_SB, RS)
            jsd = _jsd_sum(a_ptr, b_ptr, row, 0, V, lse_a, lse_b, BLOCK_V)
            tl.store(part_ptr + F_JSD * RS + first + ss, tl.where(ss == 0, jsd, 0.0), mask=smask)
        tl.debug_barrier()
        rows_done = tl.atomic_add(count_ptr + R + seq, 1)  # acq_rel: the row is published
        if rows_done == K:  # the sequence's last row: finish it
            tl.store(count_ptr + R + seq, 0)
            _finish(seq.to(tl.int64), RS, v_ptr, a_ptr, b_ptr, g_ptr, d_ptr, u_ptr, part_ptr,
                    ipart_ptr, jsd_ptr, n_ptr, next_ptr, K, V, S, stride_b, stride_r,
                    g_stride_b, g_stride_r, beta, beta_bonus, log_gamma, temperature, jsd_min,
                    RULE, ONE_VIEW, GATE, BLOCK_S)
