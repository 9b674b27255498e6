"""The demo's main job: one free-running agent episode per mode, run side by side, graded by the environment's oracle.

Each mode gets its own environment (same suite and seed), its own history and cache session and
its own store of earlier responses (so neither copies the other's answers). The model acts on its
own: every step is `engine.chat(history, tools + [final_answer], tool_choice="required")`: each
turn is one call the model chooses (tool and arguments), held to the tools' schemas by the
grammar; a call to an environment tool is executed there and its output appended, a call to
`final_answer(answer)` ends the episode with that answer (or the task's tool-call budget runs out).
Beside them the agent has a calculator, `calculate(expression)` (integrations/calculator_tool.py:
exact decimal arithmetic, read with `ast`), answered by this loop, never by the environment, as
agent stacks give their models one: measured 2026-12-07, the pair's 1.5B made every call of the
injection task right and then summed the amounts wrong in its answer. Its calls have their own
budget (the task's tool-call budget again) and are not environment calls.
The answer is a tool, as in smolagents' `final_answer` and the OpenAI Agents SDK's output tools,
because free text was where the pair's turns went wrong: measured 2026-12-07 (docs/log.md), under
"auto" the 1.5B wrote its second call as `{{'name': ...}}` then the tool's output itself, which
no parser reads as a call, so the episode "answered" with that text. `answer="text"` keeps the
old loop (tool_choice "auto", a plain-text turn is the answer). The oracle is never asked for an action: only `env.check_success`
grades the end (every required side effect done, none wrong, the answer carries the key fact).
The modes take their steps interleaved (step 1 of each, then step 2 of each, ...), so both see the
same machine load and their latencies compare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from asymagent.integrations.calculator_tool import CALCULATOR_TOOL_NAME, calculate, calculator_tool

ANSWER_TOOL_NAME = "final_answer"


def answer_tool() -> dict:
    """The tool that ends an episode: `final_answer(answer)`, the answer for the user."""
    from asymagent.evals.suites.environments import function_tool

    return function_tool(ANSWER_TOOL_NAME, "Give the user your final answer, once the task is done. "
                         "Call it only after every other step of the task. The answer reports "
                         "what you did, with counts (how many items you read, recorded or "
                         "changed), and the facts and numbers the user asked for.",
                         {"answer": {"type": "string", "description": "the answer for the user: "
                                     "what was done, with how many items, and the facts and "
                                     "numbers they asked for"}})


# A turn ends with its first complete call: "</tool_call>" (a token of Hermes-format models) stops
# it as EOS does, one call a turn as the suites' system prompts ask. Measured on the pair's 1.5B:
# past its call, mode full went on to write the tool's output itself (96 tokens a turn, and the
# next turns continued that text). Nothing else constrains a turn: the model calls or answers.
CALL_END = "</tool_call>"


def call_end_ids(tokenizer) -> set:
    """{the id of CALL_END} where the tokenizer has it as one token, else an empty set."""
    ids = tokenizer.encode(CALL_END, add_special_tokens=False) if tokenizer is not None else []
    return set(ids) if len(ids) == 1 else set()


@dataclass
class Episode:
    """One mode's free-running episode: its steps, stats, answer and the oracle's verdict."""

    mode: str
    env: object  # the Environment the model acts in
    history: list
    tools: list
    budget: int  # tool calls allowed (the task's max_steps)
    answer_by: str = "tool"  # "tool": every turn a call, final_answer(answer) ends; "text": auto
    steps: list = field(default_factory=list)  # dicts: step, action, output, stats
    calls: int = 0  # environment tool calls executed
    calculations: int = 0  # calculate calls, answered by the loop (own budget: `budget` again)
    answer: str | None = None
    done: bool = False
    success: bool | None = None

    @property
    def stats(self):
        from asymagent.stats import RunStats

        run = RunStats()
        for step in self.steps:
            run.add(step["stats"])
        return run


def action_of(result) -> dict | str:
    """The model's move: its first tool call {"name", "arguments"} or its text."""
    if result.tool_calls:
        fn = result.tool_calls[0]["function"]
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = fn.get("arguments")
        return {"name": fn["name"], "arguments": args}
    return result.text or ""


def answer_text(text: str | None) -> str:
    """The answer of an ANSWER_FORMAT object (`{"answer": "..."}`), else the text as it is."""
    try:
        value = json.loads(text or "")
    except json.JSONDecodeError:
        return text or ""
    return str(value["answer"]) if isinstance(value, dict) and "answer" in value else (text or "")


def start(suite: str, seed: int, mode: str, answer_by: str = "tool", calculator: bool = True) -> Episode:
    """A fresh episode of `suite`/`seed` for `mode`: the suite's tools, then `calculate` (unless
    `calculator` is False), then final_answer where `answer_by` is "tool"."""
    from asymagent.evals.suites.environments import make_env

    if answer_by not in ("tool", "text"):
        raise ValueError(f"answer_by must be 'tool' or 'text', got {answer_by!r}")
    env = make_env(suite)
    task = env.reset(seed)
    tools = list(task.tools)
    ours = ([calculator_tool()] if calculator else []) + ([answer_tool()] if answer_by == "tool" else [])
    for tool in ours:
        name = tool["function"]["name"]
        if name in task.tool_names:
            raise ValueError(f"suite {suite!r} has a tool named {name!r} already")
    return Episode(mode, env, task.messages(), tools + ours, task.max_steps, answer_by=answer_by)


def offers(episode: Episode, name: str) -> bool:
    return any(t["function"]["name"] == name for t in episode.tools)


def _answer_of_call(call: dict) -> str | None:
    """The answer of a final_answer call (None for any other call)."""
    fn = call["function"]
    if fn["name"] != ANSWER_TOOL_NAME:
        return None
    args = fn.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        return str(args)
    return str(args.get("answer", "")) if isinstance(args, dict) else str(args)


def _argument(arguments, key: str):
    """arguments[key] of a call's arguments (a JSON object string or a dict); None if absent."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return None
    return arguments.get(key) if isinstance(arguments, dict) else None


def take_step(engine, episode: Episode, max_new_tokens: int, trace_writer=None) -> dict:
    """One model turn of `episode`: decode, execute its tool calls (or take its answer). A
    `trace_writer` (asymagent.trace_capture.TraceWriter) captures the turn."""
    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.evals.suites.environments import tool_result_message
    from asymagent.request import GenerationRequest

    use_suffix_store(engine, episode.mode)  # each mode copies only its own earlier responses
    choice = "required" if episode.answer_by == "tool" else "auto"
    request = GenerationRequest(mode=episode.mode, max_new_tokens=max_new_tokens, tools=episode.tools,
                                tool_choice=choice,
                                cache_key=f"demo-free-{episode.mode}")  # greedy
    prompt = [dict(m) for m in episode.history]
    r = engine.chat(prompt, request=request)
    if trace_writer is not None:
        trace_writer.record(engine, prompt, episode.tools, r, source="demo", mode=episode.mode)
    step = {"step": len(episode.steps) + 1, "action": action_of(r), "output": None, "stats": r.stats}
    final = _answer_of_call(r.tool_calls[0]) if r.tool_calls else None
    if final is not None:
        episode.answer, episode.done = final, True
        step["action"] = episode.answer
    elif not r.tool_calls:
        episode.answer, episode.done = answer_text(r.text), True
        step["action"] = episode.answer
    else:
        # the call alone: text a turn wrote around its call is not fed back
        episode.history.append({"role": "assistant", "content": "", "tool_calls": r.tool_calls[:1]})
        call = r.tool_calls[0]
        fn = call["function"]
        call_id = call.get("id") or f"call_{episode.calls + episode.calculations}_0"
        if fn["name"] == CALCULATOR_TOOL_NAME and offers(episode, CALCULATOR_TOOL_NAME):
            out = calculate(_argument(fn.get("arguments"), "expression"))  # the loop's own tool
            episode.calculations += 1
        else:
            out = episode.env.step(fn["name"], fn.get("arguments") or {})
            episode.calls += 1
        episode.history.append(tool_result_message(call_id, fn["name"], out))
        step["output"] = out
        episode.done = episode.calls >= episode.budget or episode.calculations >= episode.budget
    episode.steps.append(step)
    if episode.done:
        episode.success = bool(episode.env.check_success(episode.answer))
    return step


def run_side_by_side(engine, suite: str, seed: int, modes: tuple, *, max_new_tokens: int = 96,
                     max_turns: int | None = None, on_step=None, trace_writer=None,
                     answer_by: str = "tool", calculator: bool = True) -> list:
    """Free-running episodes of `modes` (e.g. ("asym", "full")), interleaved turn by turn; returns
    the Episodes (`answer_by`, `calculator`: module docstring and `start`). `max_turns` stops every episode after that many model turns (unfinished
    episodes are graded as they stand: no answer, so not right). `on_step(episode, step)` sees
    each turn as it ends; `trace_writer` captures the turns of the first mode."""
    from asymagent.evals.running.engine_setup import reset_suffix_stores

    episodes = [start(suite, seed, mode, answer_by, calculator) for mode in modes]
    for mode in modes:  # cold sessions: no cache or copied responses from an earlier run
        engine.caches.drop(f"demo-free-{mode}")
    reset_suffix_stores(engine)
    eos = engine.eos_ids
    engine.eos_ids = set(eos) | call_end_ids(getattr(engine, "tokenizer", None))
    try:
        _turns(engine, episodes, max_new_tokens, max_turns, on_step, trace_writer)
    finally:
        engine.eos_ids = eos
    return episodes


def _turns(engine, episodes, max_new_tokens, max_turns, on_step, trace_writer) -> None:
    turn = 0
    while not all(e.done for e in episodes):
        if max_turns is not None and turn >= max_turns:
            for e in episodes:
                if not e.done:
                    e.done, e.success = True, bool(e.env.check_success(e.answer))
            break
        for e in episodes:
            if not e.done:
                step = take_step(engine, e, max_new_tokens,
                                 trace_writer if e is episodes[0] else None)
                if on_step is not None:
                    on_step(e, step)
        turn += 1
