"""ChatAsymSpec as ChatOpenAI/ChatOllama users expect it: construction from model/drafter, unknown
arguments warned into model_kwargs exactly as ChatOpenAI does, with_structured_output's three
methods under a grammar, log-probs, and async methods that leave the event loop running."""

from __future__ import annotations

import asyncio
import threading
import warnings

import pytest
from conftest import make_tiny_llama
from pydantic import BaseModel, Field
from test_langchain import tiny_engine

from asymagent.integrations.langchain import ChatAsymSpec


class Weather(BaseModel):
    """Weather report."""

    city: str = Field(max_length=10)  # bounded: a random model could otherwise never close it
    days: int = Field(ge=1, le=7)


def llm(**kw) -> ChatAsymSpec:
    return ChatAsymSpec(engine=tiny_engine(), max_tokens=kw.pop("max_tokens", 40), **kw)


def caught(make):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = make()
    return model, [str(w.message) for w in seen]


def test_unknown_arguments_behave_exactly_as_in_chat_openai():
    from langchain_openai import ChatOpenAI

    for extra in ({"temprature": 0.5}, {"max_token": 8}):
        ours, ours_warned = caught(lambda: ChatAsymSpec(engine=tiny_engine(), **extra))
        theirs, theirs_warned = caught(lambda: ChatOpenAI(model="gpt-4o", api_key="x", **extra))
        assert ours.model_kwargs == theirs.model_kwargs == extra
        name = next(iter(extra))
        assert any(f"{name} was transferred to model_kwargs" in w for w in ours_warned)
        assert [w for w in ours_warned if name in w] == [w for w in theirs_warned if name in w]
        with pytest.raises(ValueError, match=f"unsupported generation arguments: \\['{name}'\\]"):
            ours.invoke("hi")  # as the API answers ChatOpenAI's misspelt argument with a 400
    # A field given twice (explicitly and in model_kwargs) is an error in both.
    with pytest.raises(ValueError, match="supplied twice"):
        ChatAsymSpec(engine=tiny_engine(), temperature=0.1, model_kwargs={"temperature": 0.2})
    with pytest.raises(ValueError, match="supplied twice"):
        ChatOpenAI(model="gpt-4o", api_key="x", temperature=0.1, model_kwargs={"temperature": 0.2})
    named = ChatAsymSpec(engine=tiny_engine(), model="x")  # with an engine, model only names it
    assert named.model_name == named.model == "x"


def test_model_and_drafter_build_the_engine_like_chat_ollama(tmp_path, smollm_tokenizer):
    path = tmp_path / "verifier"
    make_tiny_llama(vocab_size=49152, seed=5).save_pretrained(path)
    smollm_tokenizer.save_pretrained(path)
    a = ChatAsymSpec(model=str(path), drafter="layers:1", max_tokens=4)
    b = ChatAsymSpec(model=str(path), drafter="layers:1", mode="spec", max_tokens=4)
    assert a.engine is b.engine  # one engine per source, shared
    assert len(a.engine.drafter.model.layers) == 1 and a.model_name == str(path)
    assert a.invoke("Hello").usage_metadata["output_tokens"] >= 1
    assert ChatAsymSpec(model=str(path), mode="full").engine.drafter is None
    with pytest.raises(ValueError, match="has no drafter"):
        ChatAsymSpec(model=str(path), mode="asym")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_is_always_valid(method):
    for seed in range(3):
        model = llm(temperature=1.0 if seed else 0.0, seed=seed)
        out = model.with_structured_output(Weather, method=method).invoke("Weather in Rome?")
        assert isinstance(out, Weather) and 1 <= out.days <= 7
        as_dict = model.with_structured_output(Weather.model_json_schema(), method=method)
        assert set(as_dict.invoke("Weather?")) == {"city", "days"}
    chunks = list(llm().with_structured_output(Weather, method=method).stream("Weather?"))
    assert chunks and all(isinstance(c, Weather) for c in chunks)
    raw = llm().with_structured_output(Weather, method=method, include_raw=True).invoke("Hi")
    assert isinstance(raw["parsed"], Weather) and raw["parsing_error"] is None


def test_default_method_is_json_schema_and_json_mode_gives_an_object(smollm_tokenizer):
    model = llm()
    bound = model.with_structured_output(Weather).first  # the RunnableBinding before the parser
    assert bound.kwargs["response_format"]["type"] == "json_schema"
    close = {smollm_tokenizer.convert_tokens_to_ids(t): b for t, b in (("}", 20.0), ('"', 30.0))}
    out = llm(logit_bias=close).with_structured_output(None, method="json_mode").invoke("JSON")
    assert isinstance(out, dict)
    with pytest.raises(ValueError, match="strict"):
        model.with_structured_output(Weather, method="json_mode", strict=True)


def test_logprobs_in_response_metadata():
    msg = llm(logprobs=True, top_logprobs=2, max_tokens=6).invoke("Hi")
    content = msg.response_metadata["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in content)
    assert "logprobs" not in llm(max_tokens=4).invoke("Hi").response_metadata


class Spy:
    """The engine, recording on which thread each chat runs and how far a concurrent ticker
    on the event loop got meanwhile."""

    def __init__(self, engine, ticks: list):
        self.engine, self.ticks, self.calls = engine, ticks, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def chat(self, **kw):
        start = self.ticks[0]
        result = self.engine.chat(**kw)
        self.calls.append((threading.get_ident(), self.ticks[0] - start))
        return result


def test_async_methods_never_block_the_event_loop():
    ticks = [0]
    spy = Spy(tiny_engine(), ticks)
    model = ChatAsymSpec(engine=spy, max_tokens=24, mode="spec")

    async def main():
        loop_thread = threading.get_ident()
        done = asyncio.Event()

        async def ticker():
            while not done.is_set():
                ticks[0] += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await model.ainvoke("Hello")
        chunks = [c async for c in model.astream("Hello")]
        done.set()
        await tick
        return loop_thread, chunks

    loop_thread, chunks = asyncio.run(main())
    assert chunks and chunks[-1].chunk_position == "last"
    assert len(spy.calls) == 2  # ainvoke, astream (abatch: the langchain-tests suite, slow)
    for thread, progressed in spy.calls:
        assert thread != loop_thread  # the engine ran on a worker thread ...
        assert progressed > 0  # ... while the event loop kept running other tasks


def test_a_failed_call_drops_its_cache_session_and_the_next_call_works():
    """A call that fails inside the engine leaves its session in an unknown state: ChatAsymSpec
    drops it (as the server does), and the next call starts clean with the same answer."""
    model = ChatAsymSpec(engine=tiny_engine(), max_tokens=8, cache_key="drop-test")
    caches = model.engine.caches
    first = model.invoke("hi").content
    held = len(caches)  # the session "drop-test" is among them
    with pytest.raises(ValueError, match="logit_bias"):
        model.invoke("hi", logit_bias={10**9: 1.0})  # refused by the engine, not LangChain
    assert len(caches) == held - 1
    assert model.invoke("hi").content == first
