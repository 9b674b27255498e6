"""Synthetic agent domains for drafter training: tools, records and multi-step episodes.

Each `Domain` describes one made-up business area (weather, flights, pods, ...) as a record
schema; `episode(domain, rng)` turns it into an OpenAI-style message list: a user request, JSON
tool calls, long tool outputs (tables, JSON records, logs, file listings) and final answers.
Breadth matters more than depth (docs/architecture.md §5: 72% in-domain vs 27% out-of-domain agreement
when trained on one domain), so the domains are many and the output formats vary per episode.

These domains are our own; they deliberately avoid the evaluation suites' environments
(records lookup, file-system audit, ticket triage), and `HELD_OUT_DOMAIN` is never trained on:
it is where held-out acceptance is measured.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

FIRST = ["Ana", "Ben", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hiro", "Ines", "Jonas", "Kemi",
         "Luca", "Maya", "Nils", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera",
         "Wei", "Yara", "Zoe"]
LAST = ["Alvarez", "Berg", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ivanova",
        "Jensen", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Patel", "Rossi",
        "Schmidt", "Tanaka", "Ulrich", "Vargas", "Weber", "Yilmaz", "Zhang"]
CITIES = ["Oslo", "Lisbon", "Nairobi", "Osaka", "Denver", "Lyon", "Porto", "Seoul", "Austin",
          "Krakow", "Quito", "Perth", "Tunis", "Ghent", "Bergen", "Hanoi", "Leeds", "Cusco",
          "Malmo", "Dakar", "Turin", "Fresno", "Tallinn", "Cebu"]
WORDS = ["amber", "river", "stone", "cedar", "north", "silver", "harbor", "maple", "quiet",
         "falcon", "summit", "copper", "meadow", "orbit", "delta", "ember", "willow", "granite"]


def field_value(spec: str, rng: random.Random):
    """One random field value from a compact spec string (e.g. "int:1:9", "choice:a|b")."""
    kind, _, arg = spec.partition(":")
    if kind == "int":
        lo, hi = map(int, arg.split(":"))
        return rng.randint(lo, hi)
    if kind == "float":
        lo, hi = map(float, arg.split(":"))
        return round(rng.uniform(lo, hi), 2)
    if kind == "money":
        lo, hi = map(int, arg.split(":"))
        return round(rng.uniform(lo, hi), 2)
    if kind == "choice":
        return rng.choice(arg.split("|"))
    if kind == "name":
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    if kind == "city":
        return rng.choice(CITIES)
    if kind == "date":
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == "time":
        return f"{rng.randint(6, 21):02d}:{rng.choice(['00', '15', '30', '45'])}"
    if kind == "datetime":
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
    if kind == "code":  # letters as "A", digits as "9", anything else literal
        return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") if c == "A" else
                       str(rng.randint(0, 9)) if c == "9" else c for c in arg)
    if kind == "hex":
        return "".join(rng.choice("0123456789abcdef") for _ in range(int(arg)))
    if kind == "words":
        return " ".join(rng.choice(WORDS) for _ in range(int(arg))).title()
    raise ValueError(f"unknown field spec {spec!r}")


@dataclass
class Domain:
    """One synthetic tool domain: an entity with typed fields plus the events its logs report."""

    name: str
    entity: str           # singular, snake_case (used in tool names)
    plural: str
    id_field: str
    fields: dict[str, str]  # field -> generator spec (first entry is the id)
    events: list[str]       # log event templates; may use {id} and any field
    assistant_role: str     # what the system prompt says the assistant is
    numeric: list[str] = field(default_factory=list)  # fields a user may rank by

    def record(self, rng: random.Random) -> dict:
        return {k: field_value(v, rng) for k, v in self.fields.items()}


D = Domain
DOMAINS: list[Domain] = [
    D("weather", "forecast", "forecasts", "station", {"station": "code:WX-999", "city": "city", "date": "date", "high_c": "int:-8:38", "low_c": "int:-15:25", "condition": "choice:sunny|cloudy|rain|snow|storm|fog|drizzle", "wind_kph": "int:0:90", "humidity_pct": "int:10:100"}, ["reading updated for {city}", "wind gust {wind_kph} kph recorded", "sensor recalibrated", "forecast model rerun"], "a weather assistant", ["high_c", "wind_kph", "humidity_pct"]),
    D("flights", "flight", "flights", "flight_no", {"flight_no": "code:AA999", "origin": "city", "destination": "city", "departs": "datetime", "price_usd": "money:59:1400", "seats_left": "int:0:180", "status": "choice:on time|delayed|cancelled|boarding|landed"}, ["gate changed to B{seats_left}", "status set to {status}", "crew assigned", "fare class updated"], "a travel booking agent", ["price_usd", "seats_left"]),
    D("shop_orders", "order", "orders", "order_id", {"order_id": "code:ORD-99999", "customer": "name", "item": "choice:desk lamp|usb-c hub|office chair|water bottle|backpack|monitor arm|keyboard|standing desk", "quantity": "int:1:12", "total_eur": "money:8:2400", "status": "choice:placed|packed|shipped|refunded|on hold", "placed_on": "date"}, ["payment captured", "status changed to {status}", "invoice emailed to {customer}", "address verified"], "an e-commerce operations assistant", ["total_eur", "quantity"]),
    D("stocks", "quote", "quotes", "ticker", {"ticker": "code:AAAA", "company": "words:2", "price": "money:3:950", "change_pct": "float:-9:9", "volume": "int:1000:9000000", "sector": "choice:energy|retail|software|biotech|banking|transport"}, ["price alert triggered", "dividend announced", "volume spike detected", "analyst rating changed"], "a market data assistant", ["price", "change_pct", "volume"]),
    D("recipes", "recipe", "recipes", "recipe_id", {"recipe_id": "code:R-999", "title": "choice:lentil soup|shakshuka|pad thai|mushroom risotto|bean chili|fish tacos|falafel wrap|ramen", "cuisine": "choice:italian|thai|mexican|levantine|japanese|indian", "prep_min": "int:10:120", "calories": "int:180:1200", "servings": "int:1:8", "vegetarian": "choice:true|false"}, ["rating added", "ingredient list edited", "photo uploaded", "nutrition recomputed"], "a cooking assistant", ["prep_min", "calories"]),
    D("calendar", "meeting", "meetings", "meeting_id", {"meeting_id": "code:MTG-9999", "title": "choice:budget review|design sync|hiring panel|quarterly planning|vendor call|retro", "organizer": "name", "date": "date", "start": "time", "duration_min": "int:15:120", "room": "choice:Atlas|Borealis|Cobalt|Dune|Everest"}, ["invite sent to {organizer}", "room booked", "agenda attached", "rescheduled"], "a scheduling assistant", ["duration_min"]),
    D("cluster", "pod", "pods", "pod", {"pod": "code:api-9a9a9", "namespace": "choice:prod|staging|batch|monitoring", "status": "choice:Running|CrashLoopBackOff|Pending|Completed|OOMKilled", "restarts": "int:0:40", "cpu_millicores": "int:5:4000", "memory_mib": "int:32:8192", "node": "code:node-99"}, ["container restarted (exit code 137)", "liveness probe failed", "image pulled", "scheduled on {node}", "OOM warning at {memory_mib}Mi"], "a site reliability assistant", ["restarts", "cpu_millicores", "memory_mib"]),
    D("iot", "sensor", "sensors", "sensor_id", {"sensor_id": "code:S-9999", "location": "choice:boiler room|cold store|roof|lab 2|warehouse east|server room", "temperature_c": "float:-20:90", "battery_pct": "int:0:100", "firmware": "code:v9.9.9", "last_seen": "datetime"}, ["heartbeat received", "threshold exceeded at {temperature_c} C", "battery low", "firmware updated to {firmware}"], "a facilities monitoring assistant", ["temperature_c", "battery_pct"]),
    D("library", "book", "books", "isbn", {"isbn": "code:978-9-99-999999-9", "title": "words:3", "author": "name", "year": "int:1890:2026", "copies_available": "int:0:9", "branch": "city"}, ["checked out", "returned late", "hold placed", "moved to {branch} branch"], "a library catalogue assistant", ["year", "copies_available"]),
    D("sports", "team", "teams", "team", {"team": "words:2", "played": "int:10:38", "won": "int:0:30", "lost": "int:0:30", "points": "int:0:90", "streak": "choice:W3|L2|W1|D1|L4|W5", "coach": "name"}, ["match result recorded", "player transferred", "coach statement published", "points adjusted"], "a sports statistics assistant", ["points", "won"]),
    D("hotels", "hotel", "hotels", "hotel_id", {"hotel_id": "code:H-9999", "name": "words:2", "city": "city", "nightly_rate": "money:40:900", "rating": "float:2:5", "rooms_free": "int:0:60", "breakfast": "choice:included|extra|none"}, ["booking confirmed", "rate changed to {nightly_rate}", "review posted", "room block released"], "a hotel booking assistant", ["nightly_rate", "rating", "rooms_free"]),
    D("git", "commit", "commits", "sha", {"sha": "hex:7", "author": "name", "date": "date", "message": "choice:fix race in cache eviction|add retry to uploader|bump dependencies|refactor parser|speed up tokenizer|remove dead code", "files_changed": "int:1:60", "branch": "choice:main|release-2.1|dev|hotfix"}, ["pushed to {branch}", "CI passed", "review requested", "cherry-picked"], "a code repository assistant", ["files_changed"]),
    D("analytics", "region_report", "region_reports", "region", {"region": "choice:north|south|east|west|central|coastal", "month": "choice:2026-01|2026-02|2026-03|2026-04|2026-05", "revenue_k": "money:40:2000", "orders": "int:100:90000", "avg_basket": "money:12:240", "returns_pct": "float:0:15"}, ["report regenerated", "late data merged", "anomaly flagged", "export finished"], "a business analytics assistant", ["revenue_k", "orders", "returns_pct"]),
    D("restaurants", "reservation", "reservations", "reservation_id", {"reservation_id": "code:RES-9999", "guest": "name", "restaurant": "words:2", "party_size": "int:1:12", "time": "time", "date": "date", "status": "choice:confirmed|waitlisted|seated|cancelled"}, ["table assigned", "guest notified", "deposit taken", "status set to {status}"], "a restaurant reservations assistant", ["party_size"]),
    D("ci", "build", "builds", "build_id", {"build_id": "int:1000:99999", "pipeline": "choice:unit-tests|integration|docker-image|docs|nightly", "status": "choice:passed|failed|running|cancelled", "duration_s": "int:20:5400", "commit": "hex:7", "failed_tests": "int:0:25"}, ["step checkout done", "step test finished with {failed_tests} failures", "artifact uploaded", "cache restored"], "a CI/CD assistant", ["duration_s", "failed_tests"]),
    D("music", "track", "tracks", "track_id", {"track_id": "code:T-99999", "title": "words:2", "artist": "name", "album": "words:2", "duration_s": "int:90:540", "plays": "int:0:5000000", "genre": "choice:jazz|techno|folk|hip hop|classical|indie"}, ["added to playlist", "lyrics synced", "play count updated", "marked explicit"], "a music library assistant", ["plays", "duration_s"]),
    D("energy", "meter", "meters", "meter_id", {"meter_id": "code:M-99999", "site": "city", "kwh_today": "float:0:900", "peak_kw": "float:0:120", "tariff": "choice:day|night|flex|solar", "alarm": "choice:none|overvoltage|tamper|comm loss"}, ["reading ingested", "alarm {alarm} raised", "tariff switched to {tariff}", "meter rebooted"], "an energy grid assistant", ["kwh_today", "peak_kw"]),
    D("courses", "course", "courses", "course_code", {"course_code": "code:AAA-999", "title": "words:3", "instructor": "name", "enrolled": "int:0:400", "capacity": "int:20:400", "term": "choice:fall|spring|summer", "credits": "int:1:6"}, ["enrolment opened", "syllabus updated", "waitlist promoted", "room changed"], "a university registrar assistant", ["enrolled", "credits"]),
    # Held out: never trained on, used only to measure acceptance on an unseen domain.
    D("parcels", "shipment", "shipments", "tracking_no", {"tracking_no": "code:1Z999A99999", "carrier": "choice:DHL|UPS|PostNord|FedEx|La Poste", "origin": "city", "destination": "city", "status": "choice:in transit|delivered|exception|out for delivery|label created", "eta": "date", "weight_kg": "float:0.1:40"}, ["scanned at {origin} hub", "departed facility", "customs cleared", "delivery attempted", "status {status}"], "a logistics assistant", ["weight_kg"]),
]
HELD_OUT_DOMAIN = "parcels"
TRAIN_DOMAINS = [d for d in DOMAINS if d.name != HELD_OUT_DOMAIN]


def domain_by_name(name: str) -> Domain:
    for d in DOMAINS:
        if d.name == name:
            return d
    raise ValueError(f"unknown domain {name!r}; known: {[d.name for d in DOMAINS]}")


def tools_for(d: Domain) -> list[dict]:
    """OpenAI-style function tools for a domain (search, get, history, update, list exports)."""
    def fn(name, desc, props, required):
        return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object", "properties": props, "required": required}}}
    filt = {"field": {"type": "string", "enum": list(d.fields)[1:]}, "value": {"type": "string"}}
    return [
        fn(f"search_{d.plural}", f"Search {d.plural} by a field value.", dict(filt, limit={"type": "integer"}), ["field", "value"]),
        fn(f"get_{d.entity}", f"Get one {d.entity} by {d.id_field}.", {d.id_field: {"type": "string"}}, [d.id_field]),
        fn(f"{d.entity}_history", f"Event log of one {d.entity}.", {d.id_field: {"type": "string"}, "limit": {"type": "integer"}}, [d.id_field]),
        fn(f"update_{d.entity}", f"Change one field of a {d.entity}.", {d.id_field: {"type": "string"}, "field": {"type": "string"}, "value": {"type": "string"}}, [d.id_field, "field", "value"]),
        fn(f"list_{d.entity}_exports", f"List exported {d.entity} report files.", {"folder": {"type": "string"}}, []),
    ]


def system_prompt(d: Domain, rng: random.Random) -> str:
    """Tools listed one JSON schema per line (docs/architecture.md chat format for SmolLM2)."""
    intro = rng.choice([f"You are {d.assistant_role}.", f"You are {d.assistant_role} with access to tools.",
                        f"You are a helpful assistant working as {d.assistant_role}."])
    lines = [intro, "You can call these tools:"]
    lines += [json.dumps(t["function"]) for t in tools_for(d)]
    lines.append('To call a tool, reply with one JSON object {"name": ..., "arguments": {...}} per line. '
                 "Otherwise answer the user directly.")
    return "\n".join(lines)


def _table(rows: list[dict], rng: random.Random) -> str:
    cols = list(rows[0])
    style = rng.choice(["markdown", "csv", "aligned", "tsv"])
    cells = [[str(r[c]) for c in cols] for r in rows]
    if style == "csv":
        return "\n".join([",".join(cols)] + [",".join(c) for c in cells])
    if style == "tsv":
        return "\n".join(["\t".join(cols)] + ["\t".join(c) for c in cells])
    if style == "markdown":
        return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                         + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(x) for x in col) for col in zip(cols, *cells)]
    fmt = lambda row: "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cols)] + [fmt(c) for c in cells])


def _call(name: str, args: dict) -> dict:
    return {"role": "assistant", "content": json.dumps({"name": name, "arguments": args})}


def _describe(d: Domain, rec: dict, rng: random.Random, k: int = 3) -> str:
    keys = rng.sample(list(rec)[1:], k=min(k, len(rec) - 1))
    return ", ".join(f"{key.replace('_', ' ')} {rec[key]}" for key in keys)


def episode(d: Domain, rng: random.Random) -> list[dict]:
    """One multi-step agent episode in `d`: system, user, tool calls/outputs, final answers."""
    records = [d.record(rng) for _ in range(rng.randint(4, 18))]
    msgs = [{"role": "system", "content": system_prompt(d, rng)}]
    key = rng.choice(list(d.fields)[1:])
    value = str(records[0][key])
    for r in records[1:]:
        if rng.random() < 0.4:
            r[key] = records[0][key]
    hits = [r for r in records if str(r[key]) == value]
    rank = rng.choice(d.numeric) if d.numeric else None
    ask = rng.choice([
        f"Find {d.plural} with {key.replace('_', ' ')} {value}.",
        f"Which {d.plural} have {key} = {value}? " + (f"I need the one with the highest {rank}." if rank else ""),
        f"Can you look up all {d.plural} where {key} is {value} and summarise them?",
        f"Show me {d.plural} matching {key} {value}, then check the history of the first one.",
    ])
    msgs.append({"role": "user", "content": ask})
    msgs.append(_call(f"search_{d.plural}", {"field": key, "value": value, "limit": rng.choice([10, 20, 50])}))
    msgs.append({"role": "tool", "content": _table(hits, rng) if rng.random() < 0.7 else json.dumps(hits, indent=rng.choice([None, 2]))})
    best = max(hits, key=lambda r: r[rank]) if rank else hits[0]
    bid = best[d.id_field]
    if rng.random() < 0.8:
        msgs.append(_call(f"get_{d.entity}", {d.id_field: str(bid)}))
        msgs.append({"role": "tool", "content": json.dumps(best, indent=rng.choice([None, 2]))})
    if rng.random() < 0.6:
        n = rng.randint(4, 25)
        msgs.append(_call(f"{d.entity}_history", {d.id_field: str(bid), "limit": n}))
        lines = []
        for _ in range(n):
            ev = rng.choice(d.events).format(id=bid, **best)
            lines.append(f"{field_value('datetime', rng)} {rng.choice(['INFO', 'INFO', 'WARN', 'ERROR', 'DEBUG'])} {d.entity} {bid}: {ev}")
        msgs.append({"role": "tool", "content": "\n".join(sorted(lines))})
    summary = rng.choice([
        f"I found {len(hits)} {d.plural} with {key.replace('_', ' ')} {value}. ",
        f"There are {len(hits)} matching {d.plural}. ",
        f"The search returned {len(hits)} result{'s' if len(hits) != 1 else ''}. ",
    ])
    if rank:
        summary += f"The one with the highest {rank.replace('_', ' ')} is {bid} ({rank} {best[rank]}). "
    summary += f"{d.entity.replace('_', ' ').capitalize()} {bid} has {_describe(d, best, rng)}."
    msgs.append({"role": "assistant", "content": summary})
    if rng.random() < 0.5:  # follow-up turn: an update, or a listing of exports
        if rng.random() < 0.6:
            fld = rng.choice(list(d.fields)[1:])
            new = str(d.record(rng)[fld])
            msgs.append({"role": "user", "content": rng.choice([f"Please set {fld} of {bid} to {new}.", f"Update {bid}: {fld} should be {new}."])})
            msgs.append(_call(f"update_{d.entity}", {d.id_field: str(bid), "field": fld, "value": new}))
            msgs.append({"role": "tool", "content": json.dumps({"ok": True, d.id_field: bid, "updated": {fld: new}, "previous": {fld: best[fld]}})})
            msgs.append({"role": "assistant", "content": f"Done. {bid} now has {fld.replace('_', ' ')} {new} (it was {best[fld]})."})
        else:
            folder = rng.choice(["exports", f"reports/{field_value('date', rng)[:7]}", "archive"])
            msgs.append({"role": "user", "content": f"What {d.entity} exports do we have in {folder}?"})
            msgs.append(_call(f"list_{d.entity}_exports", {"folder": folder}))
            files = [f"{folder}/{d.plural}_{field_value('date', rng)}_{rng.choice(WORDS)}.{rng.choice(['csv', 'json', 'parquet', 'xlsx'])}  {rng.randint(1, 900)}.{rng.randint(0, 9)} KB" for _ in range(rng.randint(3, 14))]
            msgs.append({"role": "tool", "content": "\n".join(files)})
            msgs.append({"role": "assistant", "content": f"There are {len(files)} files in {folder}; the first is {files[0].split()[0]}."})
    return msgs
