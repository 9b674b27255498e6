"""`asymagent serve --ray` on a local Ray (127.0.0.1, 2 engine replicas of tiny random models made
here): the same answers as the single server, conversations kept on their replica (steps 2+ report
cached tokens), a full replica's 429, per-replica metrics and traces, and a replica killed
mid-run losing no request. Slow (Ray's start alone is ~30 s on 2 cores); skipped without
ray[serve]."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import sys
import time

import httpx
import pytest

pytest.importorskip("ray.serve.request_router", reason="needs ray[serve] >= 2.46")

import conftest  # noqa: E402
from conftest import make_tiny_llama  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

VOCAB = 49152
APP = dict(model_name="asymagent", max_queue=4, request_timeout=120, default_max_tokens=12)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def tiny_engine():
    """Runs in each replica's process (and once here for the single server): same seeds, same
    weights everywhere. Fixed K: adaptive K follows wall-clock timings, and with random weights
    (near-tied logits) a different verify width can flip a tie, in any server."""
    from asymagent.engine import Engine
    from asymagent.spec_config import SpecConfig
    from asymagent.modeling.loading import load_default_verifier

    tok = load_default_verifier().tokenizer
    verifier = make_tiny_llama(vocab_size=VOCAB, hidden=64, kv_heads=2, seed=0)
    drafter = make_tiny_llama(vocab_size=VOCAB, hidden=64, kv_heads=2, layers=1, seed=1)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=tok, max_sessions=16,
                  spec=SpecConfig(adaptive_k=False))


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return tmp_path_factory.mktemp("ray_traces")


@pytest.fixture(scope="module")
def ray_url(traces):
    from ray import cloudpickle

    from asymagent.integrations.ray_serve.launch import start

    for module in (sys.modules[__name__], conftest):  # test code is not importable in replicas
        cloudpickle.register_pickle_by_value(module)
    server = start(tiny_engine, APP, port=0, replicas=2, replica_cpus=0.5, threads=1,
                   trace={"dir": str(traces), "max_bytes": 2**20})
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def single_url():
    import torch

    from asymagent.integrations.server import create_app
    from test_server import serving

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each replica: same float sums, same greedy tokens
    try:
        with serving(create_app(tiny_engine(), **APP)) as url:
            yield url
    finally:
        torch.set_num_threads(threads)


def post(url: str, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, timeout=180, trust_env=False,
                      headers={"content-type": "application/json"}, **kw)


# Differ between any two runs (ids, timestamps, timings), or with the engine's history: drafts
# come also from the engine's store of earlier responses (suffix drafts), so how many were
# drafted and accepted depends on what that engine served before; the output does not.
VARYING = {"id", "created", "created_at", "asymagent", "drafted_tokens", "accepted_tokens",
           "acceptance_rate", "mean_accepted_len", "accepted_prediction_tokens",
           "rejected_prediction_tokens"}


RANDOM_ID = re.compile(r"^(call|msg|fc|resp|chatcmpl|cmpl)[-_][0-9a-zA-Z]{8,}$")


def normal(data):
    """An answer without the VARYING fields."""
    if isinstance(data, dict):
        return {k: normal(v) for k, v in data.items() if k not in VARYING}
    if isinstance(data, list):
        return [normal(v) for v in data]
    if isinstance(data, str) and RANDOM_ID.match(data):  # ids inside items and events
        return data.split("_")[0] + "_*"
    return data


def answer(url: str, path: str, body, honour_429: bool = False) -> tuple[int, object]:
    r = post(url, path, body)
    for _ in range(20 if honour_429 else 0):  # as the openai client does (max_retries)
        if r.status_code != 429:
            break
        time.sleep(float(r.headers["retry-after"]))
        r = post(url, path, body)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return r.status_code, normal(chunks)
    return r.status_code, normal(r.json())


def first_difference(a, b, where: str = "") -> str | None:
    """The path of the first place two JSON values differ, with both values there (None: equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            found = first_difference(a.get(k), b.get(k), f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} != {b!r}"


def user(text: str) -> list:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


PARITY = [
    ("/v1/chat/completions", {"model": "asymagent", "messages": user("Name three rivers.")}),
    ("/v1/chat/completions", {"model": "asymagent", "messages": user("Weather in Oslo?"),
                              "tools": [WEATHER], "tool_choice": "required", "max_tokens": 24}),
    ("/v1/chat/completions", {"model": "asymagent", "messages": user("Count to five."),
                              "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"model": "asymagent", "messages": user("Any JSON."), "mode": "full",
                              "response_format": {"type": "json_object"}, "max_tokens": 16}),
    ("/v1/completions", {"model": "asymagent", "prompt": "The capital of France is",
                         "max_tokens": 8}),
    ("/v1/completions", {"model": "asymagent", "prompt": "Once upon", "max_tokens": 6,
                         "stream": True}),
    ("/v1/responses", {"model": "asymagent", "input": "Say hello.", "max_output_tokens": 8,
                       "store": False}),
    ("/v1/responses", {"model": "asymagent", "input": "Say bye.", "max_output_tokens": 8,
                       "stream": True, "store": False}),
    ("/v1/chat/completions", {"model": "asymagent", "messages": user("x"), "bogus": 1}),
    ("/v1/chat/completions", {"model": "other", "messages": user("x")}),
    ("/v1/chat/completions", {"model": "asymagent", "messages": [], "max_tokens": 0}),
    ("/v1/chat/completions", b'{"model": "asymagent", "messages": ['),
    ("/v1/chat/completions", {"model": "asymagent", "messages": user("x" * 9000),
                              "max_tokens": 8}),
]


def test_same_answers_as_the_single_server(ray_url, single_url):
    for path, body in PARITY:
        got, want = answer(ray_url, path, body), answer(single_url, path, body)
        assert got == want, (path, first_difference(got, want))
    r = httpx.get(ray_url + "/v1/models", trust_env=False, timeout=30)
    assert r.status_code == 200 and normal(r.json()) == normal(
        httpx.get(single_url + "/v1/models", trust_env=False, timeout=30).json())
    assert httpx.get(ray_url + "/nowhere", trust_env=False, timeout=30).status_code == 404


def test_stored_responses_are_found_on_their_replica(ray_url):
    ids = []
    for i in range(4):  # new conversations: spread over both replicas by load
        r = post(ray_url, "/v1/responses", {"model": "asymagent", "input": f"Topic {i}.",
                                            "max_output_tokens": 4, "stream": i % 2 == 1})
        assert r.status_code == 200, r.text
        if i % 2:
            created = next(json.loads(line[6:]) for line in r.text.splitlines()
                           if line.startswith("data: ") and "response.created" in line)
            ids.append(created["response"]["id"])
        else:
            ids.append(r.json()["id"])
    for rid in ids:
        got = httpx.get(f"{ray_url}/v1/responses/{rid}", trust_env=False, timeout=60)
        assert got.status_code == 200 and got.json()["id"] == rid
        more = post(ray_url, "/v1/responses", {"model": "asymagent", "input": "Go on.",
                                               "previous_response_id": rid, "max_output_tokens": 4})
        assert more.status_code == 200, more.text
        assert more.json()["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_steps_after_the_first_reuse_the_conversations_cache(ray_url):
    before = routed(ray_url)
    convs = [user("Plan a trip."), user("List the files."), user("Fix the bug.")]
    keys = [None, "agent-42", None]
    cached: list[list[int]] = [[] for _ in convs]
    for step in range(3):
        for i, messages in enumerate(convs):  # interleaved, as concurrent agents do
            body = {"model": "asymagent", "messages": messages, "max_tokens": 8}
            if keys[i]:
                body["prompt_cache_key"] = keys[i]
            r = post(ray_url, "/v1/chat/completions", body)
            assert r.status_code == 200, r.text
            cached[i].append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            convs[i] = messages + [r.json()["choices"][0]["message"],
                                   {"role": "user", "content": f"Step {step + 2}, go on."}]
    for steps in cached:
        assert steps[0] == 0 and all(c > 0 for c in steps[1:]), cached
    after = routed(ray_url)
    assert after["new"] - before["new"] == 3 and after["affine"] - before["affine"] == 6


def routed(url: str) -> dict:
    out = {}
    for line in httpx.get(url + "/metrics", trust_env=False, timeout=30).text.splitlines():
        if line.startswith("asymagent:ray_routed_total{"):
            out[line.split('outcome="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_full_replica_answers_429_with_retry_after(ray_url):
    body = {"model": "asymagent", "messages": user("Write a long story."), "max_tokens": 300,
            "prompt_cache_key": "one-busy-conversation"}
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: post(ray_url, "/v1/chat/completions", body), range(12)))
    codes = sorted(r.status_code for r in answers)
    assert set(codes) == {200, 429} and codes.count(200) >= 5, codes
    refused = next(r for r in answers if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "queue_full"


def replica_reports() -> list[dict]:
    from ray import serve

    handle = serve.get_deployment_handle("engine", app_name="asymagent")
    return handle.broadcast("metrics").results(timeout_s=30)


def test_metrics_per_replica_and_total_and_traces_per_replica(ray_url, traces):
    for i in range(4):  # new conversations are balanced by load: both replicas get work
        r = post(ray_url, "/v1/chat/completions",
                 {"model": "asymagent", "messages": user(f"Task {i}."), "max_tokens": 4})
    post(ray_url, "/v1/chat/completions",  # a second step: a prefix-cache hit
         {"model": "asymagent", "max_tokens": 4, "messages": user("Task 3.") + [
             r.json()["choices"][0]["message"], {"role": "user", "content": "Next."}]})
    names = {r["replica"] for r in replica_reports()}
    assert len(names) == 2
    text = httpx.get(ray_url + "/metrics", trust_env=False, timeout=30).text
    per = {}
    for line in text.splitlines():
        if line.startswith("asymagent:generation_tokens_total{"):
            per[line.split('replica="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    assert set(per) == names | {"all"}
    assert per["all"] == sum(v for k, v in per.items() if k != "all") > 0
    assert "asymagent:num_requests_waiting{" in text and "spec_decode_num_accepted_tokens" in text
    hits = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("asymagent:prefix_cache_hits_total{") and 'replica="all"' in line]
    assert hits and hits[0] > 0
    health = httpx.get(ray_url + "/health", trust_env=False, timeout=30).json()
    assert health["status"] == "ok" and health["replicas"] == 2
    dirs = {p.name for p in traces.iterdir()}
    assert dirs and dirs <= {f"replica-{n}" for n in names}
    lines = [json.loads(line) for d in traces.iterdir() for f in d.glob("*.jsonl")
             for line in f.read_text().splitlines()]
    assert lines and all(rec["source"] == "serve" for rec in lines)


def test_a_replica_killed_mid_run_loses_no_request(ray_url, single_url):
    bodies = [{"model": "asymagent", "messages": user(f"Job {i}: summarise."), "max_tokens": 48}
              for i in range(8)]
    want = [answer(single_url, "/v1/chat/completions", b) for b in bodies]
    before = routed(ray_url)
    reports = replica_reports()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(answer, ray_url, "/v1/chat/completions", b, True)
                   for b in bodies]
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and time.monotonic() < deadline:  # a replica with work queued
            busy = [r for r in replica_reports() if r["queue_depth"] > 0]
            victim = busy[0] if busy else None
            if victim is None:
                time.sleep(0.05)
        assert victim is not None, "no replica ever had a queue"
        os.kill(victim["pid"], signal.SIGKILL)
        got = [f.result(timeout=300) for f in futures]
    diffs = [first_difference(g, w, f"[{i}]") for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not diffs, diffs  # every request answered, and answered right (lost ones retried)
    text = httpx.get(ray_url + "/metrics", trust_env=False, timeout=30).text
    retries = next(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                   if l.startswith("asymagent:ray_retries_total{"))
    assert retries >= 1
    # Ray replaces the dead replica; the conversations it held move (served cold, correct).
    import ray.exceptions

    deadline = time.monotonic() + 180
    names: set = set()
    while time.monotonic() < deadline:
        try:
            names = {r["replica"] for r in replica_reports()}
        except ray.exceptions.RayActorError:  # the broadcast reached the killed replica before
            names = set()  # Ray noticed its death: it is still being replaced, ask again
        if len(names) == 2 and victim["replica"] not in names:
            break
        time.sleep(1)
    assert len(names) == 2 and victim["replica"] not in names
    assert routed(ray_url)["moved"] > before.get("moved", 0)
    assert {r["pid"] for r in reports} != {r["pid"] for r in replica_reports()}
