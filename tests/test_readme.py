"""The README's three copy-paste snippets, run as they stand on the embedded default (slow).

The only edits: the port (8000 -> a free one on 127.0.0.1, so a test never collides with a
running server) and `asymagent` -> `python -m asymagent` (the same command, run by this
interpreter)."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPET = re.compile(r"<!-- snippet: (\w+) -->\n```(\w+)\n(.*?)```", re.S)


def snippets() -> dict:
    return {name: code for name, _, code in SNIPPET.findall(README.read_text())}


def test_the_readme_has_the_three_snippets_near_the_top():
    text = README.read_text()
    assert set(snippets()) == {"langgraph", "serve", "openai", "eval"}
    assert text.index("<!-- snippet: eval -->") < text.index("## What `make demo` prints")


def test_langgraph_agent_snippet(capsys):
    scope = {"__name__": "__main__"}
    exec(compile(snippets()["langgraph"], "README.md:langgraph", "exec"), scope)
    messages = scope["out"]["messages"]
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    call = messages[1].tool_calls[0]
    assert call["name"] == "get_order" and call["args"] == {"order_id": "A-17"}  # the id copied
    assert "shipped on May 2" in messages[2].content
    # issue 27: the answer is prose that carries the tool's result, not a tool call's JSON
    answer = messages[-1].content
    assert not messages[-1].tool_calls and "{" not in answer
    assert "A-17" in answer and "May 2" in answer, answer
    assert capsys.readouterr().out.splitlines()[0] == answer.splitlines()[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_openai_client_snippet_against_asymagent_serve(capsys):
    port = str(free_port())
    line = snippets()["serve"].split("#")[0].strip().rstrip("&").strip()
    argv = shlex.split(line.replace("8000", port))
    assert argv[:2] == ["asymagent", "serve"]
    proc = subprocess.Popen([sys.executable, "-m", "asymagent", *argv[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600  # imports + the embedded pair on 2 busy cores
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "asymagent serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        scope = {"__name__": "__main__"}
        code = snippets()["openai"].replace("8000", port)
        exec(compile(code, "README.md:openai", "exec"), scope)
        parsed = scope["r"].choices[0].message.parsed
        assert isinstance(parsed, scope["Capital"]) and parsed.city and parsed.country
        assert capsys.readouterr().out.strip()
    finally:
        proc.terminate()
        proc.wait(60)


def test_eval_on_your_traces_snippet(tmp_path):
    script = snippets()["eval"].replace("\nasymagent ", f"\n{shlex.quote(sys.executable)} -m asymagent ")
    out = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "my_eval.json").read_text())
    assert set(result["modes"]) == {"full", "asym"}
    for summary in result["modes"].values():
        assert summary["steps"] == 2 and 0.0 <= summary["step_accuracy"] <= 1.0
    # issue 27: the traces' ids, and only the columns that apply to traces
    assert result["trace_ids"] == ["lookup", "answer"]
    assert "lookup" in out.stdout and "answer" in out.stdout
    assert "attack" not in out.stdout and "seeds" not in out.stdout
