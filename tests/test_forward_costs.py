"""Costs in company (asymagent/scheduling/forward_costs.py, company_clock.py): the online fit of a
forward's seconds by sequences and rows, each sequence's share of a forward, the thread's clock,
and the draft length adaptive K picks from those costs as the batch grows (given costs, no timing)."""

from __future__ import annotations

import threading

import pytest

from asymagent.decoding.adaptive_k import AdaptiveK
from asymagent.scheduling import company_clock
from asymagent.scheduling.forward_costs import MIN_FORWARDS, ForwardCosts

# the embedded verifier's measured shape (forward_costs.py doc), seconds
FIXED, PER_SEQ, PER_ROW = 0.032, 0.0058, 0.0007


def _seconds(seqs: int, rows: int, fixed=FIXED, per_seq=PER_SEQ, per_row=PER_ROW) -> float:
    return fixed + per_seq * seqs + per_row * rows


def _fitted(fixed=FIXED, per_seq=PER_SEQ, per_row=PER_ROW) -> ForwardCosts:
    costs = ForwardCosts()
    for seqs, per in [(1, 1), (1, 4), (2, 1), (4, 3), (8, 1), (8, 4), (6, 2), (3, 8), (8, 2)] * 3:
        costs.observe(seqs, seqs * per, _seconds(seqs, seqs * per, fixed, per_seq, per_row))
    return costs


def test_fit_recovers_the_cost_shape():
    coef = _fitted().coefficients()
    assert coef == pytest.approx((FIXED, PER_SEQ, PER_ROW), rel=1e-2)  # the ridge biases it a little


def test_no_fit_before_enough_forwards_and_shares_split_evenly():
    costs = ForwardCosts()
    for _ in range(MIN_FORWARDS - 1):
        costs.observe(8, 8, _seconds(8, 8))
    assert costs.coefficients() is None and costs.per_row() == 0.0
    assert costs.shares([1, 4, 3], 0.09) == pytest.approx([0.03, 0.03, 0.03])


def test_one_shape_only_still_splits_a_forward_by_its_rows():
    """Every forward of 8 sequences (fixed and per-sequence parts not separable): the ridge
    keeps the fit solvable and the per-row part is still found."""
    costs = ForwardCosts()
    for rows in [8, 16, 24, 32, 12, 20] * 4:
        costs.observe(8, rows, _seconds(8, rows))
    assert costs.per_row() == pytest.approx(PER_ROW, rel=1e-2)


def test_shares_add_up_to_the_forward_and_charge_rows():
    costs = _fitted()
    rows = [1, 4, 1, 1, 2, 1, 1, 1]
    seconds = _seconds(len(rows), sum(rows))
    shares = costs.shares(rows, seconds)
    assert sum(shares) == pytest.approx(seconds)
    assert shares[1] - shares[0] == pytest.approx(3 * PER_ROW, rel=1e-3)
    assert shares[0] == pytest.approx(FIXED / 8 + PER_SEQ + PER_ROW, rel=1e-3)
    # a per-row cost above the forward's own seconds per row is clamped: no negative share
    assert min(costs.shares([16, 16], 0.005)) >= 0.0
    assert costs.shares([3], 0.05) == [0.05]  # alone: the whole forward


def test_company_clock_moves_by_the_charges_of_its_own_thread():
    t0 = company_clock.now()
    company_clock.charge(waited=10.0, share=0.25)  # waited 10 s for a forward that cost it 0.25 s
    assert company_clock.now() - t0 < 0.0  # the wait is taken out, the share put in
    other: list = []
    th = threading.Thread(target=lambda: other.append(company_clock.now()))
    th.start()
    th.join()
    assert other[0] > company_clock.now()  # another thread's clock is untouched
    company_clock.charge(waited=0.25, share=10.0)  # undo for the tests after this one


def _k_in_company(seqs: int, alpha_counts=(600, 1000)) -> int:
    """The K adaptive K picks for a request whose costs are its shares of forwards of `seqs`
    sequences (the verifier's, and the drafter's plus its own draft Python), others 1 row each."""
    verifier = _fitted()
    drafter = _fitted(fixed=0.003, per_seq=0.0003, per_row=0.0001)
    python_per_draft = 0.0007  # the draft head and sampling, the request's own serial time

    def share(costs: ForwardCosts, mine: int, fixed, per_seq, per_row) -> float:
        rows = [mine] + [1] * (seqs - 1)
        return costs.shares(rows, _seconds(seqs, sum(rows), fixed, per_seq, per_row))[0]

    t_draft = share(drafter, 1, 0.003, 0.0003, 0.0001) + python_per_draft
    t_verify = {k: share(verifier, k + 1, FIXED, PER_SEQ, PER_ROW) for k in range(1, 9)}
    accepted, reached = alpha_counts
    ak = AdaptiveK(k=4, k_min=1, k_max=8, accepted=accepted, reached=reached, t_draft=t_draft,
                   t_plain=share(verifier, 1, FIXED, PER_SEQ, PER_ROW), t_verify=t_verify)
    ak.record_round(4, 2, 4 * t_draft, t_verify[4])  # one measured round: the choice runs
    assert ak.enabled
    return ak.k


def test_adaptive_k_drafts_less_as_the_batch_grows():
    """Alone a request's verify costs the whole forward, so rows are nearly free and K is long;
    beside 7 others its share of the fixed part is an eighth while a row costs what it did, so
    the same acceptance buys fewer drafts."""
    ks = [_k_in_company(s) for s in (1, 2, 4, 8)]
    assert ks == sorted(ks, reverse=True), ks
    assert ks[-1] < ks[0], ks
    # a drafter that is rarely right drafts even less, alone as in company
    assert _k_in_company(8, (200, 1000)) <= _k_in_company(1, (200, 1000)) <= ks[0]
