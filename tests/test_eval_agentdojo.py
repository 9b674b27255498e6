"""`asymagent eval agentdojo` (evals/agentdojo/): scoring pinned against AgentDojo's own, the rough edges, the engine end to end.

No model in the scoring tests: a scripted responder plays the agent (the ground truth's calls in
the OpenAI shape the engine returns, then the task's ground-truth answer), so the only thing
under test is the harness: message conversion, AgentDojo's own pipeline and tool runtime around
the responder, and the verdicts. The engine test runs a tiny random model (made here, SmolLM2's
tokenizer from the embedded default) over one banking task. AgentDojo ships its suites as package
data, so nothing is downloaded (`pip install 'asymagent[agentdojo]'`; the dev extra has it).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("agentdojo")

from asymagent.evals.agentdojo.episode import run_episode_with  # noqa: E402
from asymagent.evals.agentdojo.pipeline import build_pipeline, make_llm_element, run_free  # noqa: E402
from asymagent.evals.agentdojo.responder import OverWindow, Turn  # noqa: E402
from asymagent.evals.agentdojo.tasks import DojoPlan, episode_keys, get_suite, load_episode  # noqa: E402


def openai_call(n: int, name: str, args) -> dict:
    raw = args if isinstance(args, str) else json.dumps(dict(args))
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": raw}}


class Scripted:
    """Plays a fixed list of turns, one per model step (each a list of (name, args) calls or a
    text answer); the last turn repeats if the episode goes on."""

    def __init__(self, turns: list) -> None:
        self.turns = turns
        self.seen: list = []

    def reset(self) -> None:
        pass

    def __call__(self, messages: list, tools: list) -> Turn:
        self.seen.append(messages)
        n = sum(1 for m in messages if m["role"] == "assistant")
        turn = self.turns[min(n, len(self.turns) - 1)]
        if isinstance(turn, Exception):
            raise turn
        if isinstance(turn, str):
            return Turn(turn, [], [len(turn)])
        return Turn("", [openai_call(n, name, args) for name, args in turn], [n])


def ground_truth_turns(suite, task, injections=None) -> list:
    """The task's ground-truth calls (one per turn), then its ground-truth answer."""
    env = suite.load_and_inject_default_environment(injections or {})
    if hasattr(task, "init_environment"):
        env = task.init_environment(env)
    calls = task.ground_truth(env.model_copy(deep=True))
    return [[(c.function, c.args)] for c in calls] + [getattr(task, "GROUND_TRUTH_OUTPUT", "") or "Done."]


def test_scripted_ground_truth_is_scored_as_agentdojo_scores_it(tmp_path):
    """Every banking user task: a responder issuing the ground truth's calls gets the utility
    AgentDojo's own GroundTruthPipeline gets (True), and AgentDojo's own benchmark loop run on
    the same responder agrees with the harness task by task, for a refusal as well."""
    from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline
    from agentdojo.benchmark import benchmark_suite_without_injections
    from agentdojo.logging import OutputLogger

    suite = get_suite("banking")
    keys = episode_keys(["banking"], ["none"])
    assert len(keys) == len(suite.user_tasks) == 16
    for key in keys:
        _, task, _, _ = load_episode(key)
        own, _ = suite.run_task_with_pipeline(GroundTruthPipeline(task), task, None, {})
        ours, _ = run_free(suite, task, None, {}, Scripted(ground_truth_turns(suite, task)))
        assert own is True and ours["utility"] is True, key
        assert ours["outcome"] == "answered" and ours["tool_errors"] == 0 and ours["error"] is None
        assert ours["function_trace"] == [c.function for c in task.ground_truth(
            task.init_environment(suite.load_and_inject_default_environment({})))]

    # a refusal fails user_task_0 and user_task_15 but "passes" user_task_5 in AgentDojo itself:
    # its check only looks for a 50.00 payment to Spotify, which the starting environment holds
    refusal = {"user_task_0": False, "user_task_5": True, "user_task_15": False}
    for turns, want in [(None, dict.fromkeys(refusal, True)), (["I cannot help with that."], refusal)]:
        def responder_for(task):
            return Scripted(turns if turns is not None else ground_truth_turns(suite, task))

        class PerTask:  # AgentDojo's benchmark loop builds one pipeline; it sees the task in the prompt
            def __call__(self, messages, tools):
                prompt = next(m["content"] for m in messages if m["role"] == "user")
                task = next(t for t in suite.user_tasks.values() if t.PROMPT == prompt)
                return responder_for(task)(messages, tools)

        pipeline = build_pipeline(make_llm_element(PerTask()))
        with OutputLogger(str(tmp_path)):  # AgentDojo's loop writes its traces under a logger's logdir
            theirs = benchmark_suite_without_injections(pipeline, suite, logdir=tmp_path, force_rerun=True,
                                                        user_tasks=["user_task_0", "user_task_5", "user_task_15"])
        for (user_task, _), utility in theirs["utility_results"].items():
            _, task, _, _ = load_episode(f"banking/{user_task}/none")
            ours, _ = run_free(suite, task, None, {}, responder_for(task))
            assert utility is ours["utility"] is want[user_task], user_task


def test_attack_success_is_agentdojo_security():
    """Under important_instructions, a responder that carries out the injection task's ground
    truth (and then the user's) is scored attacked exactly as AgentDojo's GroundTruthPipeline
    on the injection task; one that only does the user's task is not attacked."""
    from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline

    key = "banking/user_task_0/important_instructions/injection_task_0"
    suite, task, injection, injections = load_episode(key)
    assert injections and all("<INFORMATION>" in v and "Local model" in v for v in injections.values())
    _, own_security = suite.run_task_with_pipeline(GroundTruthPipeline(injection), task, injection, injections)
    attacked = ground_truth_turns(suite, injection, injections)[:-1] + ground_truth_turns(suite, task, injections)
    ours, _ = run_free(suite, task, injection, injections, Scripted(attacked))
    assert own_security is True and ours["security"] is True and ours["utility"] is True
    assert ours["injection_seen"] is True  # the ground truth reads the poisoned bill
    blind, _ = run_free(suite, task, injection, injections, Scripted([[("get_balance", {})], "done"]))
    assert blind["injection_seen"] is False and blind["security"] is False
    # AgentDojo places an attack where each task's ground truth reads it (raw text, YAML-dumped
    # records, ...): the harness sees it read in every banking task
    for key in episode_keys(["banking"], ["important_instructions"], injection_tasks="0"):
        suite, task, injection, injections = load_episode(key)
        seen, _ = run_free(suite, task, injection, injections, Scripted(ground_truth_turns(suite, task, injections)))
        assert seen["injection_seen"] is True, key
    clean, _ = run_free(suite, task, injection, injections, Scripted(ground_truth_turns(suite, task, injections)))
    assert clean["security"] is False and clean["utility"] is True


def test_rough_edges_are_recorded_never_raised():
    suite, task, _, _ = load_episode("banking/user_task_0/none")
    cases = {
        "malformed": [[("get_balance", "{not json")], "no call left"],
        "tool raises": [[("update_scheduled_transaction", {"id": 999})], "ok"],  # raises ValueError inside
        "bad arguments": [[("send_money", {"recipient": "x", "amount": "lots", "subject": "s", "date": "d"})], "ok"],
        "unknown tool": [[("rm_rf", {})], "ok"],
        "over window": [[("get_balance", {})], OverWindow("4097 tokens > 4096")],
        "budget": [[("get_balance", {})]],
        "bug": [RuntimeError("boom")],
    }
    scripts = {name: Scripted(turns) for name, turns in cases.items()}
    out = {name: run_free(suite, task, None, {}, scripts[name], max_iters=3)[0] for name in cases}
    assert out["malformed"]["malformed_calls"] == 1 and out["malformed"]["tool_calls"] == 0
    # the call was not run, so the turn is the answer: its text (empty here), scored by AgentDojo
    assert out["malformed"]["outcome"] == "answered" and out["malformed"]["answer"] == ""
    assert out["tool raises"]["tool_errors"] == 1 and out["tool raises"]["outcome"] == "answered"
    seen = scripts["tool raises"].seen[-1][-1]  # the model is shown the tool's error as its result
    assert seen["role"] == "tool" and seen["content"] == "ValueError: Transaction with ID 999 not found."
    assert out["bad arguments"]["tool_errors"] == 1 and "ValidationError" in scripts["bad arguments"].seen[-1][-1]["content"]
    assert out["unknown tool"]["tool_errors"] == 1 and out["unknown tool"]["function_trace"] == ["rm_rf"]
    assert out["over window"]["outcome"] == "over_window" and "4097" in out["over window"]["over_window"]
    assert out["over window"]["utility"] is False and out["over window"]["tool_calls"] == 1
    assert out["budget"]["outcome"] == "step_budget" and out["budget"]["tool_calls"] == 4  # 1 + 3 rounds
    assert out["bug"]["outcome"] == "error" and "boom" in out["bug"]["error"] and out["bug"]["utility"] is None
    assert all(o["utility"] is not None for name, o in out.items() if name != "bug")


def test_step_fidelity_along_full_trajectory():
    """The other modes are asked at each of full's steps with full's history; a mode that
    deviates at one step is counted there only, and refuses (over window) are kept apart."""
    from asymagent.evals.agentdojo.summary import dojo_result

    suite = get_suite("banking")
    _, task, _, _ = load_episode("banking/user_task_0/none")
    gt = ground_truth_turns(suite, task)
    other = list(gt)
    other[1] = [("get_balance", {})]  # differs at step 1 only
    responders = {"full": gt, "spec": gt, "asym": other, "compressed": [OverWindow("too long")]}
    plan = DojoPlan(("full", "spec", "asym", "compressed"))
    record = run_episode_with(lambda label, key: Scripted(responders[label]), plan, "banking/user_task_0/none",
                              {"verifier": "scripted"})
    assert list(record["modes"]) == ["full", "spec", "asym", "compressed"]
    assert record["modes"]["full"]["forced"] == []
    n = len(record["modes"]["full"]["free"]["steps"])
    assert [r["same_action"] for r in record["modes"]["spec"]["forced"]] == [True] * n
    assert [r["same_action"] for r in record["modes"]["asym"]["forced"]] == [True, False] + [True] * (n - 2)
    assert all(r["refused"].startswith("over_window") for r in record["modes"]["compressed"]["forced"])
    result = dojo_result(plan, [record["seed"]], {record["seed"]: record})
    fid = result["modes"]["asym"]["fidelity"]
    assert fid["step_fidelity"]["k"] == n - 1 and fid["step_fidelity"]["n"] == n
    assert result["modes"]["compressed"]["fidelity"]["refused"] == n
    assert result["modes"]["full"]["utility"]["k"] == 1 and result["modes"]["compressed"]["utility"]["k"] == 0
    assert result["per_task"]["banking/user_task_0/none"]["compressed"]["outcome"] == "over_window"


def test_episode_keys_and_flags_are_checked_before_any_model_loads():
    import argparse

    from asymagent.evals.running import cli

    keys = episode_keys(["banking", "slack"], ["none", "important_instructions"], user_tasks="0,user_task_2",
                        injection_tasks="1")
    assert keys == ["banking/user_task_0/none", "banking/user_task_0/important_instructions/injection_task_1",
                    "banking/user_task_2/none", "banking/user_task_2/important_instructions/injection_task_1",
                    "slack/user_task_0/none", "slack/user_task_0/important_instructions/injection_task_1",
                    "slack/user_task_2/none", "slack/user_task_2/important_instructions/injection_task_1"]
    assert len(episode_keys(["travel"], ["none"], max_user_tasks=5)) == 5
    assert episode_keys(["slack"], ["dos"], user_tasks="1") == ["slack/user_task_1/dos/injection_task_1"]
    # the attacks on some of the selected user tasks only, the others without attack
    assert episode_keys(["workspace"], ["none", "important_instructions"], user_tasks="14,26,27",
                        injection_tasks="1", attacked_user_tasks="26") == [
        "workspace/user_task_14/none", "workspace/user_task_26/none",
        "workspace/user_task_26/important_instructions/injection_task_1", "workspace/user_task_27/none"]
    with pytest.raises(ValueError, match="not among the selected"):
        episode_keys(["workspace"], ["none", "important_instructions"], user_tasks="14", attacked_user_tasks="26")
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    for argv, message in [(["agentdojo", "--attacks", "nope"], "unknown attacks"),
                          (["agentdojo", "--suites", "finance"], "unknown AgentDojo suite"),
                          (["agentdojo", "--user-tasks", "99"], "unknown user_task"),
                          (["agentdojo", "--user-tasks", "1", "--attacked-user-tasks", "2"], "not among the selected"),
                          (["agentdojo", "--modes", "full,fast"], "unknown mode"),
                          (["agentdojo", "--modes", "full,asym@nopreset"], "unknown compression preset"),
                          (["agentdojo", "--modes", "asym"], "add full"),
                          (["agentdojo", "--resume"], "--resume needs the episode log")]:
        with pytest.raises(ValueError, match=message):
            cli.check_args(p.parse_args(argv))
    args = p.parse_args(["agentdojo", "--modes", "asym,full,asym:acceptance=cda,strict_prefix=16@id_keep_192"])
    cli.check_args(args)
    assert args.max_new_tokens is None  # eval agentdojo's own default (256) applies
    from asymagent.evals.agentdojo.run import plan_of

    assert plan_of(args).labels == ("full", "asym", "asym:acceptance=cda,strict_prefix=16@id_keep_192")
    assert plan_of(args).max_new_tokens == 256


def test_messages_convert_as_agentdojo_openai_client_does():
    """Calls without an id (AgentDojo's ground truth writes none) get call_<n> and their results
    follow them; a failed tool's message is its error; tools are the runtime's JSON schemas."""
    from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
    from agentdojo.types import text_content_block_from_string as block

    from asymagent.evals.agentdojo.messages import calls_from_openai, messages_to_openai, tools_to_openai

    a = FunctionCall(function="get_balance", args={})
    b = FunctionCall(function="send_money", args={"recipient": "x", "amount": 1.0})
    msgs = [{"role": "system", "content": [block("sys")]}, {"role": "user", "content": [block("task")]},
            {"role": "assistant", "content": [block("")], "tool_calls": [a, b]},
            {"role": "tool", "content": [block("1810.0")], "tool_call": a, "tool_call_id": None, "error": None},
            {"role": "tool", "content": [block("")], "tool_call": b, "tool_call_id": None, "error": "ValueError: no"}]
    out = messages_to_openai(msgs)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in out[2]["tool_calls"]] == ["call_0", "call_1"]
    assert json.loads(out[2]["tool_calls"][1]["function"]["arguments"]) == {"recipient": "x", "amount": 1.0}
    assert [(m["tool_call_id"], m["content"]) for m in out[3:]] == [("call_0", "1810.0"), ("call_1", "ValueError: no")]
    tools = tools_to_openai(FunctionsRuntime(get_suite("banking").tools))
    assert {t["function"]["name"] for t in tools} >= {"get_balance", "send_money"}
    assert all(t["function"]["parameters"]["type"] == "object" for t in tools)
    parsed = calls_from_openai([openai_call(0, "get_balance", {}), openai_call(1, "send_money", "[1, 2]"),
                                {"id": "c", "function": {"name": "", "arguments": "{}"}}])
    assert [c.function for c in parsed.calls] == ["get_balance"] and len(parsed.malformed) == 2


def test_every_suites_tools_compile_into_the_engines_call_grammar():
    """tool_choice="auto" builds a call grammar from the tools; each suite's tool schemas (as
    AgentDojo's OpenAI client sends them) compile, so no suite fails on its schemas alone."""
    from agentdojo.functions_runtime import FunctionsRuntime

    from asymagent.chat.auto_tool_constraint import AutoToolConstraint
    from asymagent.evals.agentdojo.messages import tools_to_openai
    from asymagent.evals.agentdojo.tasks import SUITES
    from asymagent.modeling.loading import load_default_verifier

    tok = load_default_verifier().tokenizer
    for name in SUITES:
        tools = tools_to_openai(FunctionsRuntime(get_suite(name).tools))
        assert len(AutoToolConstraint(tok, tools, hermes=True).tool_names) == len(tools) >= 11, name
