"""`asymagent demo` on a tiny random engine: teacher-forced loop, replay, tables, JSON, CLI wiring."""

from __future__ import annotations

import argparse
import json

import pytest
from conftest import make_tiny_llama

from asymagent.integrations import demo

V = 49152  # real SmolLM2 tokenizer ids


@pytest.fixture(scope="module")
def tiny_engine(smollm_tokenizer):
    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig

    return Engine(verifier=make_tiny_llama(vocab_size=V, seed=1, max_positions=8192),
                  drafter=make_tiny_llama(vocab_size=V, layers=1, seed=2, max_positions=8192),
                  tokenizer=smollm_tokenizer, spec=SpecConfig(k=2))


def test_teacher_forced_run_with_interleaved_compare(tiny_engine):
    from asymagent.evals.suites.environments import make_env

    env = make_env("records")
    run = demo.teacher_forced_run(tiny_engine, env, 0, "asym", 12, steps=3, compare="full")
    recs = run["records"]
    assert len(recs) == 3 and len(run["stats"].steps) == 3
    # The history grows by the oracle's call + its tool output each step (teacher forcing).
    assert [len(r["prompt"]) for r in recs] == [2, 4, 6]
    assert all(r["acts"] for r in recs)  # the records plan starts with 13 tool calls
    ctx = [r["stats"].full_context_tokens for r in recs]
    assert ctx[0] < ctx[1] < ctx[2]
    assert [s.mode for s in run["compare_stats"].steps] == ["full"] * 3
    # full mode reads the whole context: same full length as the asym step it pairs with
    assert [r["compare"]["stats"].full_context_tokens for r in recs] == ctx


def test_main_prints_tables_and_writes_json(tiny_engine, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "load_engine", lambda console, k=None, pair=None: (tiny_engine, "tiny test pair"))
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    out = tmp_path / "demo.json"
    args = parser.parse_args(["--teacher-forced", "--steps", "2", "--max-new-tokens", "8",
                              "--compare", "full", "--no-live", "--json", str(out)])
    assert demo.main(args) == 0
    text = capsys.readouterr().out
    assert "Teacher-forced run" in text and "per-step statistics" in text
    assert "run totals" in text and "speedup" in text
    data = json.loads(out.read_text())
    assert set(data["runs"]) == {"asym", "full"} and data["teacher_forced"] is True
    assert data["compare"]["steps"] == 2 and len(data["runs"]["asym"]["steps"]) == 2


def test_bad_flags(capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.main(parser.parse_args(["--steps", "0"])) == 2
    assert ">= 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "fast"])


def _long_run():
    from asymagent.stats import RunStats, StepStats

    stats = RunStats()
    for i in range(14):
        full = 490 + 505 * i
        stats.add(StepStats(wall_s=12.46 + i, new_tokens=127, drafted=287, accepted=184,
                            mean_accepted_len=4.61, rounds=9, full_context_tokens=full,
                            verifier_context_tokens=full // 2, compression_ratio=0.41,
                            forced_tokens=169, escalated=i == 3, mode="asym"))
    labels = [demo._label({"name": "get_customer", "arguments": {"customer_id": f"CUST-{i}"}})
              for i in range(14)]
    return stats, labels, [i % 2 == 0 for i in range(14)]


def _render(stats, labels, agrees, width):
    import io

    from rich.console import Console

    from asymagent.integrations.run_table import run_table

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(run_table(stats, title="t", labels=labels, agrees=agrees, width=width))
    return console.export_text()


def test_table_at_80_columns_keeps_every_number_whole():
    """Issue 27: at 80 columns every number was cut (`c…`, `1…`) and the step column empty."""
    from asymagent.integrations.run_table import fit_columns, step_cells

    stats, labels, agrees = _long_run()
    text = _render(stats, labels, agrees, 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 14  # one per step (the header row is drawn with ┃)
    cum = stats.cumulative_latency()
    kept, _ = fit_columns([step_cells(i + 1, s, cum[i], labels[i], agrees[i])
                           for i, s in enumerate(stats.steps)], 80,
                          ["step", "action", "ctx", "ver", "cr", "new", "frc", "acc", "tpf",
                           "s", "cum", "esc", "ok"])
    assert {"step", "action", "ctx", "s"} <= set(kept)
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row.strip("│").split("│")]
        numbers = [c for key, c in zip(kept, cells) if key not in ("action", "esc", "ok")]
        assert all("…" not in c for c in numbers), row
        want = step_cells(i + 1, stats.steps[i], cum[i])
        assert numbers == [want[key] for key in kept if key not in ("action", "esc", "ok")]
    assert "Left out at this width:" in text and "ctx: full context tokens" in text  # legend


def test_live_and_final_tables_have_the_same_columns():
    stats, labels, agrees = _long_run()
    wide = _render(stats, labels, agrees, 160)
    assert "Left out" not in wide  # nothing dropped when it fits
    live = _render(stats, labels[:3], agrees[:3], 80)  # the live table after 3 steps
    header = [line for line in live.splitlines() if line.startswith("┃")][0]
    final_header = [line for line in _render(stats, labels, agrees, 80).splitlines()
                    if line.startswith("┃")][0]
    assert header.split() == final_header.split()
