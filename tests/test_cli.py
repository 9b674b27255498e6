"""The `asymagent` command: --version, `python -m asymagent`, defaults in every --help, vLLM-style
aliases for serve, and argument errors reported before any model loads."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from asymagent.integrations import cli
from asymagent.integrations.cli import VERBS, build_parser, shows_default


def test_version_and_python_dash_m():
    from asymagent import __version__

    for cmd in ([sys.executable, "-m", "asymagent", "--version"],
                [sys.executable, "-m", "asymagent.integrations.cli", "--version"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == f"asymagent {__version__}", out
    out = subprocess.run([sys.executable, "-m", "asymagent", "serve", "--help"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "--served-model-name" in out.stdout


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_help_shows_every_default(verb):
    _, verbs = build_parser()
    parser = verbs[verb]
    text = "".join(parser.format_help().split())  # unwrapped (argparse may break long words)
    for action in parser._actions:
        if not shows_default(action):
            continue
        own = "(default" in (action.help or "")  # the help states its default in its own words
        want = "".join(f"default: {action.default}".split())
        assert own or want in text, (verb, action.option_strings)


def parse_serve(*argv):
    _, verbs = build_parser()
    return verbs["serve"].parse_args(list(argv))


def test_vllm_style_aliases():
    args = parse_serve("--model", "./m", "--served-model-name", "mine", "--max-model-len", "4096",
                       "--dtype", "bfloat16", "--device", "cpu", "--threads", "2")
    assert (args.verifier, args.model_name, args.max_model_len) == ("./m", "mine", 4096)
    assert (args.dtype, args.device, args.threads) == ("bfloat16", "cpu", 2)
    assert parse_serve("--verifier", "./v", "--model-name", "x").verifier == "./v"


BAD = [
    (["--port", "70000"], "must be <= 65535"),
    (["--max-queue", "0"], "must be >= 1"),
    (["--temperature", "3"], "must be <= 2"),
    (["--request-timeout", "0"], "must be > 0"),
    (["--dtype", "float8"], "invalid choice"),
    (["--config", "/no/such/cfg.json"], "no such file"),
    (["--drafter", "layers:x"], "layers:N needs an integer"),
    (["--verifier", "./no-such-model"], "no such file"),
    (["--verifier", "/tmp", "--mode", "asym"], "--drafter"),  # a real dir, no drafter
    (["--allowed-origins", "localhost:3000"], "is not an origin"),
    (["--device", "tpu"], "--device must be"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_serve_arguments_exit_2_before_any_model_loads(monkeypatch, capsys, argv, message):
    from asymagent.engine import Engine
    from asymagent.modeling import loading

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(Engine, "from_default", no_loading)
    monkeypatch.setattr(Engine, "from_pretrained", no_loading)
    monkeypatch.setattr(loading, "load_model", no_loading)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_config_contents_are_named(tmp_path, capsys):
    (tmp_path / "a.json").write_text('{"spec": {"k": 0}}')
    (tmp_path / "b.yaml").write_text("spec: [1, 2")
    (tmp_path / "c.json").write_text('{"sepc": {}}')
    for name, message in (("a.json", "k"), ("b.yaml", "cannot parse"), ("c.json", "sepc")):
        with pytest.raises(SystemExit):
            cli.main(["serve", "--config", str(tmp_path / name)])
        assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--device", "cuda"])
    assert "CUDA is not available" in capsys.readouterr().err


def test_eval_refuses_a_missing_trace_file_before_loading(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["eval", str(tmp_path / "missing.jsonl")])
    assert exit_.value.code == 2 and "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["eval", "recrods"])
    assert "unknown suite" in capsys.readouterr().err
