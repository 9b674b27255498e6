"""Long-context agent episodes: long tool outputs whose middle holds the facts the next turns copy.

The fusion objective (training/fusion.py) needs conversations where the compressed view loses
something the answer depends on: the default view keeps the head and tail of every long tool
output and elides the middle. These episodes put the record the user asks about, the log line
that matters, or the best-ranked item at a random place in a long listing (25-90 records, or a
30-80 line log), in one of several shapes (JSON list, indented JSON, markdown/CSV/aligned
tables, key=value logs, prose), and the oracle's next turns copy from there: the id of the
matching record in a `get_` call, values in the final answer, the timestamp of an event.

Messages are OpenAI-shaped (assistant `tool_calls`, `tool` messages with `tool_call_id`), so
they render through `ContextViews` exactly as `Engine.chat` renders a real conversation.
Every episode is a deterministic function of (domain, seed).
"""

from __future__ import annotations

import json
import random

from asymagent.training.domains import Domain, field_value, tools_for

SHAPES = ("json", "json_indent", "markdown", "csv", "aligned", "kv_log", "prose")


def list_tool(d: Domain) -> dict:
    """The paginated listing tool these episodes add to the domain's tools."""
    return {"type": "function", "function": {
        "name": f"list_{d.plural}", "description": f"List {d.plural}, one page at a time.",
        "parameters": {"type": "object", "properties": {"page": {"type": "integer"}},
                       "required": ["page"]}}}


def episode_tools(d: Domain) -> list[dict]:
    return [list_tool(d)] + tools_for(d)


def render_records(records: list[dict], shape: str, rng: random.Random) -> str:
    """A listing of `records` in one of SHAPES."""
    cols = list(records[0])
    cells = [[str(r[c]) for c in cols] for r in records]
    if shape == "json":
        return json.dumps(records)
    if shape == "json_indent":
        return json.dumps(records, indent=2)
    if shape == "csv":
        return "\n".join([",".join(cols)] + [",".join(c) for c in cells])
    if shape == "markdown":
        return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                         + ["| " + " | ".join(c) + " |" for c in cells])
    if shape == "aligned":
        widths = [max(len(x) for x in col) for col in zip(cols, *cells)]
        return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip()
                         for row in [cols] + cells)
    if shape == "kv_log":
        return "\n".join(" ".join(f"{c}={v}" for c, v in zip(cols, row)) for row in cells)
    if shape == "prose":
        return "\n".join(f"{i + 1}. " + ", ".join(f"{c.replace('_', ' ')} {v}" for c, v in zip(cols, row)) + "."
                         for i, row in enumerate(cells))
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def _unique_records(d: Domain, rng: random.Random, n: int) -> list[dict]:
    """`n` records with distinct ids; a domain with few possible ids (e.g. six regions) gets
    numbered ones ("north-3"), so that a lookup by id names exactly one record."""
    out, ids = [], set()
    for attempt in range(20 * n):
        if len(out) == n:
            break
        r = d.record(rng)
        key = str(r[d.id_field])
        if attempt >= 10 * n or key in ids:
            if attempt < 10 * n:
                continue
            r[d.id_field] = key = f"{key}-{len(out) + 1}"
        ids.add(key)
        out.append(r)
    return out


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _result(call_id: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _log(d: Domain, rec: dict, rng: random.Random, n: int) -> tuple[str, str, str]:
    """A log of `n` lines for `rec` with exactly one ERROR, placed in the middle half."""
    rid = rec[d.id_field]
    stamps = sorted(field_value("datetime", rng) for _ in range(n))
    err_at = rng.randint(n // 4, max(n // 4, 3 * n // 4))
    lines, err = [], None
    for i, ts in enumerate(stamps):
        level = "ERROR" if i == err_at else rng.choice(["INFO", "INFO", "INFO", "WARN", "DEBUG"])
        event = rng.choice(d.events).format(id=rid, **rec)
        if level == "ERROR":
            event = rng.choice(["checksum mismatch", "upstream timeout", "permission denied",
                                "quota exceeded", "validation failed"]) + f" ({event})"
            err = (ts, event)
        lines.append(f"{ts} {level} {d.entity} {rid}: {event}")
    return "\n".join(lines), err[0], err[1]


def long_episode(d: Domain, seed: int) -> tuple[list[dict], list[dict]]:
    """(messages, tools): one episode of `d` whose facts sit in the middle of long tool outputs."""
    rng = random.Random(f"long-episode:{d.name}:{seed}")
    n = rng.randint(25, 90)
    records = _unique_records(d, rng, n)
    target_at = rng.randint(max(1, n // 10), n - 1 - n // 10)
    target = records[target_at]
    key = rng.choice([f for f in list(d.fields)[1:] if sum(str(r[f]) == str(target[f]) for r in records) == 1]
                     or [d.id_field])
    tid = str(target[d.id_field])
    shape = rng.choice(SHAPES)
    persona = rng.choice([f"You are {d.assistant_role}.", f"You are {d.assistant_role} with tools.",
                          f"You are a careful assistant working as {d.assistant_role}. Call one tool at a "
                          "time and read its output before answering."])
    want_log = rng.random() < 0.6
    ask = rng.choice([
        f"Find the {d.entity} whose {key.replace('_', ' ')} is {target[key]} and give me its details.",
        f"Which {d.entity} has {key} = {target[key]}? Look it up and summarise it.",
        f"I need the {d.entity} with {key.replace('_', ' ')} {target[key]}. Check the listing first.",
    ]) + (" Also tell me when its log last showed an ERROR." if want_log else "")
    msgs = [{"role": "system", "content": persona}, {"role": "user", "content": ask}]
    msgs += [_call("call_0", f"list_{d.plural}", {"page": 1}),
             _result("call_0", f"list_{d.plural}", render_records(records, shape, rng))]
    msgs += [_call("call_1", f"get_{d.entity}", {d.id_field: tid}),
             _result("call_1", f"get_{d.entity}", json.dumps(target, indent=rng.choice([None, 2])))]
    detail = ", ".join(f"{f.replace('_', ' ')} {target[f]}" for f in rng.sample(list(d.fields)[1:], k=min(3, len(d.fields) - 1)))
    answer = f"The {d.entity} with {key.replace('_', ' ')} {target[key]} is {tid}: {detail}."
    if want_log:
        log, ts, event = _log(d, target, rng, rng.randint(30, 80))
        msgs += [_call("call_2", f"{d.entity}_history", {d.id_field: tid, "limit": 100}),
                 _result("call_2", f"{d.entity}_history", log)]
        answer += f" Its log shows one ERROR, at {ts}: {event}."
    msgs.append({"role": "assistant", "content": answer})
    if d.numeric and rng.random() < 0.6:  # a follow-up answered from the listing's middle
        rank = rng.choice(d.numeric)
        best = max(records, key=lambda r: r[rank])
        msgs.append({"role": "user", "content": rng.choice([
            f"Which {d.entity} in that listing has the highest {rank.replace('_', ' ')}?",
            f"From the same list, what is the top {d.entity} by {rank}?"])})
        msgs.append({"role": "assistant", "content":
                     f"{best[d.id_field]} has the highest {rank.replace('_', ' ')} ({best[rank]})."})
    elif rng.random() < 0.5:
        other = records[rng.randint(1, n - 2)]
        fld = rng.choice(list(d.fields)[1:])
        msgs.append({"role": "user", "content": f"And what is the {fld.replace('_', ' ')} of {other[d.id_field]}?"})
        msgs.append({"role": "assistant", "content": f"{other[d.id_field]} has {fld.replace('_', ' ')} {other[fld]}."})
    return msgs, episode_tools(d)
