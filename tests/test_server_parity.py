"""OpenAI parity of `asymagent serve`: every request field honoured or refused by name (the table
in docs/serving.md), structured output through the openai client and langchain-openai, log-probs,
cached tokens, /v1/completions, /version, CORS. Real uvicorn on 127.0.0.1, tiny random models with
the real SmolLM2 tokenizer (tests/test_server.py's helpers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel, Field
from test_server import serving, tiny_engine

from asymagent.agents.tools import schema_errors
from asymagent.integrations.server import create_app
from asymagent.integrations.server.completions import CompletionRequest
from asymagent.integrations.server.schemas import ChatCompletionRequest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "serving.md"
USER = [{"role": "user", "content": "Weather in Paris as JSON, please."}]


class Weather(BaseModel):
    """Weather report."""

    city: str = Field(max_length=10)  # bounded: a random model could otherwise never close it
    days: int = Field(ge=1, le=7)


@pytest.fixture(scope="module")
def engine(smollm_tokenizer):
    return tiny_engine(smollm_tokenizer, max_sessions=8)


@pytest.fixture(scope="module")
def server(engine):
    app = create_app(engine, max_queue=8, request_timeout=120, default_max_tokens=16,
                     cors_origins=["http://localhost:3000"], max_model_len=1024)
    with serving(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


def close_bias(tokenizer) -> dict:
    """logit_bias that makes a random model close strings and objects (json_object has no
    bounds of its own; the grammar keeps the output JSON)."""
    ids = {tokenizer.convert_tokens_to_ids(t): b for t, b in (("}", 20), ('"', 30))}
    return {str(k): v for k, v in ids.items()}


# ------------------------------------------------------------------ the field table


def documented_fields() -> dict:
    """{field: (chat?, completions?, text)} from the table in docs/serving.md."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)*) \|\s*(yes)?\s*\|\s*(yes)?\s*\| (.+) \|$", line)
        if m:
            for name in re.findall(r"`([a-z_]+)`", m.group(1)):
                rows[name] = (bool(m.group(2)), bool(m.group(3)), m.group(4))
    return rows


# A value for every field: refused ones get a value that matters, the rest a valid one.
CHAT_VALUES = {
    "model": "asymagent", "messages": USER, "max_tokens": 4, "max_completion_tokens": 4,
    "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 1, "stop": ["zzz"],
    "n": 2, "stream": False, "stream_options": None, "frequency_penalty": 0.5,
    "presence_penalty": 0.5, "logit_bias": {"100": 1.0}, "logprobs": True, "top_logprobs": 2,
    "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
    "parallel_tool_calls": False, "mode": "spec", "user": "u1", "metadata": {"k": "v"},
    "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s",
    "modalities": ["text"], "store": True, "functions": [{"name": "f"}],
    "function_call": "auto", "audio": {"voice": "alloy"}, "prediction": {"type": "content"},
    "reasoning_effort": "low", "verbosity": "low", "web_search_options": {},
    "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False},
    "repetition_penalty": 1.3,
}
COMPLETION_VALUES = {
    "model": "asymagent", "prompt": "Hello", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9,
    "top_k": 5, "min_p": 0.05, "seed": 1, "stop": ["zzz"], "n": 2, "stream": False,
    "stream_options": None, "frequency_penalty": 0.5, "presence_penalty": 0.5,
    "logit_bias": {"100": 1.0}, "logprobs": 2, "echo": True, "mode": "spec", "user": "u1",
    "suffix": "tail", "best_of": 2, "prompt_cache_key": "k", "ignore_eos": True,
    "repetition_penalty": 1.3,
}


def test_the_docs_table_lists_every_request_field():
    rows = documented_fields()
    chat = {n for n, (c, _, _) in rows.items() if c}
    completions = {n for n, (_, c, _) in rows.items() if c}
    assert chat == set(ChatCompletionRequest.model_fields) == set(CHAT_VALUES)
    assert completions == set(CompletionRequest.model_fields) == set(COMPLETION_VALUES)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_field_does_what_the_table_says(server, endpoint):
    rows = documented_fields()
    values = CHAT_VALUES if endpoint == "chat" else COMPLETION_VALUES
    base = {k: values[k] for k in (("model", "messages") if endpoint == "chat" else ("model", "prompt"))}
    base["max_tokens"] = 2
    url = f"{server}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}"
    for name, value in values.items():
        body = {**base, name: value}
        if name == "top_logprobs":
            body["logprobs"] = True
        if name == "stream_options":
            body.update(stream=True, stream_options={"include_usage": True})
        r = httpx.post(url, json=body, timeout=60)
        refused = rows[name][2].startswith("**400**") or "**400** unless" in rows[name][2] \
            or "**400** for" in rows[name][2]
        if refused:
            assert r.status_code == 400, (name, r.text)
            assert r.json()["error"]["param"] == name, (name, r.text)
        else:
            assert r.status_code == 200, (name, r.text)
    r = httpx.post(url, json={**base, "frobnicate": 1}, timeout=60)  # unknown: OpenAI's answer
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    assert "Unrecognized request argument supplied: frobnicate" in r.json()["error"]["message"]


# ------------------------------------------------------------------ structured output


def test_openai_parse_with_a_pydantic_model(client):
    for seed, temperature in ((0, 0.0), (1, 1.0), (2, 1.0)):
        r = client.chat.completions.parse(model="asymagent", messages=USER, max_tokens=40,
                                          response_format=Weather, seed=seed,
                                          temperature=temperature)
        w = r.choices[0].message.parsed
        assert isinstance(w, Weather) and 1 <= w.days <= 7, r.choices[0].message.content


def test_json_schema_not_strict_and_streamed(client):
    schema = Weather.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": False}}
    r = client.chat.completions.create(model="asymagent", messages=USER, max_tokens=40,
                                       response_format=fmt)
    assert schema_errors(json.loads(r.choices[0].message.content), schema) == []
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="asymagent", messages=USER, max_tokens=40, response_format=fmt, stream=True)
        if c.choices)
    assert text == r.choices[0].message.content  # greedy: the stream spells the same JSON


def test_json_object(client, smollm_tokenizer):
    r = client.chat.completions.create(model="asymagent", messages=USER, max_tokens=30,
                                       response_format={"type": "json_object"},
                                       logit_bias=close_bias(smollm_tokenizer))
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_langchain_openai_structured_output_every_method(server, smollm_tokenizer):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server + "/v1", api_key="unused", model="asymagent",
                     max_tokens=40, temperature=0, max_retries=0)
    for method in ("json_schema", "function_calling"):  # json_schema is ChatOpenAI's default
        out = llm.with_structured_output(Weather, method=method).invoke("Weather in Rome?")
        assert isinstance(out, Weather), method
    assert isinstance(llm.with_structured_output(Weather).invoke("Weather in Rome?"), Weather)
    # json_mode: any JSON object, the keys come from the prompt (a random model follows none)
    biased = ChatOpenAI(base_url=server + "/v1", api_key="unused", model="asymagent",
                        max_tokens=40, temperature=0, max_retries=0,
                        logit_bias={int(k): v for k, v in close_bias(smollm_tokenizer).items()})
    out = biased.with_structured_output(None, method="json_mode").invoke("JSON please")
    assert isinstance(out, dict)


# ------------------------------------------------------------------ log-probs, usage


def test_logprobs_stream_and_non_stream_agree(client):
    kw = dict(model="asymagent", messages=USER, max_tokens=12, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) in (r.usage.completion_tokens, r.usage.completion_tokens - 1)  # no EOS
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content).strip() == r.choices[0].message.content  # stripped
    streamed = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content or []
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == \
        [(t.token, round(t.logprob, 4)) for t in content]


def test_langchain_openai_reads_logprobs(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server + "/v1", api_key="unused", model="asymagent",
                     max_tokens=6, logprobs=True, max_retries=0)
    msg = llm.invoke("Hi")
    assert msg.response_metadata["logprobs"]["content"]


def test_cached_tokens_count_the_reused_prefix(client):
    convo = [{"role": "user", "content": "Count the reused prefix, unique text 81723."}]
    first = client.chat.completions.create(model="asymagent", messages=convo, max_tokens=3)
    convo += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    second = client.chat.completions.create(model="asymagent", messages=convo, max_tokens=3)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    stats = second.model_extra["asymagent"]["stats"]
    assert cached == stats["cached_tokens"] >= first.usage.prompt_tokens - 1
    assert cached + stats["verifier_prefill_tokens"] == stats["verifier_context_tokens"]
    details = second.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == stats["accepted"]
    assert details.rejected_prediction_tokens == stats["drafted"] - stats["accepted"]


def test_max_model_len_is_the_context_limit(server):
    r = httpx.post(server + "/v1/chat/completions", timeout=60, json={
        "model": "asymagent", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hello " * 1000}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in r.json()["error"]["message"]


# ------------------------------------------------------------------ /v1/completions


def test_completions_string_ids_batch_and_stream(client, engine):
    text = client.completions.create(model="asymagent", prompt="Once upon a time", max_tokens=6)
    assert text.object == "text_completion" and text.choices[0].finish_reason in ("stop", "length")
    ids = engine.tokenizer.encode("Once upon a time")
    same = client.completions.create(model="asymagent", prompt=ids, max_tokens=6)
    assert same.choices[0].text == text.choices[0].text  # a string and its ids: same prompt
    batch = client.completions.create(model="asymagent", prompt=["Hello", "Goodbye"], max_tokens=3)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.usage.prompt_tokens == len(engine.tokenizer.encode("Hello")) + \
        len(engine.tokenizer.encode("Goodbye"))
    chunks = list(client.completions.create(model="asymagent", prompt="Once upon a time",
                                            max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text.choices[0].text
    assert chunks[-1].usage.completion_tokens == text.usage.completion_tokens


def test_completions_echo_scores_the_prompt(client, engine):
    import torch

    ids = engine.tokenizer.encode("The capital of France is Paris")
    r = client.completions.create(model="asymagent", prompt=ids, max_tokens=0, echo=True,
                                  logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == engine.tokenizer.decode(ids) and lp.token_logprobs[0] is None
    with torch.no_grad():
        logp = torch.log_softmax(engine.verifier(torch.tensor([ids])).logits[0], -1)  # [T, V]
    want = [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    assert lp.text_offset[0] == 0 and len(lp.tokens) == len(ids)


# ------------------------------------------------------------------ /version, CORS


def test_version_and_cors(server, engine):
    from asymagent import __version__

    # the version, then what the engine runs on (issue 30: the weights dtype, the CPU's bf16 unit)
    body = httpx.get(server + "/version").json()
    assert body == {"version": __version__, **engine.runtime}
    assert body["dtype"] == "float32"  # the tiny test models are float32
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(server + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    other = httpx.options(server + "/v1/chat/completions",
                          headers={**preflight, "Origin": "http://evil.example"})
    assert other.headers.get("access-control-allow-origin") is None
    with serving(create_app(engine)) as plain:  # CORS is opt-in: no origins, no CORS headers
        r = httpx.options(plain + "/v1/chat/completions", headers=preflight)
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


# ------------------------------------------------------------------ n choices


def test_n_choices_use_seed_plus_i(client):
    kw = dict(model="asymagent", messages=USER, max_tokens=6, temperature=1.0)
    many = client.chat.completions.create(n=3, seed=40, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):  # choice i is the n=1 answer with seed + i
        alone = client.chat.completions.create(seed=40 + i, **kw).choices[0]
        assert choice.message.content == alone.message.content
    stats = many.model_extra["asymagent"]
    assert len(stats) == 3
    assert many.usage.completion_tokens == sum(s["stats"]["new_tokens"] for s in stats)
    texts = ["", ""]
    for chunk in client.chat.completions.create(n=2, seed=40, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert [t.strip() for t in texts] == [c.message.content.strip() for c in many.choices[:2]]


def test_completions_n_orders_choices_by_prompt(client):
    r = client.completions.create(model="asymagent", prompt=["One", "Two"], n=2, max_tokens=3,
                                  temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    alone = client.completions.create(model="asymagent", prompt="Two", max_tokens=3,
                                      temperature=1.0, seed=8)
    assert r.choices[3].text == alone.choices[0].text


def test_ignore_eos_runs_past_the_end_token(client, engine):
    eos = {str(t): 100.0 for t in engine.eos_ids}  # the end token as the only choice
    kw = dict(model="asymagent", messages=USER, max_tokens=5)
    ends = client.chat.completions.create(logit_bias=eos, **kw)
    assert ends.choices[0].finish_reason == "stop" and ends.usage.completion_tokens <= 1
    runs = client.chat.completions.create(logit_bias=eos, extra_body={"ignore_eos": True}, **kw)
    assert runs.choices[0].finish_reason == "length" and runs.usage.completion_tokens == 5
    text = client.completions.create(model="asymagent", prompt="Hi", max_tokens=4,
                                     logit_bias=eos, extra_body={"ignore_eos": True})
    assert text.choices[0].finish_reason == "length"


def test_repetition_penalty_changes_a_repeating_answer(client):
    kw = dict(model="asymagent", prompt="a a a a a a a a", max_tokens=12, temperature=0.0)
    plain = client.completions.create(**kw).choices[0].text
    strong = client.completions.create(extra_body={"repetition_penalty": 5.0}, **kw)
    assert strong.choices[0].text != plain  # greedy, so only the penalty can change it
    one = client.completions.create(extra_body={"repetition_penalty": 1.0}, **kw)
    assert one.choices[0].text == plain


def test_chat_template_kwargs_reach_the_template(smollm_tokenizer):
    import copy

    tokenizer = copy.deepcopy(smollm_tokenizer)
    tokenizer.chat_template = "{% if shout %}SHOUT LOUDLY {% endif %}" + tokenizer.chat_template
    app = create_app(tiny_engine(tokenizer), default_max_tokens=2, request_timeout=120)
    with serving(app) as url:
        def ask(**extra) -> dict:
            r = httpx.post(url + "/v1/chat/completions", timeout=60,
                           json={"model": "asymagent", "messages": USER, **extra})
            assert r.status_code == 200, r.text
            return r.json()

        plain = ask()
        shout = ask(chat_template_kwargs={"shout": True})
        unread = ask(chat_template_kwargs={"enable_thinking": False})  # the template ignores it
    assert shout["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    assert shout["asymagent"]["stats"]["full_context_tokens"] == shout["usage"]["prompt_tokens"]
    assert unread["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


@pytest.mark.parametrize("name, value", [("use_beam_search", True), ("min_tokens", 4),
                                         ("guided_json", {"type": "object"})])
def test_other_vllm_extras_are_refused_by_name(server, name, value):
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"model": "asymagent", "messages": USER, "max_tokens": 2, name: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == name
    assert f"Unrecognized request argument supplied: {name}" in r.json()["error"]["message"]
