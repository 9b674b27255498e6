"""Row floors: the fewest query rows a CPU kernel must be given so a row's bits do not depend on the call.

Lossless speculation needs "one position, one score": the verifier must give a position the same
logits whether it comes alone (mode full's one-token decode) or inside a K+1-token verify. The
arithmetic is the same; the bits are the kernel's, and CPU kernels pick their code path by the
number of rows (query rows for attention, input rows for a linear layer). Measured, bf16:
- an Intel CPU with AMX: attention gives one row other bits than 2..40 rows, which all agree
  (floor 2); linear layers give every row count the same bits (floor 1);
- an AMD EPYC with AVX512-BF16 and no AMX: attention agrees within 1, within 2-3 and within 4+
  rows, not across (floor 4); a linear layer over 1536 inputs gives one row other bits than 2+
  rows (floor 2). (float32, measured there, agrees from 4 rows on; float32 forwards are not
  padded: its decode and verify agree to rounding, as before.)
So decode and verify forwards of fewer rows than the floor run with their rows repeated up to the
floor (the extra rows are discarded): every position then takes the same code path. The cost is
the kernels' multi-row path where one row had a faster one: nothing on AMX (the floors are the
behaviour before them), on that AMD +17% for a one-token forward of the embedded verifier and +3%
for a 4-token one (docs/results.md, "The same on a second CPU").

`attention_floor(dtype)` (asymagent/kv/attention.py) and `linear_floor(dtype, shape)`
(asymagent/modeling/packed_linear.py, per layer shape) probe this machine once per (dtype, thread
count) with random data, with the helpers here (`smallest_floor`, `linear_rows_floor`; the
weight-only low-bit layers' `row_floor` in asymagent/modeling/weight_only.py too): for each candidate floor (attention 2, 4, 8;
linear 1, 2, 4), every row of calls of 1..32 rows, each padded to the floor, must equal the same
row computed alone (padded to the floor). The smallest candidate that holds is the floor; if none
holds, the largest candidate (the closest this machine gets). The end result is checked on the model itself
(`tests/test_row_floor.py`; `python -m asymagent.evals.probes.position_bits` on any machine).
`ASYMAGENT_ROW_FLOORS=0` turns the probes off (the behaviour before them, to measure the cost).
"""

from __future__ import annotations

import os

import torch

ROW_COUNTS = (1, 2, 3, 4, 5, 6, 8, 14, 17, 32)  # row counts of the calls a probe compares


def pad_rows(x: torch.Tensor, floor: int, dim: int) -> torch.Tensor:
    """`x` with its `dim` repeated cyclically up to `floor` entries (unchanged when it has as many)."""
    n = x.shape[dim]
    if n >= floor:
        return x
    # one cat, not repeat + narrow: the same values at a fifth of the per-call time (~3 us vs
    # ~20 us on the CPU), and a decode pads ~90 times per forward (attention and linear rows)
    parts = [x] * (floor // n)
    if floor % n:
        parts.append(x.narrow(dim, 0, floor % n))
    return torch.cat(parts, dim)


def floors_off() -> bool:
    """`ASYMAGENT_ROW_FLOORS=0`: no probing, the behaviour before floors (to measure their cost)."""
    return os.environ.get("ASYMAGENT_ROW_FLOORS", "").strip().lower() in ("0", "false", "off", "no")


def rows_agree(call, dim: int) -> bool:
    """call(rows, lo) computes rows lo..lo+rows-1 (of 32) in one call; each row must equal the row
    computed alone, for every row count in ROW_COUNTS (blocks at the start and at the end)."""
    alone = {}
    for rows in ROW_COUNTS:
        lo = 32 - rows if rows % 2 else 0
        out = call(rows, lo)
        for i in range(rows):
            r = lo + i
            if r not in alone:
                alone[r] = call(1, r).select(dim, 0)
            if not torch.equal(out.select(dim, i), alone[r]):
                return False
    return True


def smallest_floor(candidates, draws, call, dim: int) -> int | None:
    """The first of `candidates` for which `rows_agree` holds on every draw, or None.

    call(draw, floor, rows, lo) computes rows lo..lo+rows-1 of `draw` padded to `floor`; `dim` is
    the row dimension of its result."""
    for floor in candidates:
        if all(rows_agree(lambda rows, lo, d=d: call(d, floor, rows, lo), dim) for d in draws):
            return floor
    return None


def linear_rows_floor(candidates, inputs, linear) -> int | None:
    """`smallest_floor` of a row-wise layer: linear(x [rows, in]) -> [rows, out] on inputs [32, in]."""
    def call(x, floor, rows, lo):  # [rows, out]
        return linear(pad_rows(x[lo:lo + rows], floor, 0))[:rows]

    with torch.inference_mode():
        return smallest_floor(candidates, inputs, call, dim=0)
