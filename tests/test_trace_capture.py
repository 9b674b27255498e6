"""Capture (asymagent/trace_capture.py): the lines Agent, ChatAsymSpec and the server write read back
as traces, files rotate by size, credentials never reach the file; the held-out split and the
fingerprint check of asymagent/traces.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from asymagent.stats import StepStats
from asymagent.trace_capture import REDACTED, TraceWriter, tokenizer_fingerprint
from asymagent.traces import (TraceExample, TraceMismatchError, check_fingerprint, conversation_key,
                              load_traces, split_heldout, write_traces)


@pytest.fixture(scope="module")
def engine():
    from conftest import make_tiny_smollm_engine

    return make_tiny_smollm_engine()


def test_agent_capture_round_trip(tmp_path, engine):
    from asymagent.agents.agent import Agent
    from asymagent.agents.tools import tool

    @tool
    def lookup() -> str:  # no arguments: the constrained call is forced whole, even from a random model
        """Look up the order."""
        return "order A-17: shipped on 2026-11-30, carrier DHL, 3 parcels"

    agent = Agent(engine, [lookup], max_steps=3, max_new_tokens=24, trace_dir=tmp_path,
                  tool_choice=lambda step, messages: "required" if step < 2 else "auto")
    result = agent.run("Where is order A-17?")
    steps = load_traces(tmp_path)
    assert len(steps) == len(result.stats.steps) >= 2
    assistant_at = [i for i, m in enumerate(result.messages) if m["role"] == "assistant"]
    fp = {"tokenizer": tokenizer_fingerprint(engine.tokenizer), "verifier": None}
    for ex, i, stats in zip(steps, assistant_at, result.stats.steps):
        assert ex.messages == result.messages[:i]  # the history the engine saw
        assert ex.expected == result.messages[i]  # what it answered
        assert ex.tools == [lookup.openai_schema()]
        assert StepStats.from_dict(ex.stats) == stats
        assert ex.fingerprint == fp
    assert steps[0].is_tool_step and steps[0].expected_calls()[0]["name"] == "lookup"
    assert len({conversation_key(ex) for ex in steps}) == 1  # one agent run, one conversation
    again = tmp_path / "copy" / "t.jsonl"
    again.parent.mkdir()
    write_traces(again, steps)
    assert [(e.messages, e.expected, e.fingerprint, e.stats) for e in load_traces(again)] == \
        [(e.messages, e.expected, e.fingerprint, e.stats) for e in steps]


def test_langchain_capture(tmp_path, engine):
    from asymagent.integrations.langchain import ChatAsymSpec

    llm = ChatAsymSpec(engine=engine, max_tokens=6, trace_dir=str(tmp_path))
    invoked = llm.invoke("hello")
    streamed = list(llm.stream("hello there"))
    assert streamed
    lines = load_traces(tmp_path)
    assert [ex.messages[-1]["content"] for ex in lines] == ["hello", "hello there"]
    assert lines[0].expected["content"] == invoked.content


class _Vocab:
    def get_vocab(self):
        return {"a": 0, "b": 1}


def _fake(text: str):
    return SimpleNamespace(text=text, tool_calls=[], finish_reason="stop", stats=StepStats(new_tokens=3))


def test_rotation_by_size_and_max_files(tmp_path):
    fake_engine = SimpleNamespace(tokenizer=_Vocab(), verifier_fingerprint="v" * 64)
    writer = TraceWriter(tmp_path, max_bytes=3000, max_files=3)
    for n in range(12):
        writer.record(fake_engine, [{"role": "user", "content": f"question {n} " + "x" * 400}], None,
                      _fake(f"answer {n}"), source="test", mode="full")
    files = sorted(tmp_path.glob("*.jsonl"))
    assert files == writer.files and len(files) == 3  # older files deleted
    assert all(f.stat().st_size <= 3000 for f in files)
    kept = load_traces(tmp_path)
    numbers = [int(ex.expected["content"].split()[1]) for ex in kept]
    assert numbers == list(range(12 - len(numbers), 12))  # the newest, in order
    assert kept[0].fingerprint == {"tokenizer": tokenizer_fingerprint(_Vocab()), "verifier": "v" * 64}


def test_server_capture_never_writes_the_key(tmp_path, smollm_tokenizer):
    from asymagent.integrations.server import create_app
    from test_server import serving, tiny_engine

    key = "sekret-key-0123456789"
    writer = TraceWriter(tmp_path, secrets=(key,))
    app = create_app(tiny_engine(smollm_tokenizer), api_key=key, trace_writer=writer)
    content = (f"my key is {key}; header Authorization: Bearer abcdefghijklmnop0123; "
               "and sk-abcdefghijklmnopqrstuvwx")
    body = {"model": "asymagent", "max_tokens": 4, "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": content}]}
    with serving(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
    text = "".join(f.read_text() for f in tmp_path.glob("*.jsonl"))
    for secret in (key, "abcdefghijklmnop0123", "sk-abcdefghijklmnopqrstuvwx"):
        assert secret not in text
    (line,) = load_traces(tmp_path)
    assert line.messages[1]["content"].startswith(f"my key is {REDACTED};")
    assert json.loads(text)["source"] == "serve"
    assert line.expected["content"] == r.json()["choices"][0]["message"]["content"]


def test_serve_refuses_a_trace_dir_that_is_a_file(tmp_path, capsys):
    from asymagent.integrations.cli import main

    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--trace-dir", str(f)])
    assert exc.value.code == 2 and "--trace-dir" in capsys.readouterr().err


def _step(user: str, n: int, fingerprint=None) -> TraceExample:
    return TraceExample(f"{user}:{n}", [{"role": "user", "content": user}] +
                        [{"role": "assistant", "content": f"step {i}"} for i in range(n)],
                        None, {"role": "assistant", "content": "ok"}, fingerprint=fingerprint)


def test_heldout_split_is_by_conversation_and_deterministic():
    steps = [_step(f"task {c}", n) for c in range(40) for n in range(3)]
    train, held = split_heldout(steps, 0.25)
    assert len(train) + len(held) == len(steps) and held and train
    held_keys = {conversation_key(ex) for ex in held}
    assert not held_keys & {conversation_key(ex) for ex in train}  # whole conversations
    assert 0.1 < len(held_keys) / 40 < 0.45  # ~25% of 40 conversations
    shuffled = steps[::-1] + [_step("another task", 0)]
    _, held2 = split_heldout(shuffled, 0.25)  # order and other traces do not move a conversation
    assert held_keys <= {conversation_key(ex) for ex in held2}
    assert split_heldout(steps[:6], 0.01)[1]  # two conversations: one is always held out
    assert split_heldout(steps, 0.0) == (steps, [])
    with pytest.raises(ValueError):
        split_heldout(steps, 1.0)


def test_fingerprint_mismatch_is_refused():
    mine = {"tokenizer": "t" * 64, "verifier": "v" * 64}
    check_fingerprint([_step("a", 0), _step("b", 0, mine), _step("c", 0, {"tokenizer": "t" * 64})], mine)
    check_fingerprint([_step("a", 0, {"verifier": "x" * 64})], {"tokenizer": "t" * 64, "verifier": None})
    with pytest.raises(TraceMismatchError, match=r"trace b:0 was captured with verifier sha256 xxxx"):
        check_fingerprint([_step("b", 0, {"verifier": "x" * 64, "tokenizer": "t" * 64})], mine)
    with pytest.raises(TraceMismatchError, match="tokenizer"):
        check_fingerprint([_step("b", 0, {"tokenizer": "y" * 64})], mine)
