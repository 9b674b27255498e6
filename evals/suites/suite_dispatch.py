"""Suite "dispatch" (held out, test seeds only): book each order with the partner a playbook names for its area.

An unseen-domain workload whose decisive fact has no digits and shares no word with the request:
the order names only its city; the playbook says which area covers that city and, in another
section, which hand-over partner serves that area. The row "area -> partner" that each booking
needs holds two invented words that occur nowhere else in the episode (not in the request, not in
the tool schemas, not in the order), so neither a digit rule nor a shared-word rule can find it.

Episode (15-17 tool calls):
  get_playbook()                long; buried in it: which area covers which cities, and the
                                area -> partner table (both random per seed);
  list_orders(page=1), (page=2) the open orders, two pages;
  get_order(order_id)           for each order (6-7), with its address, items and notes;
  then, right after reading it:
    book_shipment(order_id, partner)  the partner of the area that covers the order's city;
  final answer                  how many orders were booked, and with which partners.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from asymagent.evals.suites import synthetic_text as st
from asymagent.evals.suites.environments import Environment, Task, function_tool

AREAS = ("Fjordmark", "Dunewold", "Ashvale", "Brackenmoor", "Saltmere", "Corrieholm")
PARTNERS = ("Larkspur", "Thistledown", "Marigold", "Bramblewick", "Juniper", "Foxglove", "Hollyhock",
            "Wintergreen")
STREETS = ("Harbour Street", "Mill Lane", "Station Road", "Market Square", "Canal Walk", "Orchard Row")
GOODS = ("desk lamp", "usb hub", "office chair", "water bottle", "backpack", "monitor arm", "keyboard")
PAGE = 4  # orders per listing page

TOOLS = [
    function_tool("get_playbook", "Read the dispatch playbook.", {}),
    function_tool("list_orders", "List open orders waiting for dispatch.",
                  {"page": {"type": "integer", "description": "page number, from 1"}}),
    function_tool("get_order", "Read one order: address, items, notes.",
                  {"order_id": {"type": "string", "description": "e.g. ORD-12345"}}),
    function_tool("book_shipment", "Hand an order over for delivery.",
                  {"order_id": {"type": "string"},
                   "partner": {"type": "string", "description": "name of the hand-over partner"}}),
]

SYSTEM = ("You are the warehouse dispatch assistant. Use the tools, one call at a time. Follow the "
          "playbook exactly and summarise what you did at the end.")


@dataclass
class DispatchEnv(Environment):
    name: str = "dispatch"
    orders: list = field(default_factory=list)  # dict(id, city, street, placed, by, items, notes)
    area_of: dict = field(default_factory=dict)  # city -> area (per seed)
    partner_of: dict = field(default_factory=dict)  # area -> partner (per seed)
    booked: dict = field(default_factory=dict)  # order id -> partner

    def _build(self, rng: random.Random, seed: int) -> Task:
        cities = list(st.CITIES)
        rng.shuffle(cities)
        self.area_of = {c: AREAS[i // 3] for i, c in enumerate(cities[: 3 * len(AREAS)])}
        self.partner_of = dict(zip(AREAS, rng.sample(PARTNERS, len(AREAS))))
        self.booked = {}
        ids = st.unique_codes(rng, "ORD", rng.randint(6, 7))
        self.orders = [{"id": oid, "city": rng.choice(list(self.area_of)), "placed": st.date(rng),
                        "street": f"{rng.randint(1, 180)} {rng.choice(STREETS)}", "by": st.person(rng),
                        "items": [(rng.randint(1, 9), rng.choice(GOODS)) for _ in range(rng.randint(1, 3))],
                        "notes": [f"{st.person(rng)}: {st.sentence(rng)}" for _ in range(17)]} for oid in ids]
        self._playbook = self._playbook_text(rng)
        self._plan = [{"name": "get_playbook", "arguments": {}},
                      {"name": "list_orders", "arguments": {"page": 1}},
                      {"name": "list_orders", "arguments": {"page": 2}}]
        for o in self.orders:
            self._plan += [{"name": "get_order", "arguments": {"order_id": o["id"]}},
                           {"name": "book_shipment", "arguments": {"order_id": o["id"],
                                                                   "partner": self.needed_partner(o["id"])}}]
        counts: dict = {}
        for o in self.orders:
            counts[self.needed_partner(o["id"])] = counts.get(self.needed_partner(o["id"]), 0) + 1
        self._booked_n = len(self.orders)
        self._answer = (f"Dispatch done: {len(self.orders)} orders booked ("
                        + ", ".join(f"{n} with {p}" for p, n in counts.items()) + ").")
        user = ("Please dispatch today's open orders. Read the playbook first, list the open orders "
                "(two pages), then read each order in turn and book it with whoever the playbook "
                "says delivers to the place it ships to. Tell me how many you booked.")
        return Task(self.name, seed, SYSTEM, user, TOOLS, max_steps=len(self._plan) + 6)

    def needed_partner(self, order_id: str) -> str:
        """The partner the playbook assigns to the area covering this order's city."""
        return self.partner_of[self.area_of[next(o for o in self.orders if o["id"] == order_id)["city"]]]

    def partner_row(self, area: str) -> str:
        """The playbook line that holds the area -> partner fact."""
        return f"   {area} -> {self.partner_of[area]}"

    def _playbook_text(self, rng: random.Random) -> str:
        covers: dict = {}
        for city, area in self.area_of.items():
            covers.setdefault(area, []).append(city)
        lines = ["Warehouse dispatch playbook", "", "1. Purpose", st.paragraph(rng, 4), "",
                 "2. Service areas (which cities each area covers)"]
        lines += [f"   {a} covers {', '.join(cs[:-1])} and {cs[-1]}." for a, cs in covers.items()]
        lines += ["", "3. Packing and labels", st.paragraph(rng, 6), "",
                  "4. Hand-over table (area -> partner)"]
        lines += [self.partner_row(a) for a in AREAS]
        lines += ["", "5. Cut-off times", f"   Orders placed before {rng.randint(11, 15)}:00 leave the "
                  "same day; later orders leave the next working day.", "",
                  "6. Customer communication", st.paragraph(rng, 8), "", "7. Revision log"]
        lines += [f"   {st.date(rng, 2025)} {st.person(rng)}: {st.sentence(rng)}" for _ in range(5)]
        return "\n".join(lines)

    def _order(self, oid: str) -> dict | None:
        return next((o for o in self.orders if o["id"] == oid), None)

    def _call(self, name: str, arguments: dict) -> str:
        if name == "get_playbook":
            return self._playbook
        if name == "list_orders":
            page = arguments["page"]
            if page not in (1, 2):
                return f"ERROR: page {page} does not exist (pages 1-2)"
            rows = self.orders[:PAGE] if page == 1 else self.orders[PAGE:]
            out = [f"Open orders, page {page} of 2"]
            out += [f"{o['id']} | placed {o['placed']} by {o['by']} | {sum(n for n, _ in o['items'])} items"
                    for o in rows]
            return "\n".join(out + (["Call list_orders with page=2 for more."] if page == 1 else ["End of list."]))
        o = self._order(arguments["order_id"])
        if o is None:
            return f"ERROR: no order {arguments['order_id']}"
        if name == "get_order":
            return "\n".join([f"Order {o['id']}", f"Placed {o['placed']} by {o['by']}",
                              f"Ship to: {o['street']}, {o['city']}", "Items:"]
                             + [f"   {n} x {g}" for n, g in o["items"]] + ["Notes:"] + o["notes"])
        self.booked[o["id"]] = arguments["partner"]
        return f"{o['id']} handed over to {arguments['partner']}."

    def _mutating_tools(self) -> set:
        return {"book_shipment"}

    def _answer_ok(self, answer: str) -> bool:
        return str(self._booked_n) in answer
