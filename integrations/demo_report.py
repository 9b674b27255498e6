"""What the free-running demo prints: a line per step as it happens, then the modes side by side, the totals and the verdicts."""

from __future__ import annotations


def action_label(action, width: int = 46) -> str:
    """`get_orders(customer_id='CUST-1')` or `answer: ...`, cut to `width` characters."""
    if isinstance(action, dict):
        args = action.get("arguments")
        if isinstance(args, dict):
            args = ", ".join(f"{k}={v!r}" for k, v in args.items())
        text = f"{action['name']}({args if args is not None else ''})"
    else:
        text = "answer: " + " ".join(str(action).split())
    return text if len(text) <= width else text[:width - 1] + "…"


def step_line(episode, step) -> str:
    """One finished turn: mode, step, action, full -> verifier context tokens, tokens, latency."""
    s = step["stats"]
    action = step["action"]
    if isinstance(action, dict) and action.get("name") == "calculate":  # the loop's own tool: show its value
        action = dict(action, name=f"= {step['output']} <- calculate")
    return (f"{episode.mode:>5} step {step['step']:>2}  {action_label(action):<46} "
            f"ctx {s.full_context_tokens:>5} -> verifier {s.verifier_context_tokens:>5}  "
            f"{s.new_tokens:>3} tok  {s.wall_s:6.2f} s")


def side_by_side(episodes, width: int | None = None):
    """A rich Table: one row per turn, each mode's action, verifier/full context and latency."""
    from rich.table import Table

    table = Table(title="the episodes side by side (ctx: full history tokens; ver: what the "
                        "verifier read)", width=width)
    table.add_column("step", justify="right")
    for e in episodes:
        table.add_column(f"{e.mode}: action", overflow="ellipsis", no_wrap=True)
        table.add_column("ver/ctx", justify="right", no_wrap=True)
        table.add_column("s", justify="right", no_wrap=True)
    for n in range(max(len(e.steps) for e in episodes)):
        row = [str(n + 1)]
        for e in episodes:
            if n < len(e.steps):
                st = e.steps[n]
                s = st["stats"]
                row += [action_label(st["action"], 40),
                        f"{s.verifier_context_tokens}/{s.full_context_tokens}", f"{s.wall_s:.2f}"]
            else:
                row += ["", "", ""]
        table.add_row(*row)
    return table


def totals(episode) -> dict:
    """The episode's totals: turns, tool calls, wall time, tokens, mean verifier share, verdict."""
    t = episode.stats.totals()
    return {"mode": episode.mode, "turns": len(episode.steps), "tool_calls": episode.calls,
            "calculations": getattr(episode, "calculations", 0),
            "wall_s": t["wall_s"], "new_tokens": t["new_tokens"],
            "ms_per_token": 1000 * t["per_token_s"],
            "verifier_share": t["mean_compression_ratio"],
            "last_context_tokens": episode.steps[-1]["stats"].full_context_tokens if episode.steps else 0,
            "last_verifier_tokens": episode.steps[-1]["stats"].verifier_context_tokens if episode.steps else 0,
            "answer": episode.answer, "right": bool(episode.success)}


def totals_table(episodes, width: int | None = None):
    """A rich Table of `totals` per mode, one column a mode."""
    from rich.table import Table

    rows = [totals(e) for e in episodes]
    table = Table(title="totals", width=width)
    table.add_column("")
    for r in rows:
        table.add_column(r["mode"], justify="right")
    for key, label, fmt in (("turns", "model turns", str), ("tool_calls", "tool calls executed", str),
                            ("calculations", "calculate calls (the agent's calculator)", str),
                            ("wall_s", "wall time", lambda v: f"{v:.1f} s"),
                            ("new_tokens", "new tokens", str),
                            ("ms_per_token", "time per new token", lambda v: f"{v:.0f} ms"),
                            ("last_context_tokens", "history at the last turn", lambda v: f"{v} tokens"),
                            ("last_verifier_tokens", "verifier read at the last turn",
                             lambda v: f"{v} tokens"),
                            ("verifier_share", "verifier read (share of the history, all turns)",
                             lambda v: f"{100 * v:.0f}%"),
                            ("right", "task done right (oracle's check)",
                             lambda v: "yes" if v else "NO")):
        table.add_row(label, *[fmt(r[key]) for r in rows])
    return table


def verdict_lines(episodes, oracle_answer: str) -> list:
    """Both final answers and whether each is right, then the first mode's speed over the others' (`speed_line`)."""
    lines = []
    for e in episodes:
        answer = " ".join((e.answer or "(no answer: ran out of turns)").split())
        lines.append(f"{e.mode} final answer: {answer[:300]}  -> "
                     f"{'RIGHT' if e.success else 'WRONG'}")
    lines.append(f"the environment's key facts: {oracle_answer}")
    first = episodes[0]
    for e in episodes[1:]:
        lines.append(speed_line(first, e))
    return lines


def speed_line(a, b) -> str:
    """`a`'s speed over `b`'s: over the turns both took (the fair figure when one episode ended
    early), per new token, and over the whole episodes."""
    both = min(len(a.steps), len(b.steps))
    ta = sum(st["stats"].wall_s for st in a.steps[:both])
    tb = sum(st["stats"].wall_s for st in b.steps[:both])
    whole_a, whole_b = a.stats.totals(), b.stats.totals()
    parts = []
    if ta > 0:
        parts.append(f"over the {both} turns both took, {a.mode} {ta:.1f} s vs {b.mode} {tb:.1f} s: "
                     f"{tb / ta:.2f}x {b.mode}'s speed")
    if whole_a["per_token_s"] > 0:
        parts.append(f"per new token {1000 * whole_a['per_token_s']:.0f} vs "
                     f"{1000 * whole_b['per_token_s']:.0f} ms: {whole_b['per_token_s'] / whole_a['per_token_s']:.2f}x")
    parts.append(f"whole episodes {whole_a['wall_s']:.1f} s ({len(a.steps)} turns) vs "
                 f"{whole_b['wall_s']:.1f} s ({len(b.steps)} turns)")
    return f"speed, {a.mode} vs {b.mode} (turns interleaved, same machine load): " + "; ".join(parts)
