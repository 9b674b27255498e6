"""ForwardCosts: what one model's forwards cost by sequences and rows, fitted online, and each sequence's share of one.

A decode-sized forward of several sequences (asymagent/kv/batched_forward.py) costs a fixed part
(the weights read once, per-call Python), a part per sequence (its attention over its own cache
and the small per-sequence ops of every layer) and a part per row (the rows of the linears).
Measured on the embedded verifier (SmolLM2-135M, bf16, 2 cores, ~800 cached tokens a
sequence; docs/engine.md "Draft cost in company"): one sequence of 1 row ~38 ms, 8 sequences of
1 row ~78 ms (~5.8 ms a sequence), 8 of 4 rows ~95 ms (~0.7 ms a row): a sequence costs about
eight rows, so in company a draft row is cheap next to a verify step, and cheaper still next
to a step of its own.

`observe(seqs, rows, seconds)` adds a forward the batcher ran to a least-squares fit of
seconds = fixed + per_seq * seqs + per_row * rows (exponential forgetting, so it follows the
contexts as they grow; a small ridge keeps it solvable while every forward has the same number
of sequences). `shares(rows, seconds)` splits one measured forward between its sequences: each
gets its rows at the fitted per-row cost (clamped to [0, seconds / rows]) and an even part of
the rest, so the shares add up to the forward's seconds. Only speed decisions read them
(asymagent/scheduling/company_clock.py).
"""

from __future__ import annotations

MIN_FORWARDS = 8  # forwards observed before the per-row cost is read from the fit


class ForwardCosts:
    """The online cost fit of one model's decode-sized forwards (module doc)."""

    def __init__(self, forget: float = 0.98, ridge: float = 1e-6) -> None:
        self.forget = forget  # weight of the older forwards after each new one
        self.ridge = ridge  # relative to the fit matrix's trace
        self.forwards = 0
        self._m = [[0.0] * 3 for _ in range(3)]  # sum of w x x^T, x = (1, seqs, rows)
        self._v = [0.0] * 3  # sum of w x seconds
        self._coef: tuple | None = None  # (fixed, per_seq, per_row), solved lazily

    def observe(self, seqs: int, rows: int, seconds: float) -> None:
        x = (1.0, float(seqs), float(rows))
        for i in range(3):
            self._v[i] = self.forget * self._v[i] + x[i] * seconds
            for j in range(3):
                self._m[i][j] = self.forget * self._m[i][j] + x[i] * x[j]
        self.forwards += 1
        self._coef = None

    def coefficients(self) -> tuple | None:
        """(fixed, per_seq, per_row) seconds from the fit, or None before MIN_FORWARDS."""
        if self.forwards < MIN_FORWARDS:
            return None
        if self._coef is None:
            lam = self.ridge * (self._m[0][0] + self._m[1][1] + self._m[2][2])
            a = [[self._m[i][j] + (lam if i == j else 0.0) for j in range(3)] + [self._v[i]]
                 for i in range(3)]
            self._coef = _solve3(a)
        return self._coef

    def per_row(self) -> float:
        """Fitted seconds per row (0 before the fit)."""
        coef = self.coefficients()
        return max(coef[2], 0.0) if coef is not None else 0.0

    def shares(self, rows: list, seconds: float) -> list:
        """Each sequence's part of a forward of `rows` (rows per sequence) that took `seconds`:
        its rows at the per-row cost, plus an even part of the rest; they sum to `seconds`."""
        total = sum(rows)
        per_row = min(self.per_row(), seconds / total) if total else 0.0
        rest = (seconds - per_row * total) / len(rows)
        return [rest + per_row * r for r in rows]


def _solve3(a: list) -> tuple | None:
    """Gaussian elimination with partial pivoting on a 3x4 augmented matrix; None if singular."""
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-15:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(3):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return tuple(a[i][3] / a[i][i] for i in range(3))
