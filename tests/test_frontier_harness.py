"""The context frontier harness's figures (evals/running/frontier.py): fidelity, accuracy, right
where full is right, attack success, their 95% intervals, and merging runs, on hand-made records."""

import math

from asymagent.evals.running import frontier as fr


def _rec(policy, step, ids, correct, secs, attacked=None, seed=0, workload="w"):
    return fr.Record(workload, seed, step, policy, ids, correct, attacked, secs, 10, 10, 20, 0.5, 0, 0, 0, "")


def _records():
    # 4 steps; full right on steps 0, 1, 2; "a" equals full on 0, 1, 3 and is right on 0, 3
    out = []
    for step, (full_ok, a_ids, a_ok) in enumerate([(True, [1], True), (True, [2], False), (True, [9], False),
                                                   (False, [4], True)]):
        out.append(_rec("full", step, [step + 1], full_ok, 2.0))
        out.append(_rec("a", step, a_ids, a_ok, 1.0))
    return out


def test_wilson_interval_brackets_the_rate():
    assert fr.wilson(0, 0) is None
    lo, hi = fr.wilson(8, 10)
    assert lo < 0.8 < hi and 0.0 <= lo and hi <= 1.0
    lo, hi = fr.wilson(0, 50)
    assert lo == 0.0 and 0.0 < hi < 0.1  # a zero rate still has an upper bound
    # the textbook value: 8/10 -> [0.490, 0.943]
    assert math.isclose(fr.wilson(8, 10)[0], 0.4902, abs_tol=1e-3)
    assert math.isclose(fr.wilson(8, 10)[1], 0.9433, abs_tol=1e-3)


def test_summarize_counts_and_intervals():
    pols = [fr.Policy("full", "full"), fr.Policy("a", "asym")]
    s = fr.summarize(_records(), pols)
    a = s["a"]
    assert a["steps"] == 4
    assert a["fidelity"] == 0.75 and a["fidelity_ci"] == fr.wilson(3, 4)
    assert a["step_accuracy"] == 0.5
    assert a["full_right_steps"] == 3 and math.isclose(a["right_where_full_right"], 1 / 3)
    assert a["right_where_full_right_ci"] == fr.wilson(1, 3)
    assert a["speed_vs_full"] == 2.0 and a["speed_ci"] == [2.0, 2.0]  # every step exactly 2x
    assert s["full"]["fidelity"] == 1.0 and s["full"]["right_where_full_right"] == 1.0
    assert a["attack_success"] is None and a["attack_success_ci"] is None


def test_attack_success_counts_episodes():
    pols = [fr.Policy("full", "full"), fr.Policy("a", "asym")]
    recs = []
    for seed in range(5):
        recs.append(_rec("full", 0, [1], False, 1.0, attacked=seed < 2, seed=seed))
        recs.append(_rec("a", 0, [1], False, 1.0, attacked=False, seed=seed))
    s = fr.summarize(recs, pols)
    assert (s["full"]["attacked_episodes"], s["full"]["exposed_episodes"]) == (2, 5)
    assert s["full"]["attack_success"] == 0.4 and s["full"]["attack_success_ci"] == fr.wilson(2, 5)
    assert s["a"]["attack_success"] == 0.0


def test_merge_resummarizes_records_and_keeps_first_measurement():
    recs = _records()
    doc1 = {"command": "one", "date": "d", "settings": {"policies": {"full": {"label": "full"},
                                                                     "a": {"label": "asym"}}},
            "workloads": {"w": {"a": {"stale": True}}}, "records": [r.__dict__ for r in recs]}
    doc2 = {"command": "two", "date": "d", "workloads": {"w": {"a": {"steps": 99}, "b": {"steps": 7}}}}
    merged = fr.merge_reports([doc1, doc2])
    w = merged["workloads"]["w"]
    assert w["a"]["fidelity"] == 0.75 and "stale" not in w["a"]  # recomputed from doc1's records
    assert w["b"] == {"steps": 7}  # only doc2 has it
    assert [s["command"] for s in merged["sources"]] == ["one", "two"]
    table = fr.markdown(merged | {"workloads": {"w": {k: w[k] for k in ("full", "a")}}})
    assert "0.75 [" in table and "(3)" in table


def test_merge_pools_suite_runs_over_common_policies():
    def doc(workload, names, cmd="python -m x"):
        recs = [r for r in _records() for r in [r]]
        for r in recs:
            r.workload = workload
        pols = {n: {"label": "full" if n == "full" else "asym"} for n in names}
        return {"command": cmd, "settings": {"policies": pols},
                "records": [r.__dict__ for r in recs if r.policy in names]}

    bench = doc("bench", ["full", "a"])
    s1, s2 = doc("s1", ["full", "a"]), doc("s2", ["full", "a", "b"])
    attack = doc("atk", ["full", "a"], cmd="python -m x --exposed-only")
    merged = fr.merge_reports([bench, s1, s2, attack])
    pooled = merged["suites_pooled"]
    assert set(pooled) == {"full", "a"}  # "b" is not in every suite run
    assert pooled["a"]["steps"] == 8  # s1 + s2, not the bench or the attack set
    assert pooled["a"]["full_right_steps"] == 6


def test_a_step_over_the_context_limit_is_skipped_for_every_policy_and_listed():
    """A step whose full view leaves no room to generate cannot be compared: the policies that ran
    it lose their record of it, the step is listed with who refused and who answered right, the
    next steps still run."""
    from types import SimpleNamespace

    from asymagent.engine import ContextLengthError
    from asymagent.stats import StepStats

    class Caches:
        def drop(self, key):
            pass

    class Engine:  # runs a step unless mode full's prompt (its history length) is too long
        compression = None
        caches = Caches()
        suffix_stores: dict = {}

        def chat(self, history, mode, **kw):
            if mode == "full" and len(history) > 2:
                raise ContextLengthError("prompt_ids has 9000 tokens but the model's context limit ...")
            return SimpleNamespace(token_ids=[len(history)], tool_calls=[], text="ok", stats=StepStats())

    conv = fr.Conversation("w", 0, [fr.Step(["m"] * n, [], "auto", lambda calls, text: True) for n in (1, 3, 2)])
    policies = fr.parse_policies("full;asym")
    skipped: list = []
    out = fr.run_conversation(Engine(), conv, policies, max_new_tokens=4, skipped=skipped)
    assert [(r.step, r.policy) for r in out] == [(0, "full"), (0, "asym"), (2, "full"), (2, "asym")]
    assert [s["step"] for s in skipped] == [1] and "context limit" in skipped[0]["why"]
    # the policies whose verifier could read it answered it; that is reported, not compared
    assert skipped[0]["refused"] == ["full"] and skipped[0]["answered"] == {"asym": True}
    assert fr.beyond_window(skipped, policies) == {
        "full": {"steps": 1, "answered": 0, "right": 0}, "asym": {"steps": 1, "answered": 1, "right": 1}}


def test_gap_sources_names_the_parted_word_and_where_it_stands():
    """evals/probes/gap_sources.py: the word full wrote where two outputs part, and whether the
    reduced view had it (visible), only the full view had it (removed), or neither (unseen)."""
    from asymagent.evals.probes.gap_sources import classify, parted_word

    full = '{"name": "get_ticket", "arguments": {"ticket_id": "TCK-3335"}}'
    other = '{"name": "get_ticket", "arguments": {"ticket_id": "TCK-5038"}}'
    assert parted_word(full, other) == "TCK-3335"
    assert parted_word('{"name": "list_dir", "arguments": {"path": "/srv/exports/finance"}}',
                       '{"name": "list_dir", "arguments": {"path": "/srv/exports/ops"}}') == "srv/exports/finance"
    assert parted_word('{"page": 2}', '{"page": 1}') == "2"
    full_view, reduced = "TCK-3335 TCK-5038 finance/ ops/", "TCK-5038 [... 20 tokens omitted ...] ops/"
    assert classify("TCK-3335", full_view, reduced) == "removed"
    assert classify("TCK-5038", full_view, reduced) == "visible"
    assert classify("TCK-9999", full_view, reduced) == "unseen"
    assert classify("2", full_view, reduced) == "short"
    assert classify("srv/exports/ops", full_view, reduced) == "visible"  # a path: its last part


def test_a_policy_named_twice_is_refused():
    """Each policy has its own cache session by name: a repeat would reuse the first one's cache
    (and prefill nothing), so it is an error, not a second measurement."""
    import pytest

    with pytest.raises(ValueError, match="named twice: full"):
        fr.parse_policies("full;spec;full;asym")


def test_lossless_ceiling_is_full_wall_over_full_prefill_time():
    """Mode full's prefill share bounds every lossless policy: ceiling = wall(full) / prefill(full)."""
    recs = []
    for step in range(3):
        full = _rec("full", step, [step], True, 2.0)
        full.prefill_s = 0.5  # a quarter of full's time
        spec = _rec("spec", step, [step], True, 1.0)
        spec.prefill_s = 0.6
        recs += [full, spec]
    out = fr.summarize(recs, fr.parse_policies("full;spec"))
    assert math.isclose(out["full"]["prefill_share"], 0.25)
    assert math.isclose(out["full"]["lossless_ceiling"], 4.0)
    assert math.isclose(out["spec"]["prefill_share"], 0.6) and "lossless_ceiling" not in out["spec"]
    assert "at most 4.00x full" in fr.markdown({"workloads": {"w": out}})
    old = fr.summarize([_rec("full", 0, [0], True, 2.0)], fr.parse_policies("full"))  # no prefill_s
    assert old["full"]["prefill_share"] is None and "lossless_ceiling" not in old["full"]


def test_plot_draws_another_run_beside(tmp_path):
    """`--beside`: the pair's pooled suites next to the 135M's, one panel each, in one PNG."""
    import matplotlib.image

    def doc(workload):
        recs = _records()
        for r in recs:
            r.workload = workload
        return {"command": "python -m x", "settings": {"policies": {"full": {"label": "full"}, "a": {"label": "asym"}}},
                "records": [r.__dict__ for r in recs]}

    mine = fr.merge_reports([doc("bench"), doc("s1")])
    other = fr.merge_reports([doc("s1"), doc("s2")])
    out = tmp_path / "f.png"
    fr.plot(mine, out, beside=[("the other pair", other)])
    alone = tmp_path / "g.png"
    fr.plot(mine, alone)
    wide, narrow = matplotlib.image.imread(out), matplotlib.image.imread(alone)
    assert wide.shape[1] > narrow.shape[1] * 1.3  # one more panel
