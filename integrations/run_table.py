"""Terminal tables for RunStats: one row per agent step, then the run totals (rich)."""

from __future__ import annotations

from rich.table import Table

from asymagent.stats import RunStats, StepStats


def _acceptance(s: StepStats) -> str:
    return f"{s.accepted / s.drafted:.0%}" if s.drafted else "-"


def step_row(index: int, s: StepStats, cumulative_s: float, label: str = "") -> list[str]:
    """The cells of one step's row (also used by live displays)."""
    return [
        str(index), label, f"{s.full_context_tokens:,}", f"{s.verifier_context_tokens:,}",
        f"{s.compression_ratio:.2f}", str(s.new_tokens), str(s.forced_tokens),
        _acceptance(s), f"{s.mean_accepted_len:.2f}" if s.rounds else "-",
        f"{s.wall_s:.2f}", f"{cumulative_s:.1f}", "yes" if s.escalated else "",
    ]


COLUMNS = [("step", "right"), ("action", "left"), ("ctx full", "right"),
           ("ctx verifier", "right"), ("compr.", "right"), ("new tok", "right"),
           ("forced", "right"), ("accept", "right"), ("tok/fwd", "right"),
           ("latency s", "right"), ("cum. s", "right"), ("escal.", "center")]


def run_table(stats: RunStats, title: str = "per-step statistics",
              labels: list[str] | None = None) -> Table:
    """A rich Table: one row per step (context, compression, tokens, acceptance, latency)."""
    table = Table(title=title, show_footer=False, header_style="bold")
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True)
    cum = stats.cumulative_latency()
    for i, s in enumerate(stats.steps):
        label = labels[i] if labels and i < len(labels) else ""
        table.add_row(*step_row(i + 1, s, cum[i], label))
    return table


def totals_table(stats: RunStats, title: str = "run totals") -> Table:
    """A two-column rich Table of RunStats.totals() with the most useful figures first."""
    t = stats.totals()
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
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


def render_text(stats: RunStats, width: int = 140, labels: list[str] | None = None) -> str:
    """Both tables rendered to plain text (for logs, READMEs and tests)."""
    import io

    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(run_table(stats, labels=labels))
    console.print(totals_table(stats))
    return console.export_text()
