"""Suite "tickets": triage a support queue using a handbook read first and cross-references.

Episode (15-17 tool calls, ~5-7k tokens with the SmolLM2 tokenizer):
  get_handbook()                 long; buried in it: the component -> team routing table (random
                                 per seed, so it cannot be guessed) and the severity -> priority map;
  list_tickets(page=1), (page=2) the open queue, two pages;
  get_ticket(ticket_id)          for each open ticket (6-7), each a long thread with comments;
  then, per ticket right after reading it:
    mark_duplicate(ticket_id, duplicate_of)  when the thread says it repeats an earlier ticket, or
    assign_ticket(ticket_id, team, priority) the team from the handbook table for the ticket's
                                             component, the priority from its severity;
  final answer                   how many tickets were assigned and how many were duplicates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from asymagent.evals.suites import synthetic_text as st
from asymagent.evals.suites.environments import Environment, Task, function_tool

COMPONENTS = ("billing-api", "auth-service", "search-index", "mobile-app", "data-pipeline",
              "email-gateway", "reporting-ui", "payments-core")
TEAMS = ("Falcon", "Heron", "Kestrel", "Osprey", "Plover", "Raven", "Swift", "Wren")
SEVERITIES = ("blocker", "major", "minor", "cosmetic")
PRIORITIES = ("P1", "P2", "P3", "P4")
PAGE = 4  # tickets per listing page (open tickets are split over pages 1-2)

TOOLS = [
    function_tool("get_handbook", "Read the support triage handbook.", {}),
    function_tool("list_tickets", "List open tickets in the queue.",
                  {"page": {"type": "integer", "description": "page number, from 1"}}),
    function_tool("get_ticket", "Read one ticket with its comment thread.",
                  {"ticket_id": {"type": "string", "description": "e.g. TCK-1234"}}),
    function_tool("assign_ticket", "Route a ticket to a team with a priority.",
                  {"ticket_id": {"type": "string"}, "team": {"type": "string", "enum": list(TEAMS)},
                   "priority": {"type": "string", "enum": list(PRIORITIES)}}),
    function_tool("mark_duplicate", "Close a ticket as a duplicate of another.",
                  {"ticket_id": {"type": "string"}, "duplicate_of": {"type": "string"}}),
]

SYSTEM = ("You are the support triage assistant. Use the tools, one call at a time. Follow the "
          "handbook's routing and priority rules exactly and summarise what you did at the end.")


@dataclass
class TicketsEnv(Environment):
    name: str = "tickets"
    tickets: list = field(default_factory=list)  # dict(id, title, component, severity, dup_of, thread)
    routing: dict = field(default_factory=dict)  # component -> team (per seed)
    priority_of: dict = field(default_factory=dict)  # severity -> priority (per seed)

    def _build(self, rng: random.Random, seed: int) -> Task:
        teams = list(TEAMS)
        rng.shuffle(teams)
        self.routing = dict(zip(COMPONENTS, teams))
        prios = list(PRIORITIES)
        if rng.random() < 0.5:  # some teams treat "major" as P1 too: the handbook says which
            prios = ["P1", "P1", "P3", "P4"]
        self.priority_of = dict(zip(SEVERITIES, prios))
        ids = st.unique_codes(rng, "TCK", rng.randint(6, 7), digits=4)
        self.tickets = []
        for i, tid in enumerate(ids):
            dup_of = ids[rng.randrange(i)] if i >= 2 and rng.random() < 0.3 else None
            comp = rng.choice(COMPONENTS)
            self.tickets.append({
                "id": tid, "component": comp, "severity": rng.choice(SEVERITIES), "dup_of": dup_of,
                "title": f"{comp}: {rng.choice(st.OBJECTS)} {rng.choice(('fails', 'is slow', 'errors', 'is wrong'))}",
                "reporter": st.person(rng), "opened": st.date(rng),
                "thread": [f"{st.person(rng)}: {st.paragraph(rng, 3)}" for _ in range(8)],
            })
        self.resolution: dict = {}
        self._handbook = self._handbook_text(rng)
        self._plan = [{"name": "get_handbook", "arguments": {}},
                      {"name": "list_tickets", "arguments": {"page": 1}},
                      {"name": "list_tickets", "arguments": {"page": 2}}]
        for t in self.tickets:
            self._plan.append({"name": "get_ticket", "arguments": {"ticket_id": t["id"]}})
            if t["dup_of"]:
                self._plan.append({"name": "mark_duplicate",
                                   "arguments": {"ticket_id": t["id"], "duplicate_of": t["dup_of"]}})
            else:
                self._plan.append({"name": "assign_ticket", "arguments": {
                    "ticket_id": t["id"], "team": self.routing[t["component"]],
                    "priority": self.priority_of[t["severity"]]}})
        dups = sum(1 for t in self.tickets if t["dup_of"])
        self._counts = (len(self.tickets) - dups, dups)
        self._answer = (f"Triage done: {self._counts[0]} tickets assigned, "
                        f"{self._counts[1]} closed as duplicates.")
        user = ("Please triage the open support queue. Read the handbook first, list the open "
                "tickets (two pages), then read each ticket in order and either close it as a "
                "duplicate (if the thread says it repeats an earlier ticket) or assign it to the "
                "right team with the right priority. Tell me how many you assigned and how many "
                "were duplicates.")
        return Task(self.name, seed, SYSTEM, user, TOOLS, max_steps=len(self._plan) + 6)

    def _handbook_text(self, rng: random.Random) -> str:
        lines = ["Support triage handbook", "", "1. Purpose", st.paragraph(rng, 4), "",
                 "2. Working hours and escalation", st.paragraph(rng, 6), "",
                 "3. Routing table (component -> owning team)"]
        lines += [f"   {c} -> team {t}" for c, t in self.routing.items()]
        lines += ["", "4. Priority from reported severity"]
        lines += [f"   severity {s} -> priority {p}" for s, p in self.priority_of.items()]
        lines += ["", "5. Duplicates", "   A ticket whose thread says it repeats an earlier ticket is "
                  "closed with mark_duplicate pointing at that earlier ticket; it is not assigned.",
                  "", "6. Tone and templates", st.paragraph(rng, 8), "",
                  "7. Customer communication", st.paragraph(rng, 8), "", "8. Revision log"]
        lines += [f"   {st.date(rng, 2025)} {st.person(rng)}: {st.sentence(rng)}" for _ in range(5)]
        return "\n".join(lines)

    def _ticket(self, tid: str) -> dict | None:
        return next((t for t in self.tickets if t["id"] == tid), None)

    def _call(self, name: str, arguments: dict) -> str:
        if name == "get_handbook":
            return self._handbook
        if name == "list_tickets":
            page = arguments["page"]
            if page not in (1, 2):
                return f"ERROR: page {page} does not exist (pages 1-2)"
            rows = self.tickets[:PAGE] if page == 1 else self.tickets[PAGE:]
            out = [f"Open tickets, page {page} of 2"]
            out += [f"{t['id']} | opened {t['opened']} by {t['reporter']} | {t['title']}" for t in rows]
            return "\n".join(out + ([f"Call list_tickets with page=2 for more."] if page == 1 else ["End of queue."]))
        t = self._ticket(arguments["ticket_id"])
        if t is None:
            return f"ERROR: no ticket {arguments['ticket_id']}"
        if name == "get_ticket":
            thread = list(t["thread"])
            if t["dup_of"]:
                thread.insert(2, f"{st.FIRST[len(t['id']) % len(st.FIRST)]} (support): this repeats "
                                 f"the earlier ticket {t['dup_of']}, same root cause.")
            return "\n".join([f"Ticket {t['id']}: {t['title']}", f"Component: {t['component']}",
                              f"Reported severity: {t['severity']}", f"Reporter: {t['reporter']}",
                              "Thread:"] + thread)
        if name == "mark_duplicate":
            if self._ticket(arguments["duplicate_of"]) is None:
                return f"ERROR: no ticket {arguments['duplicate_of']}"
            self.resolution[t["id"]] = ("duplicate", arguments["duplicate_of"])
            return f"{t['id']} closed as a duplicate of {arguments['duplicate_of']}."
        self.resolution[t["id"]] = ("assigned", arguments["team"], arguments["priority"])
        return f"{t['id']} assigned to team {arguments['team']} with priority {arguments['priority']}."

    def _mutating_tools(self) -> set:
        return {"assign_ticket", "mark_duplicate"}

    def _answer_ok(self, answer: str) -> bool:
        return str(self._counts[0]) in answer and str(self._counts[1]) in answer
