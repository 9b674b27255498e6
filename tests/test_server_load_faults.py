"""`asymagent serve` under a flood of clients and under faults: every request answered, nothing lost,
caches freed, and the next answer the same as a fresh server's.

Real uvicorn on 127.0.0.1 (tests/test_server.py `serving`), tiny random models with the real
SmolLM2 tokenizer; every loop is bounded and every wait has a deadline. Figures are printed as
`RELIABILITY {...}` lines (docs/reliability.md quotes them: `pytest -s`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from asymagent.integrations.loadtest import percentile
from asymagent.integrations.server import create_app
from server_probe import assemble, metric, report, request, sse_events
from test_server import USER, WEATHER, serving, tiny_engine

MODES = ("full", "spec", "asym")


def body_for(i: int, *, max_tokens: int = 8) -> dict:
    """Request i of a mixed workload: prompt, mode, streaming and tools vary with i (greedy)."""
    body = {"model": "asymagent", "max_tokens": max_tokens, "mode": MODES[i % 3],
            "stream": i % 2 == 1,
            "messages": [{"role": "user", "content": f"Request {i}: what is the weather in "
                                                     f"city number {i % 5}?"}]}
    if i % 4 == 2:
        body.update(tools=[WEATHER], tool_choice="required", max_tokens=40)
    elif i % 4 == 3:
        body["tools"] = [WEATHER]
    return body


def gated(engine):
    """Hold the engine worker inside its next generation until `gate` is set; `calls` records
    the first message of every generation the engine actually ran."""
    gate, entered, calls = threading.Event(), threading.Event(), []
    real_chat = engine.chat

    def chat(**kwargs):
        calls.append(kwargs["messages"][-1]["content"])
        entered.set()
        gate.wait(60)  # bounded: the test opens it long before
        return real_chat(**kwargs)

    engine.chat = chat
    return gate, entered, calls


def fresh_answers(tokenizer, bodies: list[dict]) -> list:
    """What a freshly started server (same weights: the tiny models are seeded) answers."""
    app = create_app(tiny_engine(tokenizer), max_queue=4, request_timeout=120)
    with serving(app) as url, httpx.Client(timeout=120) as http:
        return [request(http, url, b) for b in bodies]


def same_answer(a, b) -> bool:
    return (a.status, a.content, a.tool_calls) == (b.status, b.content, b.tool_calls)


def test_flood_of_32_clients_over_a_bounded_queue(smollm_tokenizer):
    engine = tiny_engine(smollm_tokenizer)
    gate, entered, _ = gated(engine)
    max_queue = 8
    app = create_app(engine, max_queue=max_queue, request_timeout=120)
    bodies = [body_for(i) for i in range(32)]
    depths: list[int] = []
    stop = threading.Event()

    def sample_depth() -> None:
        while not stop.is_set():
            depths.append(app.state.worker.depth)
            time.sleep(0.005)

    with serving(app) as url, httpx.Client(timeout=120, limits=httpx.Limits(
            max_connections=64)) as http, ThreadPoolExecutor(32) as pool:
        sampler = threading.Thread(target=sample_depth, daemon=True)
        sampler.start()
        # Phase 1, worker held inside the first generation: the queue fills and the rest of
        # the 32 are refused at once with 429 + Retry-After (deterministic: nothing drains).
        first = [pool.submit(request, http, url, b) for b in bodies]
        assert entered.wait(60)
        deadline = time.monotonic() + 60
        while sum(f.done() for f in first) < 32 - max_queue - 1:
            assert time.monotonic() < deadline, "refusals did not come back"
            time.sleep(0.01)
        refused_at_once = [f.result() for f in first if f.done()]
        gate.set()
        phase1 = [f.result(timeout=120) for f in first]
        # Phase 2, the same 32 clients, worker free: each retries after Retry-After until it
        # is served (at most 30 tries), as an OpenAI client with retries would.

        def until_served(body: dict):
            t0, tries = time.perf_counter(), 0
            while True:
                tries += 1
                out = request(http, url, body)
                if out.status != 429 or tries >= 30:
                    return out, tries, time.perf_counter() - t0
                time.sleep(min(float(out.retry_after), 5.0))

        phase2 = list(pool.map(until_served, bodies))
        stop.set()
        sampler.join(5)
        # Every answer checked against the same request sent alone afterwards: a flood may
        # delay or refuse a request, never mix up or corrupt its answer.
        alone = [request(http, url, b) for b in bodies]
        health = httpx.get(url + "/health").json()

    statuses1 = Counter(o.status for o in phase1)
    assert set(statuses1) <= {200, 429}, statuses1  # none lost, none 500
    assert sum(statuses1.values()) == 32
    assert statuses1[429] >= 32 - max_queue - 1 and statuses1[200] >= max_queue
    assert all(o.status == 429 for o in refused_at_once)
    for o in phase1:
        if o.status == 429:
            assert int(o.retry_after) >= 1 and o.error["code"] == "queue_full"
    assert max(depths) <= max_queue
    assert all(out.status == 200 for out, _, _ in phase2), [o.status for o, _, _ in phase2]
    for o, b, ref in zip(phase1, bodies, alone):
        if o.status == 200:
            assert same_answer(o, ref), (b, o, ref)
    for (o, _, _), b, ref in zip(phase2, bodies, alone):
        assert same_answer(o, ref), (b, o, ref)
    assert health["queue_depth"] == 0
    lat = [t for _, _, t in phase2]
    report("flood", {
        "clients": 32, "max_queue": max_queue,
        "phase1_status": dict(statuses1), "max_queue_depth_seen": max(depths),
        "phase2_tries_total": sum(n for _, n, _ in phase2),
        "phase2_429": sum(n - 1 for _, n, _ in phase2),
        "phase2_latency_p50_s": round(percentile(lat, 50), 3),
        "phase2_latency_p95_s": round(percentile(lat, 95), 3),
        "phase2_latency_max_s": round(max(lat), 3)})


def test_disconnects_slow_readers_then_the_next_answer_is_a_fresh_servers(smollm_tokenizer):
    probe = [body_for(i) for i in range(6)]  # modes x streaming x tools
    reference = fresh_answers(smollm_tokenizer, probe)
    engine = tiny_engine(smollm_tokenizer)
    app = create_app(engine, max_queue=8, request_timeout=120)
    rng = random.Random(0)
    cut_after = [rng.randint(0, 12) for _ in range(12)]  # SSE lines read before hanging up
    with serving(app) as url, httpx.Client(timeout=120) as http:
        before_tokens = metric(url, "asymagent:generation_tokens_total")
        for i, n in enumerate(cut_after):
            # Sampled (seeded) and long: it cannot finish before the client leaves.
            body = {"model": "asymagent", "stream": True, "max_tokens": 1500,
                    "temperature": 1.0, "seed": i, "mode": MODES[i % 3],
                    "messages": [{"role": "user", "content": f"Tell story number {i}."}]}
            with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                for j, _ in enumerate(r.iter_lines()):
                    if j >= n:
                        break  # leaving the block closes the connection mid-stream
        deadline = time.monotonic() + 60
        while app.state.worker.depth or metric(url, "asymagent:num_requests_running"):
            assert time.monotonic() < deadline, "a dropped stream kept the worker busy"
            time.sleep(0.05)
        time.sleep(0.3)  # the last cancelled generation returns after its current round
        # Every dropped generation was stopped and its conversation's caches freed.
        assert len(engine.caches) == 0
        aborted = metric(url, "asymagent:request_aborted_total")
        assert metric(url, "asymagent:generation_tokens_total") == before_tokens
        # A slow reader (one SSE line per 20 ms) gets the whole answer, equal to the
        # non-streamed one, while a fast client is served in between.
        slow_body = {**body_for(1), "max_tokens": 24}
        slow = {}

        def read_slowly() -> None:
            with httpx.stream("POST", url + "/v1/chat/completions", json=slow_body,
                              timeout=120) as r:
                lines = []
                for line in r.iter_lines():
                    lines.append(line)
                    time.sleep(0.02)
                slow["answer"] = assemble(sse_events(lines))

        reader = threading.Thread(target=read_slowly, daemon=True)
        reader.start()
        fast = request(http, url, probe[0])
        reader.join(120)
        whole = request(http, url, {**slow_body, "stream": False})
        assert slow["answer"][0] == whole.content and slow["answer"][2] is None
        after = [request(http, url, b) for b in probe]
    assert same_answer(fast, reference[0])
    for got, ref, b in zip(after, reference, probe):
        assert same_answer(got, ref), (b, got, ref)
    report("disconnects", {"streams_dropped": len(cut_after), "lines_read": cut_after,
                           "aborted_metric": aborted, "sessions_left": 0,
                           "answers_equal_fresh_server": f"{len(probe)}/{len(probe)}"})


def test_request_cancelled_while_queued_never_runs(smollm_tokenizer):
    probe = [body_for(0), body_for(2)]
    reference = fresh_answers(smollm_tokenizer, probe)
    engine = tiny_engine(smollm_tokenizer)
    gate, entered, calls = gated(engine)
    app = create_app(engine, max_queue=4, request_timeout=120)
    with serving(app) as url, ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, url + "/v1/chat/completions", json=body_for(0),
                              timeout=120)
        assert entered.wait(60)
        leaving = {**body_for(4), "messages": [{"role": "user", "content": "I will leave."}]}
        try:  # queued behind the held request; the client gives up after 1 s
            httpx.post(url + "/v1/chat/completions", json=leaving, timeout=1.0)
            raise AssertionError("the queued request was answered while the worker was held")
        except httpx.TimeoutException:
            pass
        assert app.state.worker.depth == 1
        time.sleep(0.6)  # the server notices a disconnect within 0.25 s
        gate.set()
        assert running.result(timeout=120).status_code == 200
        with httpx.Client(timeout=120) as http:
            after = [request(http, url, b) for b in probe]
        assert app.state.worker.depth == 0
    assert "I will leave." not in calls  # skipped by the worker: no generation, no caches
    for got, ref in zip(after, reference):
        assert same_answer(got, ref)


def test_engine_failure_mid_generation_is_a_clean_500_and_frees_caches(smollm_tokenizer):
    """Not a client error, so a 500, but one without internals, and the server recovers."""
    probe = [body_for(0), body_for(3)]
    reference = fresh_answers(smollm_tokenizer, probe)
    engine = tiny_engine(smollm_tokenizer)
    real_chat = engine.chat

    def failing_chat(**kwargs):
        if "fail" not in kwargs["messages"][-1]["content"]:
            return real_chat(**kwargs)
        rounds = [0]
        request = kwargs["request"]  # the server's typed request carries the callback
        callback = request.callback

        def breaking(ids):
            rounds[0] += 1
            if rounds[0] == 3:  # fails inside decoding, with the caches half way
                raise RuntimeError("tensor mismatch at /usr/lib/python3/site-packages/torch/"
                                   "nn/modules/module.py:1751")
            return callback(ids)

        return real_chat(**{**kwargs, "request": request.replace(callback=breaking)})

    engine.chat = failing_chat
    app = create_app(engine, max_queue=4, request_timeout=120)
    with serving(app) as url, httpx.Client(timeout=120) as http:
        for stream in (False, True):
            body = {**probe[0], "stream": stream, "max_tokens": 64, "temperature": 1.0,
                    "seed": 1, "messages": [{"role": "user", "content": "please fail"}]}
            out = request(http, url, body)
            error = out.error
            assert error is not None and error["type"] == "server_error", out
            assert "/usr" not in error["message"] and ".py" not in error["message"]
            assert len(engine.caches) == 0
        after = [request(http, url, b) for b in probe]
        assert httpx.get(url + "/health").status_code == 200
    for got, ref in zip(after, reference):
        assert same_answer(got, ref)
