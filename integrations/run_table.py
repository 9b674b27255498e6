"""Terminal tables for RunStats: one row per agent step, then the run totals (rich).

One table serves the live display and the final print (`run_table`), so both show the same
columns. It fits the terminal: numeric cells are never cut; at a narrow width the columns of
least use are dropped (in `DROP_ORDER`) and the action label is shortened, and the legend
under the table spells out the short headers and names what was dropped.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from asymagent.stats import RunStats, StepStats

# (key, short header, justify, what the header means)
COLUMNS = [("step", "#", "right", "step"),
           ("action", "action", "left", "action"),
           ("ctx", "ctx", "right", "full context tokens"),
           ("ver", "ver", "right", "verifier's (compressed) context tokens"),
           ("cr", "cr", "right", "compression ver/ctx"),
           ("new", "new", "right", "new tokens"),
           ("frc", "frc", "right", "tokens forced by the grammar"),
           ("acc", "acc", "right", "draft acceptance"),
           ("tpf", "t/f", "right", "tokens per verifier forward"),
           ("s", "s", "right", "step latency (s)"),
           ("cum", "cum", "right", "cumulative latency (s)"),
           ("esc", "esc", "center", "escalated to the full context"),
           ("ok", "ok", "center", "the model's action equals the oracle's")]
DROP_ORDER = ("esc", "frc", "cum", "cr", "new", "tpf", "ok", "acc", "ver")  # first dropped first
ACTION_MIN, ACTION_MAX = 20, 34  # the action label's width range (shortened with "…")
_BORDER = 3  # rich's default box: "│ " + cell + " " per column, plus one closing edge


def _acceptance(s: StepStats) -> str:
    return f"{s.accepted / s.drafted:.0%}" if s.drafted else "-"


def step_cells(index: int, s: StepStats, cumulative_s: float, label: str = "",
               agrees: bool | None = None) -> dict:
    """{column key: cell text} of one step's row."""
    return {
        "step": str(index), "action": label, "ctx": f"{s.full_context_tokens:,}",
        "ver": f"{s.verifier_context_tokens:,}", "cr": f"{s.compression_ratio:.2f}",
        "new": str(s.new_tokens), "frc": str(s.forced_tokens), "acc": _acceptance(s),
        "tpf": f"{s.mean_accepted_len:.2f}" if s.rounds else "-", "s": f"{s.wall_s:.2f}",
        "cum": f"{cumulative_s:.1f}", "esc": "yes" if s.escalated else "",
        "ok": "" if agrees is None else ("yes" if agrees else "no"),
    }


def step_row(index: int, s: StepStats, cumulative_s: float, label: str = "") -> list[str]:
    """The cells of one step's row in `COLUMNS` order without the agreement column."""
    cells = step_cells(index, s, cumulative_s, label)
    return [cells[key] for key, *_ in COLUMNS if key != "ok"]


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def fit_columns(rows: list[dict], width: int | None, keys: list[str]) -> tuple[list[str], int]:
    """(the column keys that fit `width` characters, the action column's width): drops columns
    in DROP_ORDER until the numeric cells fit whole next to an action label of ACTION_MIN."""
    header = {key: short for key, short, *_ in COLUMNS}
    need = {key: max([len(header[key])] + [len(r[key]) for r in rows]) for key in keys}
    action = min(max(need.get("action", 0), ACTION_MIN), ACTION_MAX)
    kept = list(keys)
    if width is None:
        return kept, action

    def total(cols: list[str], action_width: int) -> int:
        return 1 + sum(_BORDER + (action_width if k == "action" else need[k]) for k in cols)

    for key in DROP_ORDER:
        if total(kept, ACTION_MIN) <= width:
            break
        if key in kept:
            kept.remove(key)
    if "action" in kept and total(kept, ACTION_MIN) > width:
        kept.remove("action")
    if "action" in kept:
        action = max(ACTION_MIN, min(action, width - total(kept, 0)))
    return kept, action


def run_table(stats: RunStats, title: str = "per-step statistics",
              labels: list[str] | None = None, agrees: list[bool] | None = None,
              width: int | None = None) -> Group:
    """A rich Table, one row per step (context, compression, tokens, acceptance, latency, and
    with `agrees` whether the model's action equals the oracle's), fitted to `width`
    characters (None: every column), with the legend of its short headers under it."""
    cum = stats.cumulative_latency()
    rows = [step_cells(i + 1, s, cum[i], labels[i] if labels and i < len(labels) else "",
                       agrees[i] if agrees is not None and i < len(agrees) else None)
            for i, s in enumerate(stats.steps)]
    keys = [key for key, *_ in COLUMNS if key != "ok" or agrees is not None]
    kept, action_width = fit_columns(rows, width, keys)
    table = Table(title=title, header_style="bold")
    for key, short, justify, _ in COLUMNS:
        if key in kept:
            table.add_column(short, justify=justify, no_wrap=True,
                             width=action_width if key == "action" else None,
                             overflow="ellipsis" if key == "action" else "fold")
    for r in rows:
        r = dict(r, action=shorten(r["action"], action_width))
        table.add_row(*(r[key] for key in kept))
    return Group(table, Text(legend(kept, [k for k in keys if k not in kept]), style="dim"))


def legend(kept: list[str], dropped: list[str]) -> str:
    """The short headers spelled out, and the columns left out at this width."""
    meaning = {key: (short, what) for key, short, _, what in COLUMNS}
    parts = [f"{meaning[k][0]}: {meaning[k][1]}" for k in kept if k not in ("step", "action")]
    text = "; ".join(parts)
    if dropped:
        text += f". Left out at this width: {', '.join(meaning[k][1] for k in dropped)}."
    return text


def totals_table(stats: RunStats, title: str = "run totals") -> Table:
    """A two-column rich Table of RunStats.totals() with the most useful figures first."""
    t = stats.totals()
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right", no_wrap=True)
    rows = [
        ("steps", str(t["steps"])),
        ("wall time", f"{t['wall_s']:.2f} s"),
        ("new tokens (forced by the grammar)", f"{t['new_tokens']} ({t['forced_tokens']})"),
        ("time per new token", f"{1000 * t['per_token_s']:.1f} ms"),
        ("drafted / accepted", f"{t['drafted']} / {t['accepted']}"),
        ("acceptance rate", f"{t['acceptance_rate']:.1%}" if t["drafted"] else "-"),
        ("tokens per verifier forward", f"{t['mean_accepted_len']:.2f}" if t["rounds"] else "-"),
        ("mean compression (verifier/full ctx)", f"{t['mean_compression_ratio']:.2f}"),
        ("verifier prefill tokens", f"{t['verifier_prefill_tokens']:,}"),
        ("verifier FLOPs", f"{t['verifier_flops']:.3g}"),
        ("escalations to full context", str(t["escalations"])),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


def render_text(stats: RunStats, width: int = 140, labels: list[str] | None = None,
                agrees: list[bool] | None = None) -> str:
    """Both tables rendered to plain text at `width` columns (for logs, READMEs and tests)."""
    import io

    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(run_table(stats, labels=labels, agrees=agrees, width=width))
    console.print(totals_table(stats))
    return console.export_text()
