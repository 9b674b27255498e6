"""CLI mistakes print one line and exit 2 before any model loads, with no traceback."""

from __future__ import annotations

import json
import subprocess
import sys


def test_mistakes_are_one_line_exit_2(tmp_path, capsys, no_model_loads, run_cli):
    bad_spec = tmp_path / "spec.json"
    bad_spec.write_text(json.dumps({"spec": {"k": 2, "kk": 3}}))
    bad_section = tmp_path / "section.yaml"
    bad_section.write_text("specs:\n  k: 2\n")
    bad_value = tmp_path / "value.json"
    bad_value.write_text(json.dumps({"spec": {"k": "many"}}))
    bad_compression = tmp_path / "compression.yaml"
    bad_compression.write_text("compressors: [{type: tool_output, head_tokenz: 4}]\n")
    missing = str(tmp_path / "no-such-model")
    cases = {
        ("eval", "recordz"): "unknown suite 'recordz'",
        ("eval", str(tmp_path / "traces.jsonl")): "trace file not found",
        ("eval", "records", "--modes", "full,turbo"): "turbo",
        ("eval", "records", "--verifier", missing): "not found",
        ("eval", "records", "--compression", str(bad_compression)): "head_tokenz",
        ("bench", "--suite", "nope"): "unknown suite 'nope'",
        ("bench", "--modes", "asym"): "needs mode 'full'",
        ("bench", "--drafter", str(tmp_path / "d.safetensors")): "drafter file not found",
        ("serve", "--config", str(bad_spec)): "unknown key(s) ['kk']",
        ("serve", "--config", str(bad_section)): "'spec' and/or 'compression'",
        ("serve", "--config", str(bad_value)): "spec:",
        ("serve", "--config", str(tmp_path / "none.yaml")): "No such file",
        ("serve", "--verifier", missing, "--mode", "full"): "not found",
        ("serve", "--verifier", "no-such-org/no-such-model", "--mode", "full"): "cache",
        ("serve", "--drafter", "layers:x"): "layers:N",
        ("serve", "--max-body-bytes", "0"): "--max-body-bytes",
        ("train-drafter", "--out", str(tmp_path / "o"), "--verifier", missing): "not found",
        ("train-drafter", "--out", str(tmp_path / "o"), "--data-mix", "agent:1,web:1"): "web",
        ("demo", "--suite", "nope"): "unknown suite 'nope'",
    }
    for argv, expected in cases.items():
        code, err = run_cli(list(argv))
        assert code == 2, (argv, err)
        assert err.count("\n") == 1 and err.startswith(f"asymagent {argv[0]}: error: "), (argv, err)
        assert expected in err, (argv, err)
        assert "Traceback" not in err


def test_real_process_prints_no_traceback(tmp_path):
    """The console script end to end: stderr is one line, exit status 2, in well under a load."""
    proc = subprocess.run([sys.executable, "-m", "asymagent.integrations.cli", "eval", "recordz"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "asymagent eval: error: unknown suite 'recordz'; use one of records, fs_audit, tickets, "
        "injection, injection_call, invoices, dispatch, fusion or a .jsonl trace file"]
