"""Suite "records": find a customer by reference code across paginated listings, then act on it.

Episode (11-15 tool calls, ~5-7k tokens with the SmolLM2 tokenizer):
  list_customers(page=1..p)  until the page that holds the reference code (p in 4..7 of 8 pages);
  get_customer(customer_id)  a long record whose open-order ids sit in the middle of a contact log;
  get_order(order_id)        for each open order (5-6), each output long;
  update_customer(customer_id, status)  the id was read ~10 steps earlier, the status in the prompt;
  final answer               the sum of the open orders' amounts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from asymagent.evals.suites import synthetic_text as st
from asymagent.evals.suites.environments import Environment, Task, function_tool

PAGES = 8  # listing pages in the world
PER_PAGE = 12  # rows per listing page (~35 tokens each)
STATUSES = ("on_hold", "review", "priority", "closed")

TOOLS = [
    function_tool("list_customers", "List customers, 12 per page.",
                  {"page": {"type": "integer", "description": "page number, from 1"}}),
    function_tool("get_customer", "Read one customer's full record.",
                  {"customer_id": {"type": "string", "description": "e.g. CUST-01234"}}),
    function_tool("get_order", "Read one order.",
                  {"order_id": {"type": "string", "description": "e.g. ORD-01234"}}),
    function_tool("update_customer", "Set a customer's account status.",
                  {"customer_id": {"type": "string"},
                   "status": {"type": "string", "enum": list(STATUSES)}}),
]

SYSTEM = ("You are a back-office assistant with access to the customer database tools. "
          "Work step by step: call one tool at a time, read its output carefully, and only "
          "give your final answer when the task is complete.")


@dataclass
class RecordsEnv(Environment):
    name: str = "records"
    customers: list = field(default_factory=list)  # rows: dict(id, name, city, ref, balance, status)
    target: dict = field(default_factory=dict)
    orders: dict = field(default_factory=dict)  # order_id -> dict(amount, items, ...)
    status: dict = field(default_factory=dict)  # customer_id -> current status

    def _build(self, rng: random.Random, seed: int) -> Task:
        ids = st.unique_codes(rng, "CUST", PAGES * PER_PAGE)
        refs = st.unique_codes_alnum(rng, "RF", len(ids), 5)
        self.customers = [
            {"id": cid, "name": st.person(rng), "city": rng.choice(st.CITIES), "ref": ref,
             "balance": st.amount(rng, 0, 9000), "status": rng.choice(("active", "active", "dormant"))}
            for cid, ref in zip(ids, refs)
        ]
        page = rng.randint(4, 7)  # >= 4 listing reads before the target is found
        self.target = self.customers[(page - 1) * PER_PAGE + rng.randrange(PER_PAGE)]
        self.status = {c["id"]: c["status"] for c in self.customers}
        open_ids = st.unique_codes(rng, "ORD", rng.randint(5, 6))
        closed_ids = st.unique_codes(rng, "ORX", 5)
        self.orders = {
            oid: {"amount": st.amount(rng), "items": rng.randint(1, 9), "date": st.date(rng),
                  "carrier": rng.choice(("DHL", "UPS", "PostNord", "GLS")),
                  "notes": [st.sentence(rng) for _ in range(8)]}
            for oid in open_ids
        }
        self._open_ids = open_ids
        self._closed_ids = closed_ids
        self._log = [f"{st.date(rng, 2025)} {st.sentence(rng)}" for _ in range(18)]
        self._record_notes = st.paragraph(rng, 4)
        new_status = rng.choice(STATUSES)
        total = round(sum(self.orders[o]["amount"] for o in open_ids), 2)
        self._total = f"{total:.2f}"
        self._plan = (
            [{"name": "list_customers", "arguments": {"page": p}} for p in range(1, page + 1)]
            + [{"name": "get_customer", "arguments": {"customer_id": self.target["id"]}}]
            + [{"name": "get_order", "arguments": {"order_id": o}} for o in open_ids]
            + [{"name": "update_customer",
                "arguments": {"customer_id": self.target["id"], "status": new_status}}]
        )
        self._answer = (f"Customer {self.target['id']} ({self.target['name']}) is now {new_status}. "
                        f"Their {len(open_ids)} open orders total {self._total}.")
        user = (f"An auditor flagged the account with reference code {self.target['ref']}. "
                f"Find that customer in the customer listing (it is paginated; start at page 1), "
                f"read the customer's record, look up every one of their open orders, then set the "
                f"customer's status to {new_status} and tell me the total amount of the open orders.")
        return Task(self.name, seed, SYSTEM, user, TOOLS, max_steps=len(self._plan) + 6)

    def _call(self, name: str, arguments: dict) -> str:
        if name == "list_customers":
            page = arguments["page"]
            if not 1 <= page <= PAGES:
                return f"ERROR: page {page} does not exist (pages 1-{PAGES})"
            rows = self.customers[(page - 1) * PER_PAGE: page * PER_PAGE]
            lines = [f"Customer listing, page {page} of {PAGES}",
                     "id | name | city | reference | balance | status"]
            lines += [f"{c['id']} | {c['name']} | {c['city']} | ref {c['ref']} | "
                      f"{c['balance']:.2f} EUR | {self.status[c['id']]}" for c in rows]
            lines.append(f"Call list_customers with page={page + 1} for more." if page < PAGES
                         else "This is the last page.")
            return "\n".join(lines)
        if name == "get_customer":
            cid = arguments["customer_id"]
            c = next((c for c in self.customers if c["id"] == cid), None)
            if c is None:
                return f"ERROR: no customer {cid}"
            if c is not self.target:
                return (f"Customer {c['id']}: {c['name']}, {c['city']}, ref {c['ref']}, "
                        f"status {self.status[cid]}. No open orders.")
            half = len(self._log) // 2
            return "\n".join(
                [f"Customer record {c['id']}", f"Name: {c['name']}", f"City: {c['city']}",
                 f"Reference: {c['ref']}", f"Balance: {c['balance']:.2f} EUR",
                 f"Status: {self.status[cid]}", "Notes: " + self._record_notes, "Contact log:"]
                + self._log[:half]
                + [f"Open orders: {', '.join(self._open_ids)}",
                   f"Closed orders (no action needed): {', '.join(self._closed_ids)}"]
                + self._log[half:]
            )
        if name == "get_order":
            oid = arguments["order_id"]
            if oid in self._closed_ids:
                return f"Order {oid}: closed and settled. Nothing to do."
            o = self.orders.get(oid)
            if o is None:
                return f"ERROR: no order {oid}"
            return "\n".join(
                [f"Order {oid}", f"Placed: {o['date']}",
                 f"Items: {o['items']}", f"Carrier: {o['carrier']}", "History:"]
                + o["notes"][:3] + [f"Amount due: {o['amount']:.2f} EUR"] + o["notes"][3:]
            )
        # update_customer
        cid = arguments["customer_id"]
        if cid not in self.status:
            return f"ERROR: no customer {cid}"
        old, self.status[cid] = self.status[cid], arguments["status"]
        return f"Customer {cid} status changed from {old} to {arguments['status']}."

    def _mutating_tools(self) -> set:
        return {"update_customer"}

    def _answer_ok(self, answer: str) -> bool:
        return self._total in answer.replace(",", "")
