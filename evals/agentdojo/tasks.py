"""What an AgentDojo run covers: its plan (settings) and its episodes (suite, user task, attack, injection task).

An *episode* is one user task of one suite, either without attack (key
`banking/user_task_3/none`) or under one attack with one injection task
(`banking/user_task_3/important_instructions/injection_task_1`), run through every mode of the
plan. Keys are plain strings so the episode log (evals/running/episode_log.py) and the Ray
fan-out (evals/running/ray_eval.py) carry them like suite seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

SUITES = ("workspace", "travel", "banking", "slack")
BENCHMARK_VERSION = "v1.2.2"  # agentdojo 0.1.35's latest (and its benchmark script's default)
NO_ATTACK = "none"


@dataclass(frozen=True)
class DojoPlan:
    """The settings every episode of a run shares (the episode log's key holds them)."""

    labels: tuple  # mode labels (responder.split_label); `full` is run first
    benchmark_version: str = BENCHMARK_VERSION
    max_new_tokens: int = 256
    max_iters: int = 15  # tool rounds per episode (AgentDojo's ToolsExecutionLoop default)
    fidelity: bool = True  # teacher-force the other modes along full's trajectory

    def settings(self) -> dict:
        return {"benchmark_version": self.benchmark_version, "max_new_tokens": self.max_new_tokens,
                "max_iters": self.max_iters, "fidelity": self.fidelity}


@dataclass(frozen=True)
class EpisodeKey:
    suite: str
    user_task: str
    attack: str = NO_ATTACK
    injection_task: str | None = None

    def __str__(self) -> str:
        parts = [self.suite, self.user_task, self.attack]
        return "/".join(parts + ([self.injection_task] if self.injection_task else []))

    @classmethod
    def parse(cls, text: str) -> "EpisodeKey":
        parts = text.split("/")
        if len(parts) == 3 and parts[2] == NO_ATTACK:
            return cls(parts[0], parts[1])
        if len(parts) == 4 and parts[2] != NO_ATTACK:
            return cls(*parts)
        raise ValueError(f"not an AgentDojo episode key: {text!r} (suite/user_task/none or "
                         "suite/user_task/attack/injection_task)")


def get_suite(name: str, version: str = BENCHMARK_VERSION):
    from agentdojo.task_suite.load_suites import get_suite as _get

    if name not in SUITES:
        raise ValueError(f"unknown AgentDojo suite {name!r}; one of {', '.join(SUITES)}")
    return _get(version, name)


def _task_number(task_id: str) -> int:
    return int(task_id.rsplit("_", 1)[1])


def pick_ids(available, wanted: str | None, prefix: str, limit: int | None = None) -> list:
    """Task ids from a comma list (`user_task_3` or just `3`; all when None), in task order,
    the first `limit` of them. ValueError naming an id the suite lacks."""
    ids = sorted(available, key=_task_number)
    if wanted:
        chosen = [w.strip() if not w.strip().isdigit() else f"{prefix}_{w.strip()}" for w in wanted.split(",")
                  if w.strip()]
        missing = [c for c in chosen if c not in ids]
        if missing:
            raise ValueError(f"unknown {prefix} ids {missing}; this suite has {ids[0]}..{ids[-1]}")
        ids = [i for i in ids if i in chosen]
    return ids[:limit] if limit else ids


def episode_keys(suites: list, attacks: list, *, user_tasks: str | None = None, injection_tasks: str | None = None,
                 max_user_tasks: int | None = None, version: str = BENCHMARK_VERSION,
                 attacked_user_tasks: str | None = None) -> list:
    """Every episode of the run, suite by suite, user task by user task, attack by attack; the
    attacks only on `attacked_user_tasks` of the selected ones when given (ValueError if it names
    a user task not selected)."""
    from agentdojo.attacks.attack_registry import ATTACKS

    bad = [a for a in attacks if a != NO_ATTACK and a not in ATTACKS]
    if bad:
        raise ValueError(f"unknown attacks {bad}; AgentDojo has {', '.join(sorted(ATTACKS))} (or none)")
    keys = []
    for name in suites:
        suite = get_suite(name, version)
        users = pick_ids(suite.user_tasks, user_tasks, "user_task", max_user_tasks)
        injections = pick_ids(suite.injection_tasks, injection_tasks, "injection_task")
        attacked = pick_ids(suite.user_tasks, attacked_user_tasks, "user_task") if attacked_user_tasks else users
        if set(attacked) - set(users):
            raise ValueError(f"--attacked-user-tasks names {sorted(set(attacked) - set(users))}, not among the "
                             "selected user tasks")
        for user in users:
            for attack in attacks:
                if attack != NO_ATTACK and user not in attacked:
                    continue
                if attack == NO_ATTACK:
                    keys.append(str(EpisodeKey(name, user)))
                else:  # a denial-of-service attack runs with one injection task, as AgentDojo runs it
                    keys += [str(EpisodeKey(name, user, attack, inj))
                             for inj in (injections[:1] if is_dos(attack) else injections)]
    return keys


def is_dos(attack: str) -> bool:
    """AgentDojo's denial-of-service attacks: scored attacked when the user task fails."""
    from agentdojo.attacks.attack_registry import ATTACKS

    return attack != NO_ATTACK and bool(getattr(ATTACKS[attack], "is_dos_attack", False))


def load_episode(key: str, version: str = BENCHMARK_VERSION, pipeline_name: str = "local") -> tuple:
    """(suite, user task, injection task or None, injections {vector: text}) of an episode key.
    The attack is AgentDojo's own, aimed at a pipeline named `pipeline_name`."""
    from agentdojo.attacks.attack_registry import load_attack

    k = EpisodeKey.parse(key)
    suite = get_suite(k.suite, version)
    user_task = suite.get_user_task_by_id(k.user_task)
    if k.injection_task is None:
        return suite, user_task, None, {}
    injection_task = suite.get_injection_task_by_id(k.injection_task)

    class _Named:  # attacks read only the target pipeline's name (the model's name in prose)
        name = pipeline_name

    attack = load_attack(k.attack, suite, _Named())
    return suite, user_task, injection_task, attack.attack(user_task, injection_task)
