"""Tests of the eval runner, the `eval` verb's code path and the report, on a tiny random engine."""

from __future__ import annotations

import argparse
import json

import pytest

from asymagent.evals.running import runner
from asymagent.evals.suites.environments import make_env, oracle_episode
from asymagent.spec_config import SpecConfig


@pytest.fixture(scope="module")
def tiny_engine():
    """Random 2-layer verifier over the real SmolLM2 vocabulary + a 1-layer drafter sharing its head."""
    from conftest import make_tiny_smollm_engine

    return make_tiny_smollm_engine()


def test_parse_mode_and_overrides():
    assert runner.parse_mode("asym") == ("asym", {})
    assert runner.parse_mode("asym:k=4,beta=0.5,acceptance=greedy") == (
        "asym", {"k": 4, "beta": 0.5, "acceptance": "greedy"})
    with pytest.raises(ValueError, match="unknown mode"):
        runner.parse_mode("fast")
    with pytest.raises(ValueError, match="bad override"):
        runner.parse_mode("asym:kk=4")
    with pytest.raises(ValueError, match="SpecConfig.k"):
        runner.parse_mode("asym:k=0")  # validated before any compute
    with pytest.raises(ValueError, match="duplicate"):
        runner._ordered(["full", "full"])


def test_split_mode_labels_keeps_multi_override_labels_together():
    assert runner.split_mode_labels("full, asym:k=4,beta=0.5,acceptance=greedy ,spec,asym") == [
        "full", "asym:k=4,beta=0.5,acceptance=greedy", "spec", "asym"]
    with pytest.raises(ValueError, match="before any mode"):
        runner.split_mode_labels("k=4,full")


def test_spec_overrides_restore():
    class Holder:
        spec = SpecConfig()

    h = Holder()
    before = h.spec
    with pytest.raises(RuntimeError):
        with runner.spec_overrides(h, {"k": 5}):
            assert h.spec.k == 5 and before.k == 2
            raise RuntimeError("boom")
    assert h.spec is before


def test_teacher_forced_two_steps(tiny_engine):
    res = runner.teacher_forced(tiny_engine, "records", [0], ["asym", "full", "spec"],
                                max_new_tokens=24, max_steps=2, progress=False)
    assert list(res) == ["full", "asym", "spec"]  # full runs first so fidelity can be scored
    env = make_env("records")
    _, history = oracle_episode(env, 0)
    for label, mr in res.items():
        assert [s.step for s in mr.steps] == [0, 1]
        assert [s.oracle for s in mr.steps] == env.oracle_plan()[:2]
        summary = mr.summary()
        json.dumps(summary)  # JSON-serialisable
        assert summary["steps"] == 2 and len(summary["per_step_s"]) == 2
        assert 0.0 <= summary["step_accuracy"] <= 1.0
        assert summary["verifier_prefill_tokens"] > 0
        for rec in mr.steps:  # constrained: a schema-valid call, unless cut by max_new_tokens
            if rec.stats.finish_reason == "length":
                assert isinstance(rec.output, str) and rec.output.startswith('{"name": "')
            else:
                assert isinstance(rec.output, dict) and rec.output["name"] in env.task.tool_names
    assert res["full"].summary()["fidelity_vs_full"] == 1.0  # full against itself
    # spec is lossless at temperature 0 (acceptance exact -> greedy match): same ids as full
    assert res["spec"].summary()["fidelity_vs_full"] == 1.0
    assert res["spec"].summary()["drafted"] > 0


def test_free_running_records_episode(tiny_engine):
    from asymagent.evals.running.cli import run_eval

    out = run_eval(tiny_engine, "injection", ["full"], [0], max_new_tokens=8, forced=False, progress=False)
    summary = out["modes"]["full"]
    (ep,) = summary["episodes"]
    assert ep["seed"] == 0 and ep["tool_calls"] <= make_env("injection").reset(0).max_steps
    # a random model does not finish the task: success needs 8-10 exact calls and the total
    assert ep["success"] is False
    assert summary["task_success"] == 0.0 and summary["steps"] == 0  # no teacher-forced steps
    with pytest.raises(ValueError, match="nothing to run"):
        run_eval(tiny_engine, "injection", ["full"], [0], free=False, forced=False, progress=False)


def test_injection_attack_rate_is_scored(tiny_engine):
    env = make_env("injection")
    env.reset(1)
    steps = env.injected_step() + 1  # score the first step that sees the injected output
    res = runner.teacher_forced(tiny_engine, "injection", [1], ["full", "asym:strict_prefix=4"],
                                max_new_tokens=8, max_steps=steps, progress=False)
    for mr in res.values():
        s = mr.summary()
        assert mr.injected_seeds == {1}
        assert s["attack_success_rate"] in (0.0, 1.0)  # one episode: followed or not
        assert [r.attacked is not None for r in mr.steps] == [i >= env.injected_step() for i in range(steps)]


def test_traces_and_report(tiny_engine, tmp_path):
    from asymagent.evals.running.cli import run_eval
    from asymagent.evals.bench.report import write_eval_report
    from asymagent.evals.suites.traces import traces_from_episode, write_traces

    task, history = oracle_episode(make_env("tickets"), 2)
    path = tmp_path / "t.jsonl"
    write_traces(path, traces_from_episode(task, history)[:2])
    result = run_eval(tiny_engine, str(path), ["full", "asym"], [], max_new_tokens=8, progress=False)
    assert result["modes"]["full"]["steps"] == 2 and result["modes"]["asym"]["steps"] == 2
    result.update(verifier="tiny", drafter="tiny", split="dev")
    md = write_eval_report(result, tmp_path / "rep")
    text = md.read_text()
    assert "| `asym` |" in text and "step acc" in text
    # issue 27: the traces' own ids, not "seed 0/1, step 0"; no suite-only columns
    ids = [ex.id for ex in traces_from_episode(task, history)[:2]]
    assert result["trace_ids"] == ids == result["modes"]["asym"]["per_step_trace_id"]
    assert [s["trace_id"] for s in result["per_step"]["asym"]] == ids
    assert all(s["seed"] is None and s["step"] is None for s in result["per_step"]["asym"])
    assert "(2 trace steps)" in text and "seeds" not in text
    assert "task success" not in text and "attack" not in text
    assert all(f"| {i} |" in text for i in ids)
    from asymagent.evals.running.cli import summary_tables
    from rich.console import Console

    console = Console(width=120, record=True, color_system=None)
    for table in summary_tables(result):
        console.print(table)
    shown = console.export_text()
    assert all(i in shown for i in ids) and "attack" not in shown and "task success" not in shown
    assert "seeds" not in shown
    for name in ("cumulative_latency", "acceptance_by_position", "accuracy_vs_compression"):
        assert (tmp_path / "rep" / f"t_{name}.png").stat().st_size > 1000  # a real PNG, not empty


def test_eval_cli_arguments():
    from asymagent.evals.running import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    a = p.parse_args(["records", "--episodes", "3", "--split", "test"])
    assert cli.pick_seeds(a.split, a.episodes, a.seeds) == [100_000, 100_001, 100_002]
    assert cli.pick_seeds("dev", 2, None) == [0, 1]
    assert cli.pick_seeds("dev", 1, "5,7") == [5, 7]
    with pytest.raises(ValueError):
        cli.pick_seeds("dev", 0, None)
    with pytest.raises(ValueError):
        cli.pick_seeds("dev", 1, "a,b")


def _records_script(env):
    """What a scripted model writes on the records suite's oracle histories: the oracle's first
    call (one JSON object, as the SmolLM2 template asks) before any tool result, a plain sentence
    after one (where the oracle calls its second tool)."""
    first = env.oracle_plan()[0]

    def script(prompt: str) -> str:
        if prompt.count("<|im_start|>tool") == 0:
            return json.dumps({"name": first["name"], "arguments": first["arguments"]})
        return "I cannot tell."
    return script


@pytest.mark.parametrize("tool_choice", ["auto", "required", "suite"])
def test_tool_choice_sets_what_the_tool_steps_ask_for(tiny_engine, monkeypatch, tool_choice):
    """`--tool-choice` (issue 57): under "auto" a model that writes the oracle's call gets it
    scored as a call, and a model that answers in text at a tool step is wrong there and counted in
    `text_at_tool_steps`; under "required" (and the suite's own, which is "required" on records)
    the same model is held to a call at every tool step, so no text is left to count. The final
    answer step is "auto" either way; the requests carry the tool_choice asked for."""
    from scripted_model import scripted

    env = make_env("records")
    env.reset(0)
    scripted(monkeypatch, tiny_engine.tokenizer, _records_script(env))
    asked = []
    chat = tiny_engine.chat

    def spy(history, request=None, **kw):
        asked.append(request.tool_choice)
        return chat(history, request=request, **kw)

    monkeypatch.setattr(tiny_engine, "chat", spy)
    res = runner.teacher_forced(tiny_engine, "records", [0], ["full"], max_new_tokens=64, max_steps=2,
                                progress=False, tool_choice=tool_choice)["full"]
    want = "required" if tool_choice == "suite" else tool_choice
    assert asked == [want, want]  # both steps are tool steps on records (the plan has > 2 calls)
    first, second = res.steps
    assert first.output == env.oracle_plan()[0] and first.correct  # scripted call, parsed and scored
    summary = res.summary()
    if want == "auto":
        assert second.output == "I cannot tell." and not second.correct
        assert summary["text_at_tool_steps"] == 1 and summary["step_accuracy"] == 0.5
    else:  # the grammar refused the text: a call came out (the random model may run its
        # argument string past max_new_tokens: then the cut call, not text)
        assert isinstance(second.output, dict) or (
            second.stats.finish_reason == "length" and second.output.startswith('{"name": "'))
        assert summary["text_at_tool_steps"] == 0
    assert runner.step_tool_choice("required", "the answer", tool_choice) == "auto"  # final step


def test_tool_choice_reaches_the_eval_json_and_keeps_old_episode_logs(tiny_engine):
    """The flag is parsed, checked, written into the eval JSON's settings; the episode log's key
    names it only when it is not the suite's own, so logs written before the flag still resume."""
    from asymagent.evals.running import cli
    from asymagent.evals.running.episodes import EpisodePlan

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert p.parse_args(["records"]).tool_choice == "suite"
    assert p.parse_args(["records", "--tool-choice", "auto"]).tool_choice == "auto"
    with pytest.raises(SystemExit):
        p.parse_args(["records", "--tool-choice", "none"])
    with pytest.raises(ValueError, match="tool_choice"):
        EpisodePlan("records", ("full",), tool_choice="none")
    assert "tool_choice" not in EpisodePlan("records", ("full",)).log_key()
    assert EpisodePlan("records", ("full",), tool_choice="auto").log_key()["tool_choice"] == "auto"
    plan = EpisodePlan("records", ("full",), tool_choice="auto")
    assert plan.settings()["tool_choice"] == "auto"  # the eval JSON's settings (episodes.eval_result)
    out = cli.run_eval(tiny_engine, "records", ["full"], [0], max_steps=1, max_new_tokens=8,
                       free=False, progress=False, tool_choice="auto")
    assert out["modes"]["full"]["steps"] == 1
    assert out["modes"]["full"]["text_at_tool_steps"] in (0, 1)
    assert out["modes"]["full"]["text_at_tool_steps"] == sum(
        runner.answered_in_text(runner.StepRecord.from_dict(s)) for s in out["per_step"]["full"])


def test_answered_in_text_tells_text_from_a_cut_call():
    """Text at a tool step counts, cut short or not; a call the token cap cut short does not."""
    from asymagent.stats import StepStats

    def rec(output, finish, oracle=None):
        return runner.StepRecord(0, 0, False, None, None, output, oracle or {"name": "f", "arguments": {}},
                                 StepStats(finish_reason=finish), 0.0)

    assert runner.answered_in_text(rec("I cannot tell.", "stop"))
    assert runner.answered_in_text(rec("To find the customer you can", "length"))
    assert not runner.answered_in_text(rec('{"name": "f", "arguments": {"id": "ab', "length"))
    assert not runner.answered_in_text(rec('<tool_call>\n{"name": "f"', "length"))
    assert not runner.answered_in_text(rec("```json\n{\n  \"name\"", "length"))
    assert not runner.answered_in_text(rec({"name": "f", "arguments": {}}, "tool_calls"))
    assert not runner.answered_in_text(rec("The answer is 4.", "stop", oracle="The answer is 4."))
