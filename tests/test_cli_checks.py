"""Issue 27's CLI edges: every path, host and model check before any work (one line, exit 2);
a top-level handler for what is left (exit 1, `--debug` shows the traceback); `serve MODEL`;
`--num-speculative-tokens`; `--log-level` on every verb; progress bars only on a terminal."""

from __future__ import annotations

import io
import os

import pytest

from asymagent.integrations import cli
from asymagent.integrations.cli_checks import check_common, setup_output


def test_path_host_and_model_mistakes_are_refused_first(tmp_path, capsys, no_model_loads, run_cli):
    existing = tmp_path / "report.md"
    existing.write_text("x")
    cases = {
        ("eval", "records", "--report", str(existing)): "exists and is not a directory",
        ("eval", "records", "--modes", ""): "names no mode",
        ("eval", "records", "--json", str(tmp_path)): "is a directory",
        ("eval", "records", "--json", str(existing / "out.json")): "is a file, not a folder",
        ("demo", "--json", str(existing / "sub" / "d.json")): "is a file, not a folder",
        ("bench", "--json", str(tmp_path)): "is a directory",
        ("serve", "--drafter", "layers:99"): "has 30 layers",
        ("serve", "--host", "0.0.0.0.0"): "--host 0.0.0.0.0",
        ("serve", "--num-speculative-tokens", "0"): "--num-speculative-tokens",
        ("serve", str(tmp_path / "no-such-model"), "--mode", "full"): "not found",
        ("serve", "default", "--model", str(tmp_path)): "given twice",
    }
    for argv, expected in cases.items():
        code, err = run_cli(list(argv))
        assert code == 2, (argv, err)
        assert err.count("\n") == 1 and err.startswith(f"asymagent {argv[0]}: error: "), (argv, err)
        assert expected in err, (argv, err)


def test_json_into_a_missing_folder_creates_it_up_front(tmp_path):
    class Args:
        json = str(tmp_path / "runs" / "deep" / "out.json")
        report = str(tmp_path / "reports" / "r1")

    check_common(Args())
    assert (tmp_path / "runs" / "deep").is_dir()  # created before the run, not after
    assert not (tmp_path / "reports").exists()  # a report folder is made by the verb itself


def test_anything_left_is_one_line_exit_1_and_debug_shows_the_traceback(monkeypatch, capsys, run_cli):
    from asymagent.integrations import demo

    def boom(args):
        raise RuntimeError("the environment broke\nat step 3")

    monkeypatch.setattr(demo, "check_args", lambda args: None)
    monkeypatch.setattr(demo, "main", boom)
    code, err = run_cli(["demo"])
    assert code == 1
    assert err == ("asymagent demo: error: RuntimeError: the environment broke at step 3 "
                   "(--debug prints the traceback)\n")
    code, err = run_cli(["demo", "--debug"])
    assert code == 1 and "Traceback (most recent call last)" in err and "def boom" not in err
    assert err.strip().splitlines()[-1] == \
        "asymagent demo: error: RuntimeError: the environment broke at step 3"


def test_serve_positional_model_and_speculative_tokens(tmp_path, monkeypatch):
    from asymagent.integrations import serve_setup

    parser, _ = cli.build_parser()
    args = parser.parse_args(["serve", "default", "--num-speculative-tokens", "5",
                              "--mode", "full"])
    serve_setup.check_args(args)
    assert args.verifier == "default" and args.num_speculative_tokens == 5
    seen = {}
    monkeypatch.setattr("asymagent.integrations.engine_source.open_engine",
                        lambda *a, **kw: seen.update(kw) or object())
    serve_setup.load_engine(args)
    assert seen["spec"].k == 5 and seen["spec"].k_max >= 5


def test_every_verb_takes_log_level_and_debug():
    parser, verbs = cli.build_parser()
    for verb, sub in verbs.items():
        help_text = sub.format_help()
        assert "--log-level" in help_text and "--debug" in help_text, verb


def test_progress_bars_only_on_a_terminal(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    try:
        hf_logging.enable_progress_bar()
        setup_output("warning", stream=Tty())
        assert hf_logging.is_progress_bar_enabled()
        setup_output("warning", stream=io.StringIO())  # a pipe or a log file
        assert not hf_logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    finally:
        hf_logging.enable_progress_bar()
        setup_output("warning", stream=Tty())
