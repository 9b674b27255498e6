"""`asymagent serve` as a command: the CLI verb in a subprocess driven by the load tool, and
`load_engine` reading --verifier/--drafter/--config (tiny random models saved to disk)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from conftest import make_tiny_llama

VOCAB = 49152  # SmolLM2's vocabulary, so the real tokenizer drives the tiny models


def test_serve_cli_and_loadtest_end_to_end(tmp_path, smollm_tokenizer):
    """`asymagent serve` in a subprocess (tiny models saved to disk), driven by the load tool."""
    import subprocess
    import sys

    from asymagent.integrations import loadtest

    vdir, ddir = tmp_path / "verifier", tmp_path / "drafter"
    make_tiny_llama(vocab_size=VOCAB, seed=0).save_pretrained(vdir)
    make_tiny_llama(vocab_size=VOCAB, layers=1, seed=1).save_pretrained(ddir)
    smollm_tokenizer.save_pretrained(vdir)
    smollm_tokenizer.save_pretrained(ddir)  # from_pretrained loads a tokenizer with each model
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "asymagent.integrations.cli", "serve", "--port", str(port),
           "--verifier", str(vdir), "--drafter", str(ddir), "--max-tokens", "8",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120  # imports + model load on 2 busy cores
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.25)
        out = tmp_path / "load.json"
        rc = loadtest.main(["--url", f"http://127.0.0.1:{port}", "--concurrency", "3",
                            "--requests", "6", "--max-tokens", "4", "--json", str(out),
                            "--quiet"])
        report = json.loads(out.read_text())
        assert rc == 0 and report["ok"] == 6 and report["errors"] == {}
        assert 0 < report["ttft_p50_s"] <= report["latency_p95_s"]
        assert report["completion_tokens"] >= 6  # each streamed request produced >= 1 token
        # The load tool refuses anything but loopback.
        assert loadtest.main(["--url", "http://192.0.2.1:80", "--requests", "1"]) == 2
    finally:
        proc.terminate()
        proc.wait(30)
    started = proc.stdout.read().decode()  # the start banner (asymagent/model_banner.py)
    assert "asymagent serve: models" in started, started[-2000:]
    for line in ("verifier", "drafter", "dtype", "CPU", "row floors", "grouped rows", "threads"):
        assert f"  {line}" in started, (line, started[-2000:])


def test_load_engine_reads_config_and_layers_drafter(tmp_path, smollm_tokenizer):
    import argparse

    from asymagent.integrations.serve import add_arguments, load_engine

    vdir = tmp_path / "verifier"
    make_tiny_llama(vocab_size=VOCAB, seed=0).save_pretrained(vdir)
    smollm_tokenizer.save_pretrained(vdir)
    (tmp_path / "cfg.json").write_text(json.dumps({"spec": {"k": 3, "gamma": 0.25}}))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--verifier", str(vdir), "--drafter", "layers:1",
                              "--config", str(tmp_path / "cfg.json"), "--max-sessions", "2"])
    engine = load_engine(args)
    assert (engine.spec.k, engine.spec.gamma) == (3, 0.25)  # the values in cfg.json
    assert len(engine.drafter.model.layers) == 1  # layers:1 -> the verifier's first layer
    assert engine.caches.max_sessions == 2
    with pytest.raises(ValueError):
        load_engine(parser.parse_args(["--verifier", str(vdir), "--drafter", "layers:x"]))
    # a custom verifier without a drafter cannot serve the default mode asym: refused at start
    with pytest.raises(ValueError, match="--drafter"):
        load_engine(parser.parse_args(["--verifier", str(vdir)]))
    assert load_engine(parser.parse_args(["--verifier", str(vdir), "--mode", "full"])).drafter is None
    # --suffix-store: earlier responses persist across engines (server restarts)
    store_args = ["--verifier", str(vdir), "--mode", "full", "--suffix-store", str(tmp_path / "s.npz")]
    first = load_engine(parser.parse_args(store_args))
    first.generate([1, 2, 3, 4], mode="full", max_new_tokens=4)
    assert load_engine(parser.parse_args(store_args)).suffix_store.num_tokens == 4
