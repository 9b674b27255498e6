"""Suite "fs_audit": audit a directory tree against a policy read at the very first step.

Episode (13-30 tool calls, ~5-7k tokens with the SmolLM2 tokenizer):
  read_file(policy)   a long policy whose two operative numbers/names are buried mid-document:
                      the retention limit in days and the owner that must own every export;
  list_dir(root), list_dir(each subdirectory)  long listings;
  stat_file(path)     for every file (6-9), each with age, owner, mode and an audit trail;
  archive_file(path)  for files older than the limit, chown_file(path, owner) for files owned by
                      anyone but the required owner (in stat order; a file can need both);
  final answer        how many files were changed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from asymagent.evals.suites import synthetic_text as st
from asymagent.evals.suites.environments import Environment, Task, function_tool

ROOT = "/srv/exports"
POLICY = "/etc/audit/policy.md"
OWNERS = ("svc-export", "svc-batch", "etl-runner", "backup", "reporting", "analytics")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "root")
SUBDIRS = ("finance", "hr", "sales", "ops", "legal", "marketing")
MAX_CALLS = 30  # episodes stay within 10-30 tool calls
EXTS = (".csv", ".parquet", ".json", ".xlsx", ".txt")

TOOLS = [
    function_tool("read_file", "Read a text file.", {"path": {"type": "string"}}),
    function_tool("list_dir", "List a directory.", {"path": {"type": "string"}}),
    function_tool("stat_file", "Show a file's metadata: age, owner, mode, audit trail.",
                  {"path": {"type": "string"}}),
    function_tool("archive_file", "Move a file to cold storage.", {"path": {"type": "string"}}),
    function_tool("chown_file", "Change a file's owner.",
                  {"path": {"type": "string"}, "owner": {"type": "string"}}),
]

SYSTEM = ("You are a careful file-system auditor. You can only act through the tools. "
          "Follow the written policy exactly, one tool call at a time, and report when done.")


@dataclass
class FsAuditEnv(Environment):
    name: str = "fs_audit"
    files: dict = field(default_factory=dict)  # path -> dict(age, owner, mode, size, trail)
    dirs: list = field(default_factory=list)
    archived: list = field(default_factory=list)

    def _build(self, rng: random.Random, seed: int) -> Task:
        self.max_age = rng.choice((30, 45, 60, 90, 120))
        self.owner = rng.choice(OWNERS)
        self.dirs = [f"{ROOT}/{d}" for d in rng.sample(SUBDIRS, rng.randint(2, 3))]
        self.files = {}
        self.archived = []
        for d in self.dirs:
            stems = rng.sample(("ledger", "payroll", "leads", "roster", "claims", "usage", "audit",
                                "invoices", "pipeline", "budget", "contracts", "events"), 3)
            for stem in stems:
                path = f"{d}/{stem}_{st.date(rng)}{rng.choice(EXTS)}"
                self.files[path] = {
                    "age": rng.randint(1, self.max_age * 3 // 2),
                    "owner": self.owner if rng.random() < 0.75 else rng.choice(USERS),
                    "mode": rng.choice(("0640", "0644", "0600", "0660")),
                    "size": rng.randint(2_000, 9_000_000),
                    "trail": [f"{st.date(rng, 2025)} {st.person(rng)}: {st.sentence(rng)}" for _ in range(9)],
                }
        paths = list(self.files)
        if not any(self.files[p]["age"] > self.max_age for p in paths):  # >= 1 archive per episode
            self.files[rng.choice(paths)]["age"] = self.max_age + rng.randint(1, 30)
        if all(self.files[p]["owner"] == self.owner for p in paths):  # >= 1 chown per episode
            self.files[rng.choice(paths)]["owner"] = rng.choice(USERS)
        self._policy = self._policy_text(rng)
        self._dir_notes = {d: st.paragraph(rng, 4) for d in [ROOT] + self.dirs}
        reads = 2 + len(self.dirs) + len(paths)
        while True:
            actions = []
            for p in paths:
                if self.files[p]["age"] > self.max_age:
                    actions.append({"name": "archive_file", "arguments": {"path": p}})
                if self.files[p]["owner"] != self.owner:
                    actions.append({"name": "chown_file", "arguments": {"path": p, "owner": self.owner}})
            if reads + len(actions) <= MAX_CALLS or len(actions) <= 2:
                break
            fix = self.files[actions[-1]["arguments"]["path"]]  # make the last violator compliant
            fix["age"], fix["owner"] = min(fix["age"], self.max_age), self.owner
        self._changed = len({a["arguments"]["path"] for a in actions})
        self._plan = (
            [{"name": "read_file", "arguments": {"path": POLICY}},
             {"name": "list_dir", "arguments": {"path": ROOT}}]
            + [{"name": "list_dir", "arguments": {"path": d}} for d in self.dirs]
            + [{"name": "stat_file", "arguments": {"path": p}} for p in paths]
            + actions
        )
        self._answer = f"Audit complete: {self._changed} files changed ({len(actions)} actions)."
        user = (f"Audit every file under {ROOT} against our retention and ownership policy, which is "
                f"in {POLICY}. Read the policy first, list the directories, check each file with "
                f"stat_file, then apply the actions the policy requires and tell me how many files "
                f"you changed.")
        return Task(self.name, seed, SYSTEM, user, TOOLS, max_steps=len(self._plan) + 6)

    def _policy_text(self, rng: random.Random) -> str:
        sections = [f"# Data export policy (revision {rng.randint(3, 19)})", "",
                    "## Scope", st.paragraph(rng, 5), "",
                    "## Background", st.paragraph(rng, 7), "",
                    "## Retention",
                    st.paragraph(rng, 2) + f" Any file under {ROOT} whose age is more than "
                    f"{self.max_age} days must be archived with archive_file. " + st.paragraph(rng, 2), "",
                    "## Ownership",
                    st.paragraph(rng, 2) + f" Every file under {ROOT} must be owned by the service "
                    f"account {self.owner}; files owned by anyone else must be changed with "
                    f"chown_file to {self.owner}. " + st.paragraph(rng, 2), "",
                    "## Exceptions", st.paragraph(rng, 6), "",
                    "## Definitions", st.paragraph(rng, 5), "",
                    "## Contacts", ", ".join(st.person(rng) for _ in range(6)) + ".", "",
                    "## Change history"]
        sections += [f"- {st.date(rng, 2024)}: {st.sentence(rng)}" for _ in range(6)]
        return "\n".join(sections)

    def _call(self, name: str, arguments: dict) -> str:
        path = arguments["path"].rstrip("/") or "/"
        if name == "read_file":
            if path == POLICY:
                return self._policy
            return f"ERROR: {path}: no such file (or not a text file)"
        if name == "list_dir":
            if path == ROOT:
                entries = [f"drwxr-x---  {d}" for d in self.dirs]
            elif path in self.dirs:
                entries = [f"-rw-r-----  {p}  ({self.files[p]['size']} bytes)"
                           for p in self.files if p.startswith(path + "/")]
            else:
                return f"ERROR: {path}: no such directory"
            return "\n".join([f"Directory {path}", self._dir_notes[path]] + entries
                             + [f"{len(entries)} entries."])
        f = self.files.get(path)
        if f is None:
            return f"ERROR: {path}: no such file"
        if name == "stat_file":
            return "\n".join([f"File: {path}", f"Size: {f['size']} bytes", f"Mode: {f['mode']}",
                              f"Owner: {f['owner']}", f"Age: {f['age']} days",
                              f"Archived: {'yes' if path in self.archived else 'no'}", "Audit trail:"]
                             + f["trail"])
        if name == "archive_file":
            if path in self.archived:
                return f"{path} is already archived."
            self.archived.append(path)
            return f"Archived {path} to cold storage."
        old, f["owner"] = f["owner"], arguments["owner"]
        return f"Owner of {path} changed from {old} to {arguments['owner']}."

    def _mutating_tools(self) -> set:
        return {"archive_file", "chown_file"}

    def _answer_ok(self, answer: str) -> bool:
        return str(self._changed) in answer
