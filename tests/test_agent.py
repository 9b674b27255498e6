"""Agent loop and @tool: validation, error handling, bad input; scripted model outputs.

The engine here is a scripted stand-in that returns fixed model *texts*, parsed by the real
chat_format.parse_output (so tool calls look exactly like the engine's). That makes every bad
case (unknown tool, invalid args, raising tool...) deterministic. Runs on the real engine are
in tests/test_agent_engine.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from asymagent.agents.agent import Agent, RunResult
from asymagent.chat.chat_format import parse_output
from asymagent.integrations.run_table import render_text
from asymagent.stats import StepStats
from asymagent.agents.tools import Tool, schema_errors, tool


@dataclass
class ScriptedResult:
    text: str
    tool_calls: list
    invalid_tool_calls: list
    stats: StepStats


@dataclass
class ScriptedEngine:
    """Returns the next scripted output per chat call and records what it was asked."""

    outputs: list
    calls: list = field(default_factory=list)

    def chat(self, messages, request=None, **kw):
        if request is not None:  # the agent passes one GenerationRequest: record its fields
            kw = {"tools": request.tools, "mode": request.mode, "cache_key": request.cache_key,
                  "tool_choice": request.tool_choice, "seed": request.sampling.seed,
                  "temperature": request.sampling.temperature,
                  "max_new_tokens": request.max_new_tokens, **kw}
        self.calls.append({"messages": [dict(m) for m in messages], **kw})
        text = self.outputs[min(len(self.calls) - 1, len(self.outputs) - 1)]
        parsed = parse_output(text)
        n = len(self.calls)
        stats = StepStats(wall_s=0.1 * n, new_tokens=10, drafted=8, accepted=6, rounds=4,
                          mean_accepted_len=2.5, full_context_tokens=100 * n,
                          verifier_context_tokens=60 * n, compression_ratio=0.6)
        return ScriptedResult(parsed.content, parsed.tool_calls, parsed.invalid_tool_calls, stats)


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Longer explanation that stays out of the schema description.
    """
    return a + b


@tool(name="fail")
def failing(reason: str) -> str:
    """Always raises."""
    raise RuntimeError(f"boom: {reason}")


@tool
def lookup(key: str) -> dict:
    """Return a record (a dict, not a string)."""
    return {"key": key, "value": 42}


def call(name, **args):
    return json.dumps({"name": name, "arguments": args})


def run(outputs, tools=(add, failing, lookup), **kw):
    engine = ScriptedEngine(list(outputs))
    agent = Agent(engine, list(tools), system_prompt="You are a calculator.", **kw)
    return agent, engine, agent.run("What is 2 + 3?")


def tool_messages(result: RunResult):
    return [m for m in result.messages if m["role"] == "tool"]


def test_tool_decorator_schema_and_validation():
    assert add.name == "add" and add.description == "Add two integers."
    assert add.parameters["required"] == ["a"]
    assert add.parameters["properties"]["a"] == {"type": "integer"}
    assert add(2, 3) == 5  # still a plain callable
    assert add.invoke({"a": 2, "b": 3}).content == "5"
    assert add.invoke('{"a": 2}').content == "2"
    bad = add.invoke({"a": "two"})
    assert bad.error and "a:" in bad.error and bad.content.startswith("Error: invalid arguments")
    assert "unexpected" in add.invoke({"a": 1, "c": 1}).error.lower() or \
        "extra" in add.invoke({"a": 1, "c": 1}).error.lower()
    assert "not valid JSON" in add.invoke("{a: 1").error
    assert "JSON object" in add.invoke("[1]").error


def test_tool_decorator_rejects_untyped_functions():
    with pytest.raises(ValueError, match="type hint"):
        tool(lambda x: x)
    with pytest.raises(ValueError, match=r"\*args"):
        @tool
        def f(*items: int) -> int:
            return 0


def test_schema_errors_subset():
    s = {"type": "object", "required": ["q"], "additionalProperties": False,
         "properties": {"q": {"type": "string", "maxLength": 3},
                        "n": {"type": "integer", "minimum": 1},
                        "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}}
    assert schema_errors({"q": "abc", "n": 1, "tags": ["a"]}, s) == []
    errs = schema_errors({"q": "abcd", "n": 0, "tags": ["c"], "x": 1}, s)
    # one error each: maxLength, minimum, enum, additionalProperties
    assert len(errs) == 4, errs
    assert schema_errors({"n": True}, s)  # booleans are not integers; q missing too


def test_answer_after_a_tool_call():
    agent, engine, r = run([call("add", a=2, b=3), "The answer is 5."])
    assert r.answer == "The answer is 5." and r.stopped_reason == "answer"
    assert r.tool_calls == 1
    roles = [m["role"] for m in r.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert tool_messages(r)[0]["content"] == "5"
    assert tool_messages(r)[0]["tool_call_id"] == r.messages[2]["tool_calls"][0]["id"]
    # the second engine call sees the first call and its result (append-only history)
    assert engine.calls[1]["messages"][:4] == r.messages[:4]
    assert engine.calls[0]["tools"][0]["function"]["name"] == "add"
    assert engine.calls[0]["mode"] == "asym" and engine.calls[0]["cache_key"] == "agent"
    assert len(r.stats.steps) == 2
    assert r.notes == ["step 0: tool 'add' returned int; sent as JSON"]  # a non-string return


def test_unknown_tool_invalid_args_raising_tool_non_string_return():
    outputs = [call("nope", x=1), call("add", a="two"), call("fail", reason="x"),
               call("lookup", key="k"), "done"]
    agent, engine, r = run(outputs)
    contents = [m["content"] for m in tool_messages(r)]
    assert "unknown tool 'nope'" in contents[0] and "available tools: add, fail, lookup" in contents[0]
    assert contents[1].startswith("Error: invalid arguments for tool 'add'")
    assert contents[2] == "Error: tool 'fail' raised RuntimeError: boom: x"
    assert json.loads(contents[3]) == {"key": "k", "value": 42}
    assert r.answer == "done"
    # three errors and one coercion note (dict), each saying which step
    assert len(r.notes) == 4 and any("returned dict; sent as JSON" in n for n in r.notes)


def test_unparseable_call_gets_a_hint_and_the_loop_goes_on():
    agent, engine, r = run(['{"name": "add", "arguments": {"a": 1', "fine"])
    hint = r.messages[3]
    assert hint["role"] == "user" and hint["content"].startswith("Error: your tool call could not")
    assert r.answer == "fine"


def test_max_steps():
    agent, engine, r = run([call("add", a=1)], max_steps=3)
    assert r.answer is None and r.stopped_reason == "max_steps"
    assert len(engine.calls) == 3 and r.tool_calls == 3
    assert "max_steps=3" in r.notes[-1]


@pytest.mark.parametrize("task", ["", "   ", [{"role": "system", "content": "hi"}]])
def test_empty_task(task):
    engine = ScriptedEngine(["unused"])
    r = Agent(engine, [add]).run(task)
    assert r.stopped_reason == "empty_task" and r.answer is None and engine.calls == []
    assert "empty task" in r.notes[0]


def test_bad_constructor_and_task_input():
    with pytest.raises(ValueError, match="max_steps"):
        Agent(ScriptedEngine([]), [add], max_steps=0)
    with pytest.raises(ValueError, match="two tools"):
        Agent(ScriptedEngine([]), [add, add])
    with pytest.raises(ValueError, match="cannot make a tool"):
        Agent(ScriptedEngine([]), [42])
    with pytest.raises(ValueError, match="task must be"):
        Agent(ScriptedEngine([]), [add]).run(42)


def test_stream_events_and_policy():
    engine = ScriptedEngine([call("add", a=1, b=1), "2"])
    choices = []

    def policy(step, messages):
        choices.append(step)
        return "required" if step == 0 else "auto"

    agent = Agent(engine, [add], tool_choice=policy, seed=7)
    kinds = [e.kind for e in agent.stream([{"role": "user", "content": "1+1?"}])]
    assert kinds == ["model", "tool", "model", "final", "done"]
    assert [c["tool_choice"] for c in engine.calls] == ["required", "auto"]
    assert [c["seed"] for c in engine.calls] == [7, 8]  # seed + step: reproducible, not repeated


def test_schema_tools_and_run_table():
    schema = {"type": "function", "function": {"name": "echo", "description": "echo", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}}}
    echo = Tool.from_schema(schema, lambda s: s.upper())
    agent, engine, r = run([call("echo", s="hi"), call("echo", t=1), "ok"], tools=[echo])
    assert [m["content"] for m in tool_messages(r)][0] == "HI"
    assert "missing required property 's'" in tool_messages(r)[1]["content"]
    text = render_text(r.stats)
    # 3 steps -> rows 1..3; the scripted stats give 6/8 = 75% acceptance per step
    assert "75%" in text and "run totals" in text and "escalations" in text
    assert r.stats.totals()["steps"] == 3
