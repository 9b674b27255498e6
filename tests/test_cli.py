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
        # the version, then the dtype choice (asymagent/modeling/cpu_dtype.py describe())
        assert out.returncode == 0 and out.stdout.startswith(f"asymagent {__version__} ("), out
        assert "auto: " in out.stdout and "CPU bf16 unit: " in out.stdout, out
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
    assert (args.verifier, args.model_name, args.max_model_len) == ("./m", ["mine"], 4096)
    assert (args.dtype, args.device, args.threads) == ("bfloat16", "cpu", 2)
    assert parse_serve("--verifier", "./v", "--model-name", "x").verifier == "./v"


BAD = [
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--max-queue", "0"], "--max-queue must be >= 1"),
    (["--max-model-len", "1"], "--max-model-len must be >= 2"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--temperature", "3"], "--temperature must be in 0..2"),
    (["--request-timeout", "0"], "--request-timeout must be > 0"),
    (["--config", "/no/such/cfg.json"], "No such file"),
    (["--drafter", "layers:x"], "layers:N needs an integer"),
    (["--verifier", "./no-such-model"], "not found"),
    (["--allowed-origins", "localhost:3000"], "is not an origin"),
    (["--device", "tpu"], "--device must be"),
    (["--suffix-store", "/no/such/dir/s.npz"], "does not exist"),
]


@pytest.fixture
def no_loading(monkeypatch):
    from asymagent.engine import Engine
    from asymagent.modeling import loading

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(Engine, "from_default", refuse)
    monkeypatch.setattr(Engine, "from_pretrained", refuse)
    for name in ("load_model", "load_gguf", "load_default_verifier"):
        monkeypatch.setattr(loading, name, refuse)


def refused(argv, capsys) -> str:
    """One line on stderr and exit status 2 (integrations/cli.py), before any model loads."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    return err


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_serve_arguments_exit_2_before_any_model_loads(no_loading, capsys, argv, message):
    err = refused(["serve", *argv], capsys)
    assert err.count("\n") == 1 and message in err, err


def test_a_custom_verifier_needs_a_drafter_in_speculative_modes(no_loading, capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # looks like a model directory
    err = refused(["serve", "--model", str(tmp_path), "--mode", "asym"], capsys)
    assert "--drafter" in err
    assert "invalid choice" in refused(["serve", "--dtype", "float8"], capsys)  # argparse's own


def test_a_file_that_is_not_a_suffix_store_is_refused(no_loading, capsys, tmp_path):
    (tmp_path / "s.npz").write_text("not numpy")
    assert "not a suffix store" in refused(["serve", "--suffix-store", str(tmp_path / "s.npz")],
                                           capsys)


def test_bad_config_contents_are_named(no_loading, tmp_path, capsys):
    (tmp_path / "a.json").write_text('{"spec": {"k": 0}}')
    (tmp_path / "b.yaml").write_text("spec: [1, 2")
    (tmp_path / "c.json").write_text('{"sepc": {}}')
    for name, message in (("a.json", "spec:"), ("b.yaml", "not valid YAML"), ("c.json", "sepc")):
        assert message in refused(["serve", "--config", str(tmp_path / name)], capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_refused(no_loading, capsys):
    assert "CUDA is not available" in refused(["serve", "--device", "cuda"], capsys)


def test_eval_refuses_a_bad_trace_line_before_loading(no_loading, capsys, tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"messages": [], "expected": {"role": "assistant", "content": "x"}}\n')
    assert "t.jsonl:1: invalid trace" in refused(["eval", str(bad)], capsys)
