"""Eval runner: teacher-forced scoring (step accuracy, fidelity) and free-running task success.

Glossary
- teacher-forced step: the engine sees the oracle's history and produces the next assistant
  message; then the oracle's own action (not the model's) is appended, so every mode sees the
  same histories. Tool steps ask for a constrained call (the suite's `tool_choice`, "required"
  by default, or the run's `tool_choice` when given: `asymagent eval --tool-choice auto` scores
  the tool steps as an agent framework asks for them); the final step is unconstrained ("auto").
- text at a tool step: the oracle calls a tool and the model wrote text instead (only possible
  when the step's tool_choice is "auto"; a call cut short by max_new_tokens is not text, text cut
  short is: `answered_in_text`); counted per mode as `text_at_tool_steps`.
- step accuracy: the output is the oracle's tool call (same name, equal parsed arguments), or,
  at the final step, a plain answer that carries the episode's key fact.
- fidelity (vs full): the output's token ids equal mode `full`'s at the same step.
- free-running: the model acts; its calls run in the environment until it answers or runs out
  of steps; task success is `env.check_success(answer)`.
- mode label: a decoding mode, optionally with SpecConfig overrides, e.g. `asym:k=4,beta=0.5` or
  `asym:strict_prefix=8` (the label is reported as written).
Latency is timed around each `engine.chat` call and the engine's StepStats go into a RunStats.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from asymagent.evals.suites.environments import (TOOL_CHOICES, actions_equal, make_env, parse_call,
                                                 tool_call_message, tool_result_message)
from asymagent.spec_config import MODES, SpecConfig
from asymagent.stats import RunStats, StepStats


def split_mode_labels(text: str) -> list:
    """'full,asym:k=4,beta=0.5,spec' -> ['full', 'asym:k=4,beta=0.5', 'spec'].

    Labels are comma separated and so are a label's overrides: a piece with '=' and no ':' is
    one more override of the label before it.
    """
    labels: list = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece:
            if not labels:
                raise ValueError(f"override {piece!r} comes before any mode in {text!r}")
            labels[-1] += "," + piece
        else:
            labels.append(piece)
    return labels


PY_LITERALS = {"True": True, "False": False, "None": None}


def parse_mode(label: str) -> tuple[str, dict]:
    """'asym:k=4,strict_prefix=8' -> ('asym', {'k': 4, 'strict_prefix': 8}); ValueError if bad."""
    mode, _, rest = label.strip().partition(":")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} in {label!r}; expected one of {MODES}")
    names = {f.name: f for f in dataclasses.fields(SpecConfig)}
    overrides: dict = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in names:
            raise ValueError(f"bad override {item!r} in {label!r}; use SpecConfig fields, e.g. k=4")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:  # Python spellings True/False/None, else a bare string
            overrides[key] = PY_LITERALS.get(value, value)  # such as acceptance=greedy
    if overrides:
        SpecConfig(**overrides)  # validates the values now, before any compute
    return mode, overrides


@contextmanager
def spec_overrides(engine, overrides: dict):
    """Temporarily replace fields of `engine.spec` (restored afterwards, even on error)."""
    if not overrides:
        yield
        return
    saved = engine.spec
    engine.spec = dataclasses.replace(saved, **overrides)
    try:
        yield
    finally:
        engine.spec = saved


def step_tool_choice(suite_choice: str, oracle, tool_choice: str | None = None) -> str:
    """The tool_choice a teacher-forced step asks for: "auto" where the oracle answers in text
    (the final step); at a tool step the run's `tool_choice` ("auto" or "required"), or the
    suite's own when that is None or "suite"."""
    if not isinstance(oracle, dict):
        return "auto"
    if tool_choice in (None, "suite"):
        return suite_choice
    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"tool_choice must be one of {TOOL_CHOICES}, got {tool_choice!r}")
    return tool_choice


def output_action(tool_calls: list, text: str) -> dict | str:
    """First tool call as {"name","arguments"} (arguments parsed), or the text when no call."""
    return parse_call(tool_calls[0]) if tool_calls else (text or "")


@dataclass
class StepRecord:
    """One scored teacher-forced step of one mode (a suite episode's step, or a user trace's)."""

    seed: int | None  # the episode's seed; None for a user trace
    step: int | None  # index of the assistant turn in the episode (0-based); None for a trace
    correct: bool
    same_as_full: bool | None  # None when mode full was not run
    attacked: bool | None  # injection suites only
    output: dict | str  # the model's action (see output_action)
    oracle: dict | str
    stats: StepStats
    call_s: float  # wall time around engine.chat (includes building the views)
    trace_id: str | None = None  # a user trace's `id` (evals on your own traces)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stats"] = self.stats.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "StepRecord":
        """Inverse of `to_dict` (episode logs, results sent back by Ray workers)."""
        return cls(**{**data, "stats": StepStats.from_dict(data["stats"])})


CUT_CALL_STARTS = ("{", "<tool_call>", "```json")  # how a call the token cap cut short begins


def answered_in_text(step: StepRecord) -> bool:
    """The oracle called a tool here and the model wrote text, no call. A call cut short by
    max_new_tokens (finish_reason "length" and the text opens as a call: a JSON object, a Hermes
    block, a ```json fence) is not counted; text cut short is."""
    if not (isinstance(step.oracle, dict) and isinstance(step.output, str)):
        return False
    cut_call = step.stats.finish_reason == "length" and step.output.lstrip().startswith(CUT_CALL_STARTS)
    return not cut_call


@dataclass
class ModeResult:
    """Everything measured for one mode label."""

    label: str
    steps: list = field(default_factory=list)  # list[StepRecord] (teacher-forced)
    run: RunStats = field(default_factory=RunStats)
    episodes: list = field(default_factory=list)  # free-running: dict(seed, success, steps, answer, wall_s)
    attacked_seeds: set = field(default_factory=set)
    injected_seeds: set = field(default_factory=set)

    def summary(self) -> dict:
        n = len(self.steps)
        fid = [s.same_as_full for s in self.steps if s.same_as_full is not None]
        totals = self.run.totals()
        out = {
            "mode": self.label,
            "task_success": (sum(e["success"] for e in self.episodes) / len(self.episodes)
                             if self.episodes else None),
            "step_accuracy": sum(s.correct for s in self.steps) / n if n else None,
            "fidelity_vs_full": sum(fid) / len(fid) if fid else None,
            "steps": n,
            "wall_s": sum(s.call_s for s in self.steps),
            "free_running_wall_s": sum(e["wall_s"] for e in self.episodes),
            "per_step_s": [s.call_s for s in self.steps],
            "cumulative_latency_s": _cumsum([s.call_s for s in self.steps]),
            "new_tokens": totals["new_tokens"],
            "verifier_prefill_tokens": totals["verifier_prefill_tokens"],
            "verifier_flops": totals["verifier_flops"],
            "drafted": totals["drafted"],
            "acceptance_rate": totals["acceptance_rate"],
            "mean_accepted_len": totals["mean_accepted_len"],
            "acceptance_by_position": self.run.acceptance_by_position(),
            "mean_compression_ratio": totals["mean_compression_ratio"],
            "escalations": totals["escalations"],
            "text_at_tool_steps": sum(answered_in_text(s) for s in self.steps),
            "per_step_correct": [s.correct for s in self.steps],
            "per_step_compression_ratio": [s.stats.compression_ratio for s in self.steps],
            "per_step_trace_id": [s.trace_id for s in self.steps] if any(
                s.trace_id is not None for s in self.steps) else None,
            "episodes": self.episodes,
        }
        if self.injected_seeds:
            out["attack_success_rate"] = len(self.attacked_seeds) / len(self.injected_seeds)
        return out


def _cumsum(xs: list) -> list:
    out, t = [], 0.0
    for x in xs:
        t += x
        out.append(t)
    return out


def _cold_sessions(engine, keys: list) -> None:
    """Drop the cache sessions and the suffix stores an episode uses, so every episode starts
    cold: its numbers (prefill tokens, outputs, drafts) never depend on which episode the engine
    ran before it, and a run fanned out over workers equals a local one (evals/running/ray_eval.py)."""
    from asymagent.evals.running.engine_setup import reset_suffix_stores

    for key in keys:
        engine.caches.drop(key)
    reset_suffix_stores(engine)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)


def _chat(engine, label: str, history: list, tools: list, tool_choice, max_new_tokens: int, cache_key: str):
    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.request import GenerationRequest

    mode, overrides = parse_mode(label)
    use_suffix_store(engine, label)  # each label copies only from its own earlier responses
    request = GenerationRequest(mode=mode, max_new_tokens=max_new_tokens, tools=tools,
                                tool_choice=tool_choice, cache_key=cache_key)  # greedy
    with spec_overrides(engine, overrides):
        t0 = time.perf_counter()
        r = engine.chat(history, request=request)
        return r, time.perf_counter() - t0


def teacher_forced(engine, suite: str, seeds, labels: list, *, max_new_tokens: int = 96,
                   max_steps: int | None = None, results: dict | None = None,
                   progress: bool = True, tool_choice: str | None = None) -> dict:
    """Score every label on the oracle's histories; returns {label: ModeResult}.

    Labels run interleaved at every step (same history, same moment), `full` first when present
    so fidelity can be computed. `max_steps` caps the assistant turns scored per episode. Every
    episode starts on cold cache sessions (no prefix reuse from the previous seed).
    `tool_choice`: what tool steps ask for ("auto" | "required"; None or "suite": the suite's own,
    `step_tool_choice`).
    """
    labels = _ordered(labels)
    results = results if results is not None else {}
    for label in labels:
        results.setdefault(label, ModeResult(label))
    keys = [f"tf-{label}" for label in labels]
    for seed in seeds:
        _cold_sessions(engine, keys)
        env = make_env(suite)
        task = env.reset(seed)
        history = task.messages()
        inject_at = env.injected_step() if hasattr(env, "injected_step") else None
        limit = max_steps if max_steps is not None else task.max_steps + 1
        bar = _progress(min(limit, len(env.oracle_plan()) + 1) * len(labels), f"{suite}:{seed}", progress)
        for step in range(limit):
            oracle = env.oracle_action(history)
            choice = step_tool_choice(env.tool_choice, oracle, tool_choice)
            full_ids = None
            for label in labels:
                r, secs = _chat(engine, label, history, task.tools, choice, max_new_tokens, f"tf-{label}")
                action = output_action(r.tool_calls, r.text)
                correct = (actions_equal(action, oracle) if isinstance(oracle, dict)
                           else isinstance(action, str) and env.check_answer(action))
                if label == "full":
                    full_ids = list(r.token_ids)
                attacked = None
                if inject_at is not None and step >= inject_at:
                    attacked = env.attack_succeeded(r.tool_calls, r.text)
                    results[label].injected_seeds.add(seed)
                    if attacked:
                        results[label].attacked_seeds.add(seed)
                rec = StepRecord(seed, step, bool(correct),
                                 None if full_ids is None else list(r.token_ids) == full_ids,
                                 attacked, action, oracle, r.stats, secs)
                results[label].steps.append(rec)
                results[label].run.add(r.stats)
                bar.update(1)
            if not isinstance(oracle, dict):
                break
            call_id = f"call_{step}"
            history = history + [tool_call_message(oracle["name"], oracle["arguments"], call_id),
                                 tool_result_message(call_id, oracle["name"],
                                                     env.step(oracle["name"], oracle["arguments"]))]
        bar.close()
    _cold_sessions(engine, keys)  # frees the episode's KV caches
    return results


def free_running(engine, suite: str, seeds, labels: list, *, max_new_tokens: int = 96,
                 results: dict | None = None, progress: bool = True) -> dict:
    """Let each label act until it answers (or task.max_steps calls); records task success.
    Every episode starts on a cold cache session, like `teacher_forced`."""
    labels = _ordered(labels)
    results = results if results is not None else {}
    for label in labels:
        results.setdefault(label, ModeResult(label))
    for seed in seeds:
        for label in labels:
            _cold_sessions(engine, [f"fr-{label}"])
            env = make_env(suite)
            task = env.reset(seed)
            history = task.messages()
            answer, calls, wall = None, 0, 0.0
            bar = _progress(task.max_steps, f"free {label} {suite}:{seed}", progress)
            while calls < task.max_steps:
                r, secs = _chat(engine, label, history, task.tools, "auto", max_new_tokens, f"fr-{label}")
                wall += secs
                if not r.tool_calls:
                    answer = r.text
                    break
                history = history + [{"role": "assistant", "content": r.text or "", "tool_calls": r.tool_calls}]
                for call in r.tool_calls:
                    fn = call["function"]
                    history.append(tool_result_message(call.get("id", f"call_{calls}"), fn["name"],
                                                       env.step(fn["name"], fn.get("arguments") or {})))
                    calls += 1
                    bar.update(1)
            bar.close()
            results[label].episodes.append({"seed": seed, "success": env.check_success(answer),
                                            "tool_calls": calls, "answer": answer, "wall_s": wall})
            _cold_sessions(engine, [f"fr-{label}"])
    return results


def run_traces(engine, examples: list, labels: list, *, max_new_tokens: int = 96,
               results: dict | None = None, progress: bool = True,
               tool_choice: str | None = None) -> dict:
    """Score user traces (asymagent.evals.suites.traces): one teacher-forced step per example.
    A tool step asks for "required" (or the run's `tool_choice`, as `teacher_forced`)."""
    from asymagent.evals.suites.traces import score_output

    labels = _ordered(labels)
    results = results if results is not None else {}
    for label in labels:
        results.setdefault(label, ModeResult(label))
    bar = _progress(len(examples) * len(labels), "traces", progress)
    for ex in examples:
        oracle = {} if ex.is_tool_step and ex.tools else ""  # a tool step or an answer step
        choice = step_tool_choice("required", oracle, tool_choice)
        full_ids = None
        for label in labels:
            r, secs = _chat(engine, label, ex.messages, ex.tools, choice, max_new_tokens, f"tr-{label}")
            if label == "full":
                full_ids = list(r.token_ids)
            results[label].steps.append(StepRecord(
                None, None, score_output(ex, r.tool_calls, r.text),
                None if full_ids is None else list(r.token_ids) == full_ids, None,
                output_action(r.tool_calls, r.text), ex.expected, r.stats, secs, trace_id=ex.id))
            results[label].run.add(r.stats)
            bar.update(1)
    bar.close()
    return results


def _ordered(labels: list) -> list:
    if not labels:
        raise ValueError("give at least one mode")
    for label in labels:
        parse_mode(label)
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate modes in {labels}")
    return sorted(labels, key=lambda l: l != "full")  # full first (stable otherwise)
