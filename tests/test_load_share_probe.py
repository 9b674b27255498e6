"""The load-share probe's bookkeeping (evals/probes/load_share.py): each policy's environment and
the summary's medians and shares; the measurement itself runs engines and is not a unit test."""

from __future__ import annotations

import pytest

from asymagent.evals.probes.load_share import policy_env, summarize


def test_policy_environments(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the caller's own never leaks into a run
    old = policy_env("old")
    assert "OMP_WAIT_POLICY" not in old and old["ASYMAGENT_LOAD_POLICY"] == "old"
    assert policy_env("old", demo=True)["GOMP_SPINCOUNT"] == "300000"  # libgomp's default spin
    assert "OMP_WAIT_POLICY" not in policy_env("new")  # the worker applies the policy itself
    env = policy_env("env:GOMP_SPINCOUNT=10000+OMP_NUM_THREADS=1")
    assert (env["GOMP_SPINCOUNT"], env["OMP_NUM_THREADS"]) == ("10000", "1")
    with pytest.raises(ValueError):
        policy_env("fast")


def test_summary_medians_and_shares():
    runs = [{"policy": "new", "competitors": 0, "tok_s": 20.0}, {"policy": "new", "competitors": 0, "tok_s": 10.0},
            {"policy": "new", "competitors": 1, "tok_s": 6.0}, {"policy": "old", "competitors": 0, "tok_s": 4.0},
            {"policy": "old", "competitors": 1, "timed_out_s": 60.0}]
    s = summarize(runs, demo=False)
    assert s["new"]["0"]["median"] == 15.0 and s["new"]["1"]["share_of_quiet"] == pytest.approx(0.4)
    assert s["old"]["1"]["median"] == 0.0  # a run that timed out decoded nothing in time
    demo = summarize([{"policy": "new", "competitors": 0, "demo_s": 10.0},
                      {"policy": "new", "competitors": 1, "timed_out_s": 30.0}], demo=True)
    assert demo["new"]["1"]["x_quiet"] == pytest.approx(3.0)  # the limit: a lower bound
