"""evals/probes/harness.py: the probes' parser, JSON output, command line and timing (no model)."""

from __future__ import annotations

import json

from asymagent.evals.probes import harness


def test_parser_names_the_probe_and_declares_json_and_repeats():
    p = harness.parser("What the probe measures.\n\nMore.", "demo_probe", repeats=5)
    assert p.prog == "python -m asymagent.evals.probes.demo_probe"
    assert p.description == "What the probe measures."
    args = p.parse_args([])
    assert args.json is None and args.repeats == 5
    assert p.parse_args(["--json", "x.json", "--repeats", "2"]).repeats == 2
    assert not hasattr(harness.parser(None, with_json=False).parse_args([]), "json")


def test_finish_writes_the_json_and_returns_the_status(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert harness.finish({"a": [1, 2]}, str(out), indent=None, show=True, status=3) == 3
    assert json.loads(out.read_text()) == {"a": [1, 2]}
    assert '"a"' in capsys.readouterr().out
    assert harness.finish({"a": 1}, None) == 0  # no path: nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]


def test_command_timed_and_median():
    assert harness.command("lean_ab", ["--steps", "4"]) == "python -m asymagent.evals.probes.lean_ab --steps 4"
    value, seconds = harness.timed(sum, [1, 2, 3])
    assert value == 6 and seconds >= 0.0
    assert harness.median_ms_of([0.001, 0.003, 0.002]) == 2.0


def test_run_verb_parses_with_the_probes_own_arguments():
    def add_arguments(p):
        p.add_argument("--json", default=None)
        p.add_argument("--k", type=int, default=2)

    assert harness.run_verb("Doc.", "verb", add_arguments, lambda args: args.k * 10, ["--k", "4"]) == 40


def test_a_probe_through_the_harness_end_to_end(tmp_path):
    """dtype_fidelity's --combine (no model): raw parts in, the comparison written by the harness."""
    from asymagent.evals.probes import dtype_fidelity

    call = {"name": "get", "arguments": {"id": 3}}
    ref = [["records", 0, 0, call, True], ["records", 0, 1, "answer 42", True]]
    parts = {"float32": ref, "bfloat16": [ref[0], ["records", 0, 1, "answer 41", False]]}
    paths = []
    for dtype, outputs in parts.items():
        path = tmp_path / f"{dtype}.json"
        path.write_text(json.dumps({"outputs": {dtype: {"full": outputs}}, "walls": {dtype: 1.0}}))
        paths.append(str(path))
    out = tmp_path / "dtype.json"
    assert dtype_fidelity.main(["--combine", *paths, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["results"]["bfloat16/full"]["fidelity_vs_float32"] == 0.5
