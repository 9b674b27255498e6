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
    monkeypatch.setattr(demo, "load_engine", lambda console, k=None: (tiny_engine, "tiny test pair"))
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    out = tmp_path / "demo.json"
    args = parser.parse_args(["--steps", "2", "--max-new-tokens", "8", "--compare", "full",
                              "--no-live", "--json", str(out)])
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
