"""Tests of the JSONL user-trace loader and its scoring rule."""

from __future__ import annotations

import json

import pytest

from asymagent.evals.suites.environments import make_env, oracle_episode
from asymagent.evals.suites.traces import load_traces, score_output, traces_from_episode, write_traces


def test_roundtrip_from_an_oracle_episode(tmp_path):
    task, history = oracle_episode(make_env("records"), 1)
    examples = traces_from_episode(task, history)
    assert len(examples) == sum(1 for m in history if m["role"] == "assistant")
    path = tmp_path / "t.jsonl"
    write_traces(path, examples)
    loaded = load_traces(path)
    assert [e.id for e in loaded] == [e.id for e in examples]
    first, last = loaded[0], loaded[-1]
    assert first.is_tool_step and not last.is_tool_step
    assert first.expected_calls() == [{"name": "list_customers", "arguments": {"page": 1}}]
    call = {"id": "x", "type": "function", "function": {"name": "list_customers", "arguments": '{"page": 1}'}}
    assert score_output(first, [call], "")
    wrong = {"function": {"name": "list_customers", "arguments": '{"page": 2}'}}
    assert not score_output(first, [wrong], "")
    assert not score_output(first, [], "page 1")
    assert score_output(last, [], "  " + last.expected["content"].replace(" ", "\n") + " ")  # whitespace-normalised
    assert not score_output(last, [call], last.expected["content"])


def test_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}], "expected": {"role": "assistant", "content": "hello"}}
    path.write_text("# comment\n\n" + json.dumps(good) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:4: not valid JSON"):
        load_traces(path)
    path.write_text(json.dumps({**good, "expected": {"role": "user", "content": "x"}}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: invalid trace"):
        load_traces(path)
    path.write_text(json.dumps({**good, "messages": []}) + "\n")
    with pytest.raises(ValueError, match="invalid trace"):
        load_traces(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no traces"):
        load_traces(path)
    with pytest.raises(ValueError, match="not found"):
        load_traces(tmp_path / "missing.jsonl")
