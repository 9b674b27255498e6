"""Many callers, one engine: requests run one at a time in arrival order, outputs as if run alone.

One tiny random engine with the real SmolLM2 tokenizer (so chat, tools and ChatAsymSpec work)
is shared by every test. Each test first runs its requests one by one, then the same requests
from 8 threads at once (or from asyncio, or from LangGraph's parallel branches), and compares:
token ids, text, tool calls and streamed tokens must all be equal. Requests share the default
cache session on purpose: that is what crashed before the engine serialised requests.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Annotated, TypedDict

import pytest

from asymagent.agents.agent import Agent
from asymagent.agents.tools import Tool
from asymagent.fair_lock import FairLock
from test_engine_models import make_model

V = 49152  # the real SmolLM2 tokenizer's vocabulary
THREADS = 8
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                   "required": ["city"]}}}]


@lru_cache(maxsize=1)
def engine():
    from asymagent.engine import Engine
    from asymagent.modeling.loading import load_default_verifier
    from asymagent.spec_config import SpecConfig

    tok = load_default_verifier().tokenizer
    verifier = make_model(seed=3, vocab=V, hidden=64)
    return Engine(verifier=verifier, drafter=make_model(seed=4, vocab=V, hidden=64, layers=1),
                  tokenizer=tok, spec=SpecConfig(k=3))


def user(text: str) -> list:
    return [{"role": "user", "content": text}]


def chat(text, mode="asym", **kw):
    r = engine().chat(user(text), mode=mode, max_new_tokens=kw.pop("max_new_tokens", 10), **kw)
    return r.token_ids, r.text, [c["function"] for c in r.tool_calls]


def streamed_chat(text, mode):
    seen: list = []
    r = engine().chat(user(text), mode=mode, max_new_tokens=10, temperature=0.9, seed=11,
                      callback=lambda new: seen.extend(new))
    return r.token_ids, seen


def generate(prompt, mode, seed):
    return engine().generate(prompt, mode=mode, max_new_tokens=10, temperature=0.8, seed=seed).token_ids


def langchain_model(**kw):
    from asymagent.integrations.langchain import ChatAsymSpec

    return ChatAsymSpec(engine=engine(), max_tokens=10, **kw)


def lc_invoke(text):
    return langchain_model(mode="spec").invoke(text).content


def lc_stream(text):
    return "".join(c.content for c in langchain_model(mode="asym", temperature=0.7, seed=5).stream(text))


def lc_batch(texts):
    return [m.content for m in langchain_model(mode="full").batch(texts)]


def requests() -> list:
    """(name, function, args): chat in every mode, sampled and greedy, forced tool calls,
    streaming through the callback, token-level generate, ChatAsymSpec invoke/stream/batch."""
    return [
        ("chat-asym", chat, ("Hello there.",)),
        ("chat-full", chat, ("What is 2+2?", "full")),
        ("chat-spec-sampled", lambda t: chat(t, "spec", temperature=0.8, seed=3), ("Name a colour.",)),
        ("chat-tools", lambda t: chat(t, "asym", tools=TOOLS, tool_choice="required",
                                      max_new_tokens=24), ("Weather in Rome?",)),
        ("chat-compressed", chat, ("Say hi.", "compressed")),
        ("stream-callback", streamed_chat, ("Tell me a story.", "asym")),
        ("generate-spec", generate, ([17, 900, 2000, 45, 3, 1280, 77, 64], "spec", 7)),
        ("generate-asym", generate, ([5, 600, 2100, 45, 8, 128, 707, 64, 9], "asym", 8)),
        ("lc-invoke", lc_invoke, ("Good morning.",)),
        ("lc-stream", lc_stream, ("Count to three.",)),
        ("lc-batch", lc_batch, (["Hello", "What is 2+2?", "Name a colour.", "Say hi."],)),
    ]


def run_alone(reqs) -> dict:
    return {name: fn(*args) for name, fn, args in reqs}


def test_threads_mixing_every_kind_of_request_get_their_solo_outputs():
    reqs = requests()
    alone = run_alone(reqs)
    assert alone["stream-callback"][0] == alone["stream-callback"][1]  # streamed == returned
    jobs = reqs * 2  # 22 requests from 8 threads: several queue behind each other
    start = threading.Barrier(THREADS)

    def job(item):
        name, fn, args = item
        return name, fn(*args)

    def first(item):  # the first wave starts together
        start.wait()
        return job(item)

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(first if i < THREADS else job, item) for i, item in enumerate(jobs)]
        results = [f.result(timeout=600) for f in futures]
    for name, out in results:
        assert out == alone[name], name


def test_asyncio_gather_of_eight_chats():
    prompts = [f"Question number {i}: what comes next?" for i in range(THREADS)]

    def one(i):
        return engine().chat(user(prompts[i]), mode=("asym", "spec", "full")[i % 3],
                             max_new_tokens=10, temperature=0.5 * (i % 2), seed=i).token_ids

    alone = [one(i) for i in range(THREADS)]

    async def gather():
        return await asyncio.gather(*(asyncio.to_thread(one, i) for i in range(THREADS)))

    assert asyncio.run(gather()) == alone


def test_langgraph_parallel_branches_share_one_chat_model():
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        answers: Annotated[list, operator.add]

    model = langchain_model(mode="asym")
    prompts = ["Hello", "What is 2+2?", "Name a colour.", "Say hi.", "Good night."]
    alone = {p: model.invoke(p).content for p in prompts}
    graph = StateGraph(State)
    for i, p in enumerate(prompts):  # fan out from START: one superstep, run in parallel
        graph.add_node(f"ask{i}", lambda state, p=p: {"answers": [(p, model.invoke(p).content)]})
        graph.add_edge(START, f"ask{i}")
        graph.add_edge(f"ask{i}", END)
    out = graph.compile().invoke({"answers": []})
    assert dict(out["answers"]) == alone


def test_agents_running_at_once_keep_their_own_conversations():
    calls: list = []

    def get_weather(city: str) -> str:
        """Weather for a city."""
        calls.append(city)
        return f"{city}: sunny"

    weather = Tool.from_schema(TOOLS[0], get_weather)  # bounded city: the call fits the budget
    agent = Agent(engine(), [weather], mode="asym", max_steps=3, max_new_tokens=24,
                  tool_choice=lambda step, messages: "required" if step == 0 else "auto")
    tasks = [f"Weather in city {i}?" for i in range(4)]
    strip = lambda r: (r.answer, r.stopped_reason, no_ids(r.messages), r.notes)
    alone = [strip(agent.run(t)) for t in tasks]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda t: strip(agent.run(t)), tasks))
    assert together == alone
    assert len(calls) >= 8  # step 0 is a forced, schema-valid call in every run


def no_ids(obj):
    """`obj` without tool-call ids (fresh random ids per call, not part of what was decided)."""
    if isinstance(obj, dict):
        return {k: no_ids(v) for k, v in obj.items() if k not in ("id", "tool_call_id")}
    if isinstance(obj, list):
        return [no_ids(v) for v in obj]
    return obj


def test_fair_lock_is_first_come_first_served_and_reentrant():
    lock = FairLock()
    order: list = []
    lock.acquire()
    threads = []
    for i in range(6):
        t = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release()))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while lock.waiting < i + 1:  # thread i is queued before thread i+1 starts
            assert time.monotonic() < deadline
            time.sleep(0.001)
    with lock:  # the holder may take it again
        pass
    lock.release()
    for t in threads:
        t.join(10)
    assert order == list(range(6))
    assert lock.waiting == 0
    with pytest.raises(RuntimeError):
        lock.release()  # not held
