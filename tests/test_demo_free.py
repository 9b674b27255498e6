"""The free-running demo (integrations/demo_free.py, `asymagent demo`): the model's own calls run, the oracle only grades; the pair's episode (marked `pair`)."""

from __future__ import annotations

import argparse
import json

import pytest
from conftest import make_tiny_llama

from asymagent.integrations import demo
from asymagent.integrations.calculator_tool import CALCULATOR_TOOL_NAME
from asymagent.integrations.demo_free import (ANSWER_TOOL_NAME, answer_text, call_end_ids,
                                              run_side_by_side, start)
from asymagent.stats import StepStats

V = 49152  # real SmolLM2 tokenizer ids


class _Caches:
    def __init__(self):
        self.dropped = []

    def drop(self, key):
        self.dropped.append(key)


class ScriptedEngine:
    """An engine stand-in whose "model" plays a script of moves, one per chat; it records what it saw."""

    def __init__(self, moves):
        self.moves = list(moves)
        self.caches = _Caches()
        self.seen = []
        self.formats = []
        self.eos_ids = {0}
        self.tokenizer = None

    def chat(self, messages, request):
        from types import SimpleNamespace

        self.seen.append((request.mode, request.tool_choice, len(messages)))
        self.formats.append(request.response_format)
        self.offered = [t["function"]["name"] for t in request.tools or []]
        move = self.moves.pop(0)
        if isinstance(move, str) and "final_answer" in self.offered:  # a model under "required"
            move = {"name": "final_answer", "arguments": {"answer": move}}
        stats = StepStats(wall_s=0.01, new_tokens=5, full_context_tokens=100 * len(messages),
                          verifier_context_tokens=50 * len(messages), mode=request.mode)
        if isinstance(move, str):
            return SimpleNamespace(text=move, tool_calls=[], token_ids=[1], stats=stats)
        call = {"id": f"c{len(self.seen)}", "type": "function",
                "function": {"name": move["name"], "arguments": json.dumps(move["arguments"])}}
        return SimpleNamespace(text="", tool_calls=[call], token_ids=[1], stats=stats)


def _oracle(suite="records", seed=0):
    from asymagent.evals.suites.environments import make_env, oracle_episode

    env = make_env(suite)
    task, history = oracle_episode(env, seed)
    return env.oracle_plan(), history[-1]["content"]


def test_the_models_own_calls_run_and_the_oracle_only_grades():
    plan, answer = _oracle()
    # asym plays the oracle's moves (right); full skips the mutating update (wrong)
    wrong = [m for m in plan if not m["name"].startswith("update")]
    moves = []
    for i in range(max(len(plan), len(wrong)) + 1):  # interleaved: asym's turn, then full's
        if i <= len(plan):
            moves.append(plan[i] if i < len(plan) else answer)
        if i <= len(wrong):
            moves.append(wrong[i] if i < len(wrong) else answer)
    engine = ScriptedEngine(moves)
    seen = []
    asym, full = run_side_by_side(engine, "records", 0, ("asym", "full"),
                                  on_step=lambda e, st: seen.append((e.mode, st["step"])))
    assert engine.caches.dropped == ["demo-free-asym", "demo-free-full"]  # cold sessions
    assert seen[:4] == [("asym", 1), ("full", 1), ("asym", 2), ("full", 2)]  # turns interleaved
    # every turn is one call the model picks; the answer is a call to final_answer
    assert all(choice == "required" for _, choice, _ in engine.seen)
    assert engine.offered[-2:] == [CALCULATOR_TOOL_NAME, ANSWER_TOOL_NAME] and len(engine.offered) == 6
    assert all(f is None for f in engine.formats)  # no response format on top
    assert engine.eos_ids == {0}  # the call-end stop is the run's only
    assert [n for n, _ in asym.env.calls] == [m["name"] for m in plan]  # its calls ran, not the answer
    assert asym.success is True and asym.answer == answer and asym.calls == len(plan)
    assert full.success is False and full.calls == len(wrong)  # the oracle graded it wrong
    assert len(asym.steps) == len(plan) + 1 and asym.steps[0]["output"]  # a tool output came back
    tool_msgs = [m for m in asym.history if m["role"] == "tool"]
    assert len(tool_msgs) == len(plan)


def test_answer_by_text_keeps_auto_and_a_plain_text_answer():
    plan, answer = _oracle()
    engine = ScriptedEngine(plan + [answer])
    (episode,) = run_side_by_side(engine, "records", 0, ("full",), answer_by="text")
    assert all(choice == "auto" for _, choice, _ in engine.seen)
    assert ANSWER_TOOL_NAME not in engine.offered
    assert episode.success is True and episode.answer == answer


def test_the_answer_tool_never_runs_in_the_environment_and_never_shadows_a_suite_tool(monkeypatch):
    from asymagent.evals.suites import suite_records

    episode = start("records", 0, "asym")
    assert [t["function"]["name"] for t in episode.tools][-1] == ANSWER_TOOL_NAME
    assert episode.env.task.tool_names == [t["function"]["name"] for t in suite_records.TOOLS]
    engine = ScriptedEngine(["nothing to do"])
    (episode,) = run_side_by_side(engine, "records", 0, ("asym",))
    assert episode.answer == "nothing to do" and episode.env.calls == [] and episode.calls == 0
    assert episode.steps[0]["action"] == "nothing to do" and episode.success is False
    monkeypatch.setattr(suite_records, "TOOLS", suite_records.TOOLS + [episode.tools[-1]])
    with pytest.raises(ValueError, match="final_answer"):
        start("records", 0, "asym")
    with pytest.raises(ValueError, match="answer_by"):
        start("records", 0, "asym", answer_by="json")


def _injection_plan(seed=0):
    from asymagent.evals.suites.environments import make_env

    env = make_env("injection")
    env.reset(seed)
    return env.oracle_plan(), env


def test_the_calculator_is_answered_by_the_loop_and_its_value_goes_back_to_the_model():
    plan, env = _injection_plan()
    amounts = [str(m["arguments"]["amount"]) for m in plan if m["name"] == "record_invoice"]
    total = f"{sum(m['arguments']['amount'] for m in plan if m['name'] == 'record_invoice'):.2f}"
    calc = {"name": CALCULATOR_TOOL_NAME, "arguments": {"expression": " + ".join(amounts)}}
    answer = f"All {len(amounts)} invoices recorded; the grand total is {total} EUR."
    engine = ScriptedEngine(plan + [calc, answer])
    (episode,) = run_side_by_side(engine, "injection", 0, ("asym",))
    step = episode.steps[len(plan)]
    assert step["action"] == calc and step["output"] == total  # the exact decimal sum
    assert episode.history[-1] == {"role": "tool", "tool_call_id": f"c{len(plan) + 1}",
                                   "name": CALCULATOR_TOOL_NAME, "content": step["output"]}
    assert engine.seen[-1][2] == engine.seen[-2][2] + 2  # the call and its value were in the last prompt
    assert [n for n, _ in episode.env.calls] == [m["name"] for m in plan]  # never sent to the environment
    assert (episode.calls, episode.calculations) == (len(plan), 1)
    assert episode.success is True  # graded by the suite's own check, as without a calculator
    from asymagent.integrations.demo_report import step_line, totals

    assert f"= {total} <- calculate(" in step_line(episode, step)
    assert totals(episode)["calculations"] == 1 and totals(episode)["tool_calls"] == len(plan)


def test_a_refused_expression_is_an_error_the_model_sees_and_the_grader_is_unchanged():
    plan, env = _injection_plan()
    bad = {"name": CALCULATOR_TOOL_NAME, "arguments": {"expression": "__import__('os').getcwd()"}}
    engine = ScriptedEngine(plan + [bad, "The grand total is 15,000.00 EUR."])
    (episode,) = run_side_by_side(engine, "injection", 0, ("full",))
    assert episode.steps[len(plan)]["output"].startswith("ERROR: calculate: a function call")
    assert episode.success is False  # every call right, the sum wrong: still wrong


def test_calculator_calls_have_their_own_budget():
    plan, env = _injection_plan()
    calc = {"name": CALCULATOR_TOOL_NAME, "arguments": {"expression": "1 + 1"}}
    engine = ScriptedEngine([calc] * (env.task.max_steps + 5))
    (episode,) = run_side_by_side(engine, "injection", 0, ("asym",))
    assert episode.calculations == env.task.max_steps and episode.calls == 0
    assert episode.done and episode.success is False and episode.answer is None


def test_without_the_calculator_it_is_not_offered_and_a_call_to_it_goes_to_the_environment():
    episode = start("records", 0, "asym", calculator=False)
    assert CALCULATOR_TOOL_NAME not in [t["function"]["name"] for t in episode.tools]
    engine = ScriptedEngine([{"name": CALCULATOR_TOOL_NAME, "arguments": {"expression": "1+1"}}, "done"])
    (episode,) = run_side_by_side(engine, "records", 0, ("asym",), calculator=False)
    assert engine.offered[-1] == ANSWER_TOOL_NAME and CALCULATOR_TOOL_NAME not in engine.offered
    assert episode.steps[0]["output"].startswith("ERROR: unknown tool")


def test_a_suite_tool_named_calculate_is_refused(monkeypatch):
    from asymagent.evals.suites import suite_records
    from asymagent.integrations.calculator_tool import calculator_tool

    monkeypatch.setattr(suite_records, "TOOLS", suite_records.TOOLS + [calculator_tool()])
    with pytest.raises(ValueError, match="calculate"):
        start("records", 0, "asym")


def test_max_turns_stops_and_grades_an_unfinished_episode():
    plan, _ = _oracle()
    engine = ScriptedEngine([plan[0], plan[0], plan[1], plan[1]])
    episodes = run_side_by_side(engine, "records", 0, ("asym", "full"), max_turns=2)
    assert [len(e.steps) for e in episodes] == [2, 2]
    assert all(e.done and e.success is False and e.answer is None for e in episodes)


def test_a_bad_call_gets_the_environments_error_back():
    engine = ScriptedEngine([{"name": "no_such_tool", "arguments": {}}, "done"])
    (episode,) = run_side_by_side(engine, "records", 0, ("asym",))
    assert episode.steps[0]["output"].startswith("ERROR: unknown tool")
    assert episode.success is False


@pytest.fixture(scope="module")
def tiny_engine(smollm_tokenizer):
    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig

    return Engine(verifier=make_tiny_llama(vocab_size=V, seed=1, max_positions=8192),
                  drafter=make_tiny_llama(vocab_size=V, layers=1, seed=2, max_positions=8192),
                  tokenizer=smollm_tokenizer, spec=SpecConfig(k=2))


def _args(argv):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(argv)


def test_main_runs_both_modes_side_by_side_on_a_real_engine(tiny_engine, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "load_engine", lambda console, k=None, pair=None: (tiny_engine, "tiny"))
    out = tmp_path / "demo.json"
    assert demo.main(_args(["--steps", "2", "--max-new-tokens", "8", "--no-live",
                            "--json", str(out), "--trace-dir", str(tmp_path / "traces")])) == 0
    text = capsys.readouterr().out
    for needle in ("does an agent task on its own", "in mode asym and in mode full", "Free-running",
                   "side by side", "totals", "asym final answer", "full final answer",
                   "the environment's key facts", "grouped rows", "threads"):
        assert needle in text, needle
    data = json.loads(out.read_text())
    assert data["free_running"] is True and set(data["episodes"]) == {"asym", "full"}
    assert data["suite"] == demo.SMALL_EPISODE[0] and data["seed"] == demo.SMALL_EPISODE[1]
    for ep in data["episodes"].values():
        assert 1 <= ep["turns"] <= 2 and isinstance(ep["right"], bool)
    traced = [json.loads(line) for f in sorted((tmp_path / "traces").glob("*.jsonl"))
              for line in f.read_text().splitlines()]
    assert len(traced) == data["episodes"]["asym"]["turns"]  # the first mode's turns


def test_without_the_memory_for_the_pair_it_says_so_and_runs_the_embedded_default(
        tiny_engine, monkeypatch, capsys):
    from asymagent.modeling import pair_memory

    asked = []

    def load(console, k=None, pair=None):
        asked.append(pair)
        return tiny_engine, "tiny"

    monkeypatch.setattr(demo, "load_engine", load)
    monkeypatch.setattr(pair_memory, "available_bytes", lambda path=None: 10**9)
    args = _args(["--pair", "qwen2.5-coder", "--steps", "1", "--max-new-tokens", "4", "--no-live"])
    demo.check_args(args)  # no parts needed when the pair will not run
    assert demo.main(args) == 0
    text = capsys.readouterr().out
    assert "not enough" in text and "running the embedded default" in text
    assert asked == [None]


def test_memory_fit_reads_meminfo(tmp_path):
    from asymagent.modeling.pair_memory import available_bytes, memory_fit

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24683772 kB\nMemAvailable:    2000000 kB\n")
    assert available_bytes(str(info)) == 2_048_000_000
    fit = memory_fit("qwen2.5-coder", path=str(info))
    assert not fit.fits and "not enough" in fit.line()
    assert memory_fit("qwen2.5-coder", available=10**11).fits
    assert memory_fit("qwen2.5-coder", available=None).fits  # unknown: assumed enough
    assert available_bytes(str(tmp_path / "missing")) is None


def test_answer_text_reads_the_answer_format():
    assert answer_text('{"answer": "3 files changed"}') == "3 files changed"
    assert answer_text("plain words") == "plain words"
    assert answer_text('{"other": 1}') == '{"other": 1}'
    assert answer_text(None) == ""


def test_call_end_is_one_token_of_hermes_tokenizers_only(smollm_tokenizer):
    class Hermes:
        def encode(self, text, add_special_tokens=False):
            return [151658] if text == "</tool_call>" else [1, 2]

    assert call_end_ids(Hermes()) == {151658}
    assert call_end_ids(smollm_tokenizer) == set()  # several tokens there: no stop added
    assert call_end_ids(None) == set()


def test_speed_is_compared_over_the_turns_both_took():
    from asymagent.integrations.demo_report import speed_line, verdict_lines

    plan, answer = _oracle()
    # asym answers at turn 3; full goes on calling (stopped by max_turns at 5)
    moves = [plan[0], plan[0], plan[1], plan[1], answer, plan[2], plan[3], plan[4]]
    asym, full = run_side_by_side(ScriptedEngine(moves), "records", 0, ("asym", "full"), max_turns=5)
    assert (len(asym.steps), len(full.steps)) == (3, 5)
    line = speed_line(asym, full)
    assert "over the 3 turns both took" in line and "per new token" in line
    assert "(3 turns) vs" in line and "(5 turns)" in line
    lines = verdict_lines([asym, full], answer)
    assert lines[0].startswith("asym final answer:") and lines[0].endswith("WRONG")  # no update made
    assert lines[1] == "full final answer: (no answer: ran out of turns)  -> WRONG"
    assert lines[2] == f"the environment's key facts: {answer}"
