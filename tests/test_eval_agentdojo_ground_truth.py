"""evals/agentdojo/ground_truth.py: the verifier's view along AgentDojo's own ground-truth trajectories (no model).

SmolLM2's tokenizer from the embedded default counts tokens; AgentDojo ships its suites as package
data, so nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("agentdojo")

from asymagent.context.views import CompressionConfig  # noqa: E402
from asymagent.evals.agentdojo.ground_truth import (ground_truth_messages, main, step_points,  # noqa: E402
                                                    survey, task_views)
from asymagent.evals.agentdojo.tasks import get_suite  # noqa: E402


def test_ground_truth_trajectory_is_the_tasks_own_calls():
    suite = get_suite("workspace")
    task = suite.get_user_task_by_id("user_task_35")
    env = task.init_environment(suite.load_and_inject_default_environment({}))
    messages, tools = ground_truth_messages(suite, task)
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    assert calls == [c.function for c in task.ground_truth(env)] == ["list_files", "delete_file"]
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert len(tools) == len(suite.tools)
    # asked after the user's task and after each round of results: 3 steps, the last after delete_file
    assert step_points(messages) == [2, 4, 6] and messages[5]["role"] == "tool"


def test_list_files_is_cut_and_short_outputs_are_not(smollm_tokenizer):
    long = task_views("workspace", "user_task_26", smollm_tokenizer)
    assert long.calls == ["list_files"] and long.output_tokens[0] > 5000
    assert long.shares[0] == 1.0  # nothing to cut before any tool output
    assert long.shares[-1] < 0.5 and long.verifier_tokens < long.full_tokens / 2
    short = task_views("slack", "user_task_0", smollm_tokenizer)
    assert short.output_tokens[0] < 64 and short.shares == [1.0, 1.0]


def test_no_compression_leaves_every_step_whole(smollm_tokenizer):
    rows = survey("workspace", smollm_tokenizer, CompressionConfig.none(), user_tasks="26,14")
    assert [r.user_task for r in rows] == ["user_task_14", "user_task_26"]
    for r in rows:
        assert r.shares == [1.0] * len(r.shares) and r.verifier_tokens == r.full_tokens


def test_cli_writes_the_survey(tmp_path, capsys):
    from asymagent.modeling.loading import find_embedded_gguf

    out = tmp_path / "gt.json"
    assert main(["--suites", "banking", "--user-tasks", "1", "--tokenizer", str(find_embedded_gguf()),
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    row = result["tasks"]["banking/user_task_1"]
    assert list(result["tasks"]) == ["banking/user_task_1"]
    assert row["calls"] == ["get_most_recent_transactions"] and len(row["shares"]) == 2
    summary = result["suites"]["banking"]
    assert summary["tasks"] == 1 and summary["max_output_tokens"] == row["output_tokens"][0]
    assert summary["min_share_at_answer"] == summary["median_share_at_answer"] == row["shares"][-1]
    assert summary["cut_below_0_9"] == (["user_task_1"] if row["shares"][-1] < 0.9 else [])
    assert "banking   user_task_1" in capsys.readouterr().out


def test_replay_gives_back_the_outputs_and_their_cut(tmp_path, smollm_tokenizer):
    """evals/agentdojo/replay.py: a recorded trajectory replayed through AgentDojo (no model) is
    scored as it was, and shows the tool outputs whole and as the verifier's view has them."""
    from asymagent.evals.agentdojo.replay import cut_outputs, recorded_actions, replay
    from asymagent.evals.running.episode_log import EpisodeLog

    key = "workspace/user_task_14/none"
    search = {"calls": [{"name": "search_emails", "arguments": {"query": "family reunion", "sender": None}}]}
    log = EpisodeLog(tmp_path / "x.episodes.jsonl", {"benchmark": "agentdojo"})
    log.append({"seed": key, "modes": {"full": {"free": {"steps": [
        {"action": search}, {"action": "It is on 2024-06-10 13:00."}]}}}})
    actions = recorded_actions(str(log.path), key, "full")
    assert actions == [search, "It is on 2024-06-10 13:00."]
    episode, steps = replay(key, actions)
    assert episode["utility"] is True and episode["function_trace"] == ["search_emails"]
    assert replay(key, [search, "It is on the 10th of April at 1 PM."])[0]["utility"] is False
    history, tools = steps[-1].history, steps[-1].tools
    [cut] = cut_outputs(history, tools, smollm_tokenizer)
    assert cut.name == "search_emails" and cut.full == history[-1]["content"]
    assert "June\n    10th 2024 at 1 PM" in cut.full and cut.view_tokens < cut.full_tokens
    [whole] = cut_outputs(history, tools, smollm_tokenizer, CompressionConfig.none())
    assert whole.view == whole.full and whole.view_tokens == whole.full_tokens
    with pytest.raises(KeyError):
        recorded_actions(str(log.path), "workspace/user_task_15/none", "full")


def test_whole_units_keep_the_month_with_the_kept_date(smollm_tokenizer):
    """Task 14's inbox (AgentDojo wraps an email's body every ~80 columns): with lines the view
    keeps the date's line and cuts the month on the line before it; with whole units
    (`keep_unit: block`, preset id_keep_blocks) the sentence comes whole (docs/evals.md)."""
    from asymagent.evals.agentdojo.replay import cut_outputs, replay

    search = {"calls": [{"name": "search_emails", "arguments": {"query": "family reunion", "sender": None}}]}
    _, steps = replay("workspace/user_task_14/none", [search, "done"])
    history, tools = steps[-1].history, steps[-1].tools
    [lines] = cut_outputs(history, tools, smollm_tokenizer)
    [blocks] = cut_outputs(history, tools, smollm_tokenizer, CompressionConfig.preset("id_keep_blocks"))
    assert "10th 2024 at 1 PM" in lines.view and "June" not in lines.view
    assert "on June\n    10th 2024 at 1 PM." in blocks.view
    assert blocks.view_tokens < blocks.full_tokens
