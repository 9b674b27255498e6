"""`asymagent serve --ray` as a command: the CLI verb in a subprocess (a new local Ray, one replica
of tiny random models saved to disk), serving until SIGINT, then exiting 0. Slow (~1 min: Ray's
start); skipped without ray[serve]."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("ray.serve.request_router", reason="needs ray[serve] >= 2.46")

from conftest import make_tiny_llama  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_serve_ray_command_serves_and_stops(tmp_path, smollm_tokenizer):
    vdir, ddir = tmp_path / "verifier", tmp_path / "drafter"
    make_tiny_llama(vocab_size=49152, seed=0).save_pretrained(vdir)
    make_tiny_llama(vocab_size=49152, layers=1, seed=1).save_pretrained(ddir)
    smollm_tokenizer.save_pretrained(vdir)
    smollm_tokenizer.save_pretrained(ddir)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "asymagent.integrations.cli", "serve", "--port", str(port),
           "--verifier", str(vdir), "--drafter", str(ddir), "--max-tokens", "4", "--ray",
           "--replicas", "1", "--replica-cpus", "0.5", "--log-level", "warning",
           "--trace-dir", str(tmp_path / "traces")]
    # the command's output goes to a file, not a pipe nobody reads while it runs: Ray forwards the
    # replicas' logs to the driver's stdout, and a full pipe would block the server
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # Ray's start + the replica's model load, 2 busy cores
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "serve --ray did not come up"
            try:
                if httpx.get(url + "/health", timeout=5, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        r = httpx.post(url + "/v1/chat/completions", timeout=120, trust_env=False,
                       json={"model": "asymagent", "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert 'asymagent:ray_replicas{model_name="asymagent"} 1' in httpx.get(
            url + "/metrics", timeout=30, trust_env=False).text
        assert [p.name for p in (tmp_path / "traces").iterdir()][0].startswith("replica-")
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail("serve --ray did not stop within 120 s of SIGINT; its output ends:\n"
                        + log_path.read_text(errors="replace")[-3000:])
        assert code == 0, log_path.read_text(errors="replace")[-3000:]
        with pytest.raises(httpx.TransportError):  # the server is gone
            httpx.get(url + "/health", timeout=5, trust_env=False)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
