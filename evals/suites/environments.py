"""Environment API for long-horizon agent evals: Task, the Environment base class, seeds, registry.

An environment is a small deterministic world with tools:

    env = make_env("records")
    task = env.reset(seed)                  # Task: system prompt, user prompt, OpenAI tool schemas
    history = task.messages()               # OpenAI-format messages
    action = env.oracle_action(history)     # {"name", "arguments"} or a str (the final answer)
    output = env.step(name, arguments)      # the tool's output, a string (errors are strings too)
    env.check_success(final_answer)         # did the run do the job (side effects + answer)?

The oracle is a teacher-forcing policy: it assumes the history's tool calls are its own and
raises ValueError when they are not. Worlds are generated from `random.Random(f"{suite}:{seed}")`
(string seeding is stable across processes and Python hash seeds), so a seed always gives the
same episode.

Seeds: DEV_SEEDS are for tuning, plots, docs and drafter training; TEST_SEEDS are held out and
used only for reported numbers (never train or tune on them). The two ranges are disjoint.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from asymagent.traces import parse_call  # noqa: F401  (re-exported: suites and the runner use it)

DEV_SEEDS: tuple[int, ...] = tuple(range(0, 1000))  # tuning, docs, drafter training data
TEST_SEEDS: tuple[int, ...] = tuple(range(100_000, 100_500))  # held out: reported numbers only


def pick_seeds(split: str, episodes: int, seeds: str | None) -> list:
    """Exact `seeds` ("3,5"), or the first `episodes` DEV_SEEDS / TEST_SEEDS of `split`."""
    if seeds:
        try:
            return [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError as exc:
            raise ValueError(f"--seeds must be comma-separated integers, got {seeds!r}") from exc
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    return list((DEV_SEEDS if split == "dev" else TEST_SEEDS)[:episodes])


def is_test_seed(seed: int) -> bool:
    """True for held-out seeds (drafter training data generators must skip these)."""
    return TEST_SEEDS[0] <= int(seed) <= TEST_SEEDS[-1]


@dataclass
class Task:
    """What the agent is given at the start of an episode."""

    suite: str
    seed: int
    system_prompt: str
    user_prompt: str
    tools: list  # OpenAI tool schemas: {"type": "function", "function": {name, description, parameters}}
    max_steps: int  # a free-running agent gets this many tool calls before it is stopped

    def messages(self) -> list:
        """The initial OpenAI-format conversation: system then user."""
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.user_prompt},
        ]

    @property
    def tool_names(self) -> list:
        return [t["function"]["name"] for t in self.tools]


def function_tool(name: str, description: str, properties: dict, required: list | None = None) -> dict:
    """An OpenAI tool schema with a closed JSON-schema object for its arguments."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else required,
                "additionalProperties": False,
            },
        },
    }


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


def validate_arguments(schema: dict, arguments: dict) -> str | None:
    """Check arguments against a tool's (flat) parameter schema; the error text, or None if valid."""
    params = schema["function"]["parameters"]
    props = params.get("properties", {})
    for key in params.get("required", []):
        if key not in arguments:
            return f"missing required argument {key!r}"
    for key, value in arguments.items():
        if key not in props:
            return f"unexpected argument {key!r} (allowed: {', '.join(props)})"
        spec = props[key]
        expected = _JSON_TYPES.get(spec.get("type", "string"), object)
        if isinstance(value, bool) and spec.get("type") in ("integer", "number"):
            return f"argument {key!r} must be {spec['type']}, got boolean"
        if not isinstance(value, expected):
            return f"argument {key!r} must be {spec.get('type')}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {key!r} must be one of {spec['enum']}, got {value!r}"
    return None


def tool_call_message(name: str, arguments: dict, call_id: str) -> dict:
    """The assistant message that makes one tool call (OpenAI shape, arguments as a JSON string)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }],
    }


def tool_result_message(call_id: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def history_tool_calls(history: list) -> list:
    """[(name, arguments dict)] of every assistant tool call in an OpenAI-format history."""
    calls = []
    for msg in history:
        if msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or []:
            parsed = parse_call(call)
            args = parsed["arguments"]
            calls.append((parsed["name"], args if isinstance(args, dict) else {"__unparsed__": args}))
    return calls


def actions_equal(a: dict | str | None, b: dict | str | None) -> bool:
    """Step-accuracy rule: same tool name and equal parsed arguments; final answers never equal a call."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.get("name") == b.get("name") and a.get("arguments") == b.get("arguments")
    return False


# what a run may ask teacher-forced tool steps for (`asymagent eval --tool-choice`): "suite" is
# each suite's own `Environment.tool_choice`
TOOL_CHOICES = ("suite", "auto", "required")


@dataclass
class Environment(ABC):
    """Base class of a suite: subclasses build the world in `_build(rng)` and answer tools in `_call`.

    `_build` must set `self._plan` (the oracle's tool calls, a list of {"name","arguments"}),
    `self._answer` (the oracle's final answer) and return the Task.
    """

    name: str = ""
    tool_choice: str = "required"  # what teacher-forced scoring asks the engine for at tool steps
    task: Task | None = None
    calls: list = field(default_factory=list)  # [(name, arguments)] actually executed by step()
    _plan: list = field(default_factory=list)
    _answer: str = ""

    # --- API -----------------------------------------------------------------------------
    def reset(self, seed: int) -> Task:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.calls = []
        self._plan = []
        self._answer = ""
        rng = random.Random(f"{self.name}:{seed}")
        self.task = self._build(rng, seed)
        return self.task

    def step(self, name: str, arguments: dict | str | None = None) -> str:
        """Run one tool call and return its output; a bad call returns an 'ERROR: ...' string."""
        if self.task is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before step()")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return f"ERROR: arguments are not valid JSON ({exc.msg})"
        arguments = arguments or {}
        if not isinstance(arguments, dict):
            return "ERROR: arguments must be a JSON object"
        schema = next((t for t in self.task.tools if t["function"]["name"] == name), None)
        if schema is None:
            return f"ERROR: unknown tool {name!r}; available tools: {', '.join(self.task.tool_names)}"
        problem = validate_arguments(schema, arguments)
        if problem:
            return f"ERROR: {name}: {problem}"
        self.calls.append((name, dict(arguments)))
        return self._call(name, arguments)

    def oracle_action(self, history: list) -> dict | str:
        """The oracle's next move after `history`: a tool call dict, or the final answer (str)."""
        if self.task is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before oracle_action()")
        made = history_tool_calls(history)
        for i, (name, args) in enumerate(made):
            if i >= len(self._plan) or not actions_equal({"name": name, "arguments": args}, self._plan[i]):
                raise ValueError(
                    f"{self.name}: history diverged from the oracle at tool call {i + 1} "
                    f"({name}); the oracle only continues its own trajectory"
                )
        if len(made) < len(self._plan):
            step = self._plan[len(made)]
            return {"name": step["name"], "arguments": dict(step["arguments"])}
        return self._answer

    def oracle_plan(self) -> list:
        """All oracle tool calls of the current episode (copies)."""
        return [{"name": s["name"], "arguments": dict(s["arguments"])} for s in self._plan]

    def check_success(self, final_answer: str | None) -> bool:
        """Every required side effect done, no wrong one, and the answer carries the key fact."""
        return self._side_effects_ok() and self.check_answer(final_answer)

    def check_answer(self, final_answer: str | None) -> bool:
        """Does a final answer carry the episode's key fact (the suite's own rule) and every value
        the oracle's answer holds (evals/suites/answer_values.py)? Teacher-forced final steps use this."""
        from asymagent.evals.suites.answer_values import carries_values

        if self.task is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before check_answer()")
        return (bool(final_answer) and self._answer_ok(final_answer)
                and carries_values(final_answer, self.answer_values()))

    def key_fact_ok(self, final_answer: str) -> bool:
        """The suite's own key-fact rule alone (before issue 52 the whole final-answer rule;
        evals/probes/regrade.py reproduces stored verdicts with it)."""
        return self._answer_ok(final_answer)

    def answer_values(self) -> list:
        """The values of the oracle's final answer: its words with digits, and the words it takes
        from the tool outputs of the oracle's own episode (a fresh copy of this seed's world is
        replayed, so the agent's own calls and side effects do not change them)."""
        from asymagent.evals.suites.answer_values import answer_values, history_parts

        if self.task is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before answer_values()")
        cached = getattr(self, "_values", None)
        if cached is None or cached[0] != self.task.seed:
            task, history = oracle_episode(type(self)(), self.task.seed)
            request, outputs = history_parts(history[:-1], task.tools)
            cached = self._values = (self.task.seed, answer_values(history[-1]["content"], request, outputs))
        return list(cached[1])

    def attack_succeeded(self, tool_calls: list, text: str) -> bool:
        """Injection suites only: did this model output follow an injected instruction?"""
        return False

    # --- subclass hooks ------------------------------------------------------------------
    @abstractmethod
    def _build(self, rng: random.Random, seed: int) -> Task:
        """Generate the world from `rng`; set `_plan` and `_answer`; return the Task."""

    @abstractmethod
    def _call(self, name: str, arguments: dict) -> str:
        """Answer one validated tool call."""

    def _side_effects_ok(self) -> bool:
        """Default: the mutating calls made equal the oracle's mutating calls, as a set."""
        mutating = self._mutating_tools()
        want = {json.dumps(s, sort_keys=True) for s in self._plan if s["name"] in mutating}
        done = {json.dumps({"name": n, "arguments": a}, sort_keys=True)
                for n, a in self.calls if n in mutating}
        return want == done

    def _mutating_tools(self) -> set:
        return set()

    def _answer_ok(self, answer: str) -> bool:
        return True


def oracle_episode(env: Environment, seed: int) -> tuple[Task, list]:
    """Run the oracle to the end; returns the Task and the full message history (final answer last)."""
    task = env.reset(seed)
    history = task.messages()
    for n in range(task.max_steps + 1):
        action = env.oracle_action(history)
        if isinstance(action, str):
            history.append({"role": "assistant", "content": action})
            return task, history
        call_id = f"call_{n}"
        history.append(tool_call_message(action["name"], action["arguments"], call_id))
        history.append(tool_result_message(call_id, action["name"], env.step(action["name"], action["arguments"])))
    raise RuntimeError(f"{env.name}: oracle did not finish within max_steps={task.max_steps}")


SUITES = {
    "records": ("asymagent.evals.suites.suite_records", "RecordsEnv"),
    "fs_audit": ("asymagent.evals.suites.suite_fs_audit", "FsAuditEnv"),
    "tickets": ("asymagent.evals.suites.suite_tickets", "TicketsEnv"),
    "injection": ("asymagent.evals.suites.suite_injection", "InjectionEnv"),
    "injection_call": ("asymagent.evals.suites.suite_injection_call", "InjectionCallEnv"),
    "invoices": ("asymagent.evals.suites.suite_invoices", "InvoicesEnv"),
    "dispatch": ("asymagent.evals.suites.suite_dispatch", "DispatchEnv"),
}
LONG_HORIZON_SUITES = ("records", "fs_audit", "tickets", "dispatch")
HELD_OUT_SUITES = ("dispatch",)  # unseen domains: run on TEST_SEEDS only, never tuned or trained on


def check_held_out(suite: str, seeds: list) -> None:
    """Refuse a held-out suite on any seed outside TEST_SEEDS (`--split dev`, dev `--seeds`)."""
    if suite in HELD_OUT_SUITES and any(not is_test_seed(s) for s in seeds):
        raise ValueError(f"suite {suite!r} is held out: test seeds only (--split test)")


def make_env(name: str) -> Environment:
    """A fresh environment of suite `name` (one of SUITES)."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; available: {', '.join(SUITES)}")
    import importlib

    module, cls = SUITES[name]
    return getattr(importlib.import_module(module), cls)()
