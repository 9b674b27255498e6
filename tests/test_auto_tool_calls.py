"""tool_choice "auto" on the reference pair's family (issue 57): a call is held to the tools from its marker
on (a doubled-brace call `{{'name': ...}}}` in any spelling of its keys too), what the family never
writes in an answer (an echo of the tool list) cannot start, the parser never takes a definition for a call, streamed == non-streamed, and Responses and
chat completions render the same prompt. Tiny random qwen2 models with the SmolLM2 vocabulary and
Qwen2.5's own chat template (tests/test_server_responses.py), made to "want" a text by a scripted
logit processor (tests/scripted_model.py); the real openai client against a real server."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import make_tiny_qwen2
from scripted_model import scripted
from test_server import serving
from test_server_responses import QWEN25_TEMPLATE

from asymagent.chat.auto_tool_constraint import AutoToolConstraint
from asymagent.chat.output_parsing import parse_output
from asymagent.evals.probes.framework_matrix import streamed

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["tz"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ECHO = ("<tools>\n" + json.dumps(WEATHER) + "\n</tools>\n"
        '{{"name": "get_weather", "arguments": {"city": "Paris"}}}')
# what the pair wrote under auto (2026-12-07, `serve --pair qwen2.5-coder`): its call in a tag of its own
PAIR_JSON = ('<json>\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n'
             '</json>')
PRETTY_HELD = ('<json>\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n'
               '</json>')  # the pair's layout with its arguments compact, as the grammar holds it
JSON_WRAPPED = '<json>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</json>'
ANSWER, SORRY = "It is 18 C and sunny in Paris.", "Sorry, the weather service failed."
QUESTION = [{"role": "user", "content": "What's the weather in Paris? Answer in one sentence."}]
CALL_SYNTAX = ("<tool_call>", "</tool_call>", "<tools>", "</tools>", '{"name"', '{{"', "{{'", "{{name")
# what the pair wrote under auto after a tool's result and with two tools (2026-12-07, `serve
# --pair`, the framework matrix): the call doubled in braces, its keys spelled its own way
PAIR_PY = "{{'name': 'get_weather', 'arguments': {'city': 'Paris'}}}"
PAIR_LT = '<{{name": "get_weather", "arguments": {"city": "Paris"}}}>'
PY_HELD = "{{'name': 'get_weather', 'arguments': {\"city\": \"Paris\"}}}"  # as the grammar holds it


def pair_script(prompt: str) -> str:
    """The pair's turn: a call to get_weather(Paris) after a question, an answer after its result."""
    last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
    if "<tool_response>" not in last_user:
        return CALL
    return SORRY if "error" in last_user.lower() else ANSWER


@pytest.fixture(scope="module")
def qwen_tok(smollm_tokenizer):
    tok = copy.deepcopy(smollm_tokenizer)
    tok.chat_template = QWEN25_TEMPLATE
    return tok


def qwen_engine(tok, max_num_seqs: int = 1):
    from asymagent.engine import Engine

    verifier = make_tiny_qwen2(vocab_size=len(tok), max_positions=4096, seed=0)
    drafter = make_tiny_qwen2(vocab_size=len(tok), layers=1, max_positions=4096, seed=1)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=tok, max_sessions=8,
                  max_num_seqs=max_num_seqs)


@pytest.fixture(scope="module")
def engine(qwen_tok):
    return qwen_engine(qwen_tok)


# ------------------------------------------------------------------------------ the grammar


def walk(constraint, tok, text: str) -> str:
    """How far `text` gets under `constraint`: "ok", or the prefix at which it was refused."""
    constraint.reset()
    ids = tok.encode(text, add_special_tokens=False)
    for n, t in enumerate(ids):
        if not constraint.advance(t):
            return tok.decode(ids[: n + 1])
    return "ok"


def test_auto_grammar_is_free_text_or_a_held_call(qwen_tok):
    c = AutoToolConstraint(qwen_tok, [WEATHER, TIME])
    assert c.hermes and c.tool_names == ["get_weather", "get_time"]
    assert walk(c, qwen_tok, "The weather in Paris is mild, <b>really</b> {ok}.") == "ok"
    assert walk(c, qwen_tok, "Sure.\n" + CALL) == "ok" and c.is_completed()
    assert qwen_tok.decode(c.forced_tokens()) == "<|im_end|>"  # one call, then the turn ends
    assert walk(c, qwen_tok, '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}') == "ok"
    for refused in ("<tools>", "<tool_response>", "</tool_call>"):
        assert walk(c, qwen_tok, "ok " + refused + " more") != "ok", refused
    assert walk(c, qwen_tok, 'x {{"name": "get_wind"') != "ok"  # a doubled call is held (below)
    # from the marker on: only a tool's name, only arguments valid against its schema
    assert walk(c, qwen_tok, '<tool_call>\n{"name": "get_wind"') != "ok"
    assert walk(c, qwen_tok, '<tool_call>\n{"name": "get_weather", "arguments": {"type": "object"}}') \
        != "ok"
    assert walk(c, qwen_tok, '<tool_call>\n{"name": "get_time", "arguments": {"tz": "PST"}}') != "ok"
    assert walk(c, qwen_tok, '{"name": "get_weather", "description": "x"}') != "ok"  # a definition
    c.reset()  # jump-forward: the object's layout is the model's, then the head is forced
    for t in qwen_tok.encode('<tool_call>\n{"name"', add_special_tokens=False):
        c.advance(t)
    assert qwen_tok.decode(c.forced_tokens()).startswith(': "get')


@pytest.mark.parametrize("tag", ["", "<json>\n", "<result>", "```json\n", "Sure. <call id=\"1\">\n"])
@pytest.mark.parametrize("opening", ["", " ", "\n", "\n  ", "\n    ", "\n\t"])
def test_a_call_opens_the_grammar_inside_any_tag_and_layout(qwen_tok, tag, opening):
    """`{` + whitespace + `"name"` after any text or tag of the model's own starts a held call:
    only a tool's name, only schema-valid (compact) arguments; the layout of the object's keys
    follows its opening; code with braces stays free text."""
    c = AutoToolConstraint(qwen_tok, [WEATHER, TIME], parallel=True)
    head = tag + "{" + opening + '"name"'
    between = opening or " "
    call = head + ': "get_weather",' + between + '"arguments": {"city": "Paris"}' + \
        ("\n}" if opening.startswith("\n") else " }" if opening else "}")
    assert walk(c, qwen_tok, call) == "ok"
    out = parse_output(call + ("\n</" + tag[1:tag.index(">")] + ">" if tag.startswith("<") else ""),
                       ["get_weather", "get_time"])
    assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in out.tool_calls] \
        == [("get_weather", {"city": "Paris"})] and out.content in ("", "Sure.")
    assert walk(c, qwen_tok, head + ': "get_wind"') != "ok"
    assert walk(c, qwen_tok, head + ': "get_weather",' + between + '"arguments": {"type": "object"') \
        != "ok"
    assert walk(c, qwen_tok, head + ': "get_weather",' + between + '"arguments": {\n    "city"') \
        != "ok"  # arguments compact, as json.dumps writes them
    assert walk(c, qwen_tok, tag + "int f() {\n  return 1;\n}") == "ok"


def test_parallel_and_the_bare_family(qwen_tok, smollm_tokenizer):
    par = AutoToolConstraint(qwen_tok, [WEATHER], parallel=True)
    assert walk(par, qwen_tok, CALL + "\n" + CALL) == "ok"
    bare = AutoToolConstraint(smollm_tokenizer, [WEATHER])  # SmolLM2: calls as bare objects
    assert not bare.hermes
    assert walk(bare, smollm_tokenizer, 'Hi.\n{"name": "get_weather", "arguments": {"city": "Oslo"}}') \
        == "ok"
    assert walk(bare, smollm_tokenizer, '{"name": "get_weather", "parameters": {') != "ok"
    assert walk(bare, smollm_tokenizer, 'x {{"name"') != "ok"


DOUBLED_SPELLINGS = [  # (the model's start, the rest as the grammar holds it, one tool offered)
    ("{{'name'", ": 'get_weather', 'arguments': {\"city\": \"Paris\"}}}"),
    ("{{ 'name'", ": 'get_weather', 'arguments': {\"city\": \"Paris\"} }}"),
    ('{{"name"', ': "get_weather", "arguments": {"city": "Paris"}}}'),
    ('{{ "name"', ': "get_weather", "arguments": {"city": "Paris"}}}'),
    ("{{name", ': "get_weather", arguments: {"city": "Paris"}}}'),
    ("{{ name", ': "get_weather", arguments: {"city": "Paris"}}}'),
    ('<{{name"', ': "get_weather", "arguments": {"city": "Paris"}}}'),
    ('Sure, {{name"', ': "get_weather", "arguments": {"city": "Paris"} }}'),
    ("{{name", '="get_weather", arguments={"city": "Paris"}}}'),  # keyword arguments (fix57b)
]
JINJA = "In the template write {{ name }}, {{name}} or {{ 'name' | upper }}; {{ user.name }} too."


@pytest.mark.parametrize("start, rest", DOUBLED_SPELLINGS)
def test_a_doubled_brace_call_is_held_from_its_start_in_any_spelling(qwen_tok, start, rest):
    """The pair's doubled-brace calls (`{{'name'`, `<{{name"`, `{{name:`): from the name key's
    colon on, the rest is held to a tool's name and compact JSON arguments valid against its
    schema, in the key spelling the model started, closed by `}}`; jump-forward writes the head;
    the parser reads exactly that call with no content left."""
    c = AutoToolConstraint(qwen_tok, [WEATHER, TIME])
    assert walk(c, qwen_tok, start + rest) == "ok" and c.is_completed()
    assert qwen_tok.decode(c.forced_tokens()) == "<|im_end|>"  # one call, then the turn ends
    out = parse_output(start + rest, ["get_weather", "get_time"])
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in out.tool_calls] == \
        [("get_weather", '{"city": "Paris"}')] and out.content in ("", "Sure,")
    assert not out.invalid_tool_calls
    name_at = rest.index("get_weather")
    assert walk(c, qwen_tok, start + rest[:name_at] + "get_wind") != "ok"  # only a tool's name
    args_at = rest.index("{")
    assert walk(c, qwen_tok, start + rest[:args_at] + "{'city'") != "ok"  # JSON, no Python dict
    assert walk(c, qwen_tok, start + rest[:args_at] + '{"town"') != "ok"  # the schema's keys
    assert walk(c, qwen_tok, start + rest + "}") != "ok"  # closed: nothing more
    one = AutoToolConstraint(qwen_tok, [WEATHER])
    walk(one, qwen_tok, start + rest[0])
    assert qwen_tok.decode(one.forced_tokens()).startswith(rest[1:args_at])  # the head, forced


def test_a_template_expression_in_an_answer_stays_free_text(qwen_tok):
    """Jinja's `{{ name }}` (no colon after the key) is no call: free text for the grammar, content
    for the parser and the streamer; a doubled call only where the name key's colon follows."""
    from types import SimpleNamespace

    from asymagent.integrations.server.deltas import DeltaStreamer

    c = AutoToolConstraint(qwen_tok, [WEATHER, TIME])
    assert walk(c, qwen_tok, JINJA) == "ok"
    out = parse_output(JINJA, ["get_weather", "get_time"])
    assert out.content == JINJA and not out.tool_calls and not out.invalid_tool_calls
    for piece in (1, 4):
        s = DeltaStreamer(tools_enabled=True)
        deltas = [d for i in range(0, len(JINJA), piece) for d in s.push(JINJA[i:i + piece])]
        deltas += s.finish(SimpleNamespace(text=out.content, tool_calls=[]))
        assert "".join(d["content"] for d in deltas) == JINJA and s.calls == []
    bare = AutoToolConstraint(qwen_tok, [WEATHER], hermes=False)  # templates that ignore tools
    assert walk(bare, qwen_tok, 'x {{"name"') != "ok" and walk(bare, qwen_tok, JINJA) == "ok"


# ------------------------------------------------------------------------------ the parser


def test_a_doubled_call_with_python_arguments_is_kept_as_an_invalid_call():
    """Unconstrained, the pair's `{{'name': ..., 'arguments': {'city': 'Paris'}}}` is not JSON: the
    text stays, an invalid_tool_calls entry says why (under auto the grammar makes it JSON)."""
    out = parse_output(PAIR_PY, ["get_weather"])
    assert out.tool_calls == [] and out.content == PAIR_PY
    assert [i["error"].split(":")[0] for i in out.invalid_tool_calls] == ["malformed JSON"]


def test_a_definition_is_never_a_call():
    names = ["get_weather"]
    fn = WEATHER["function"]
    echoed = parse_output(ECHO, names)  # the transcript: echo, then a doubled call
    assert echoed.content == "" and not echoed.invalid_tool_calls
    assert [json.loads(c["function"]["arguments"]) for c in echoed.tool_calls] == [{"city": "Paris"}]
    for definition in (json.dumps(fn), json.dumps(WEATHER),
                       json.dumps({"name": fn["name"], "arguments": fn["parameters"]}),
                       "<tool_call>\n" + json.dumps({"name": fn["name"], "parameters": fn["parameters"]})
                       + "\n</tool_call>"):
        out = parse_output(definition, names)
        assert out.tool_calls == [] and out.content == "" and not out.invalid_tool_calls, definition
    assert parse_output("<tools>\n\n</tools>", names).content == ""
    assert parse_output("<tool_call>\n\n</tool_call>Done.", names).content == "Done."
    other = parse_output('{"name": "get_wind", "arguments": {}}', names)
    assert not other.tool_calls and "get_wind" in other.invalid_tool_calls[0]["error"]


PARIS = [("get_weather", {"city": "Paris"})]
WRAPPED = [  # (model text, content, calls): wrappers around or beside a call are no content
    (PAIR_JSON, "", PARIS),
    (JSON_WRAPPED, "", PARIS),
    ('<json>{"name": "get_weather", "arguments": {"city": "Paris"}}</json>', "", PARIS),
    ('<json>\n\n</json>\n' + CALL, "", PARIS),
    (CALL + "\n<json>\n\n</json>", "", PARIS),
    ('<result type="call">\n' + CALL + '\n</result>', "", PARIS),
    ("```json\n\n```\n" + CALL, "", PARIS),
    ("```json\n" + JSON_WRAPPED + "\n```", "", PARIS),
    ("Let me check.\n<json>\n" + CALL + "\n</json>\nDone.", "Let me check.\n\nDone.", PARIS),
    ("The answer is <b>42</b>\n" + CALL, "The answer is <b>42</b>", PARIS),
    ("```py\nx = 1\n```\n" + CALL, "```py\nx = 1\n```", PARIS),
    ("<json>\n\n</json>", "", []),  # nothing but a wrapper: no content
    ("```\n```", "", []),
    ("Use <br></br> here.", "Use <br></br> here.", []),  # away from a call: content
    ("A <i>\n</i> B", "A <i>\n</i> B", []),
    (PAIR_LT, "", PARIS),  # the pair's doubled calls, its spellings, as the grammar holds them
    (PAIR_LT[:-1], "", PARIS),
    (PY_HELD, "", PARIS),
    ('{{name: "get_weather", arguments: {"city": "Paris"}}}', "", PARIS),
    ("<json>\n" + PY_HELD + "\n</json>", "", PARIS),
    ("Let me check.\n" + PY_HELD, "Let me check.", PARIS),
    ("Sure, " + PY_HELD + " Done.", "Sure,  Done.", PARIS),
    (JINJA, JINJA, []),
    (CALL + "\n" + PY_HELD, "", PARIS * 2),  # parallel calls: a Hermes block, then a doubled one
]


@pytest.mark.parametrize("text, content, calls", WRAPPED)
def test_wrappers_around_a_call_are_no_content(text, content, calls):
    out = parse_output(text, ["get_weather"])
    assert out.content == content and not out.invalid_tool_calls
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in out.tool_calls] == calls
    assert parse_output("<b></b>").content == "<b></b>"  # without tools the text is the text


# ------------------------------------------------------------------------------ the engine


def test_a_model_that_wants_to_echo_the_tool_list_cannot(engine, qwen_tok, monkeypatch):
    scripted(monkeypatch, qwen_tok, lambda prompt: ECHO)
    free = engine.chat(QUESTION, max_new_tokens=24, mode="full", cache_key="echo-free")
    assert free.text.startswith("<tools>")  # unconstrained (no tools) the script is followed
    for mode in ("full", "spec", "asym"):
        out = engine.chat(QUESTION, tools=[WEATHER], max_new_tokens=24, mode=mode,
                          cache_key=f"echo-{mode}")
        raw = qwen_tok.decode(out.token_ids)
        assert "<tools>" not in raw and '{{"' not in raw, (mode, raw)


@pytest.mark.parametrize("tools", [[WEATHER], [WEATHER, TIME]])
def test_the_scripted_call_is_held_and_identical_in_every_mode(engine, qwen_tok, monkeypatch, tools):
    scripted(monkeypatch, qwen_tok, pair_script)
    runs = {}
    for mode in ("full", "spec", "asym"):
        out = engine.chat(QUESTION, tools=tools, max_new_tokens=64, mode=mode,
                          cache_key=f"call-{mode}-{len(tools)}")
        assert out.finish_reason == "tool_calls" and out.text == "", mode
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in out.tool_calls] == [("get_weather", {"city": "Paris"})]
        runs[mode] = out.token_ids
    assert runs["spec"] == runs["full"] == runs["asym"]  # greedy: speculation is lossless
    sampled = [engine.chat(QUESTION, tools=tools, max_new_tokens=64, mode="spec", temperature=0.8,
                           seed=7, cache_key=f"seed-{i}-{len(tools)}").token_ids for i in range(2)]
    assert sampled[0] == sampled[1]  # same seed, same output


def test_the_pairs_wrapped_pretty_call_is_held_in_every_mode(engine, qwen_tok, monkeypatch):
    """The pair's layout (a call pretty-printed inside `<json>`, 2026-12-07) is decoded under the
    grammar: scripted to call a tool that does not exist, the model can only name an offered one;
    scripted to the held layout, the call comes out token-identical in every mode, no content."""
    wind = PRETTY_HELD.replace("get_weather", "get_wind")
    scripted(monkeypatch, qwen_tok, lambda prompt: wind)
    out = engine.chat(QUESTION, tools=[WEATHER], max_new_tokens=40, mode="full", cache_key="wind")
    raw = qwen_tok.decode(out.token_ids)
    assert "get_wind" not in raw and raw.startswith('<json>\n{\n  "name": "get_weather"'), raw
    scripted(monkeypatch, qwen_tok, lambda prompt: PRETTY_HELD)
    runs = {}
    for mode in ("full", "spec", "asym"):
        out = engine.chat(QUESTION, tools=[WEATHER], max_new_tokens=64, mode=mode,
                          parallel_tool_calls=True, cache_key=f"pretty-{mode}")
        assert out.text == "" and [(c["function"]["name"], c["function"]["arguments"])
                                   for c in out.tool_calls] == [("get_weather", '{"city": "Paris"}')]
        runs[mode] = out.token_ids
    assert runs["spec"] == runs["full"] == runs["asym"]
    assert qwen_tok.decode(runs["full"]).startswith(PRETTY_HELD)


def test_a_model_that_starts_a_doubled_call_gets_a_valid_one_in_every_mode(engine, qwen_tok,
                                                                          monkeypatch):
    """Scripted to the pair's own doubled-brace calls: with Python-dict arguments the model can
    only write them as schema-valid JSON (a call, no content); with a tool that does not exist it
    can only name an offered one; teacher-forced to `<{{name": ...}}}>` the call comes out whole
    and token-identical in full, spec and asym; sampled, same seed, same output."""
    for want, mode in ((PAIR_PY, "full"), (PAIR_PY, "spec"),
                       (PAIR_PY.replace("get_weather", "get_wind"), "asym")):
        scripted(monkeypatch, qwen_tok, lambda prompt, want=want: want)
        out = engine.chat(QUESTION, tools=[WEATHER, TIME], max_new_tokens=48, mode=mode,
                          cache_key=f"doubled-py-{mode}")
        raw = qwen_tok.decode(out.token_ids)
        assert raw.startswith("{{'name': 'get_") and "get_wind" not in raw, raw
        assert out.text == "" and not out.invalid_tool_calls and len(out.tool_calls) == 1, raw
        args = json.loads(out.tool_calls[0]["function"]["arguments"])
        assert (out.tool_calls[0]["function"]["name"], list(args)) in \
            (("get_weather", ["city"]), ("get_time", ["tz"])), raw
    assert raw.startswith("{{'name': 'get_weather', 'arguments': {\"city\": \"") or \
        raw.startswith("{{'name': 'get_time', 'arguments': {\"tz\": \"")
    scripted(monkeypatch, qwen_tok, lambda prompt: PAIR_LT)
    runs = {}
    for mode in ("full", "spec", "asym"):
        out = engine.chat(QUESTION, tools=[WEATHER, TIME], max_new_tokens=48, mode=mode,
                          cache_key=f"doubled-lt-{mode}")
        assert out.finish_reason == "tool_calls" and out.text == ""
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in out.tool_calls] == \
            [("get_weather", '{"city": "Paris"}')]
        runs[mode] = out.token_ids
    assert runs["spec"] == runs["full"] == runs["asym"]
    assert qwen_tok.decode(runs["full"]).startswith(PAIR_LT[:-1])  # no `>`: the turn ends
    scripted(monkeypatch, qwen_tok, lambda prompt: PAIR_PY)
    sampled = [engine.chat(QUESTION, tools=[WEATHER], max_new_tokens=48, mode="spec",
                           temperature=0.9, seed=11, cache_key=f"doubled-seed-{i}").token_ids
               for i in range(2)]
    assert sampled[0] == sampled[1]
    assert qwen_tok.decode(sampled[0]).startswith("{{'name': 'get_weather', 'arguments': {")


def _alone_and_together(qwen_tok, asks: list, *, seed: int, key: str) -> tuple:
    """The token ids of each (ask, temperature) turn in mode spec under auto, decoded one at a
    time and then all at once (max_num_seqs = len(asks)): (alone, together)."""
    from concurrent.futures import ThreadPoolExecutor

    def turn(engine, i):
        ask, temperature = asks[i]
        return engine.chat([{"role": "user", "content": ask}], tools=[WEATHER, TIME], mode="spec",
                           max_new_tokens=40, temperature=temperature, seed=seed,
                           cache_key=f"{key}-{i}").token_ids

    one = qwen_engine(qwen_tok)
    alone = [turn(one, i) for i in range(len(asks))]
    many = qwen_engine(qwen_tok, max_num_seqs=len(asks))
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(lambda i: turn(many, i), range(len(asks))))
    return alone, together


def test_batched_doubled_calls_are_the_turns_alone(qwen_tok, monkeypatch):
    """A doubled-brace call, a Python-quoted one the grammar holds to JSON and a plain answer
    decoded at once (max_num_seqs 3): each the one-at-a-time engine's turn."""
    scripts = {"Paris": PAIR_LT, "Oslo": PAIR_PY, "Rome": ANSWER}
    scripted(monkeypatch, qwen_tok, lambda p: next(v for k, v in scripts.items() if k in p))
    asks = [("Weather in Paris?", 0.0), ("And in Oslo?", 0.9), ("Rome, please.", 0.0)]
    alone, together = _alone_and_together(qwen_tok, asks, seed=5, key="dbatch")
    assert together == alone
    assert [qwen_tok.decode(t)[:8] for t in alone] == ['<{{name"', "{{'name'", ANSWER[:8]]


def test_batched_auto_turns_are_the_turns_alone(qwen_tok, monkeypatch):
    """Three auto turns decoded at once (max_num_seqs 3): a scripted call, an echo the grammar
    refuses (the random model writes on), a sampled call; each the one-at-a-time engine's."""
    scripted(monkeypatch, qwen_tok, lambda p: ECHO if "Oslo" in p else pair_script(p))
    asks = [("What's the weather in Paris?", 0.0), ("And in Oslo?", 0.0),
            ("Paris, please.", 0.9)]
    alone, together = _alone_and_together(qwen_tok, asks, seed=3, key="batch")
    assert together == alone
    assert "<tools>" not in qwen_tok.decode(alone[1])


# ------------------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def server(qwen_tok):
    from asymagent.integrations.server import create_app

    app = create_app(qwen_engine(qwen_tok), max_queue=8, request_timeout=120,
                     default_max_tokens=64)
    with serving(app) as url:
        yield url


@pytest.fixture
def client(server, qwen_tok, monkeypatch):
    from openai import OpenAI

    scripted(monkeypatch, qwen_tok, pair_script)
    return OpenAI(base_url=server + "/v1", api_key="x")


def calls_of(message) -> list:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("tools", [[WEATHER], [WEATHER, TIME]])
def test_server_auto_call_then_answer_streamed_equals_plain(client, tools):
    msgs = list(QUESTION)
    kwargs = dict(model="asymagent", tools=tools, tool_choice="auto")
    r = client.chat.completions.create(messages=msgs, **kwargs)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not message.content
    assert calls_of(message) == [("get_weather", {"city": "Paris"})]
    content, calls, deltas = streamed(client, raw=True, messages=msgs, **kwargs)
    assert (content or None, calls) == (message.content or None, [
        (c.function.name, c.function.arguments) for c in message.tool_calls])  # exactly
    assert not any(s in d for d in deltas for s in CALL_SYNTAX)
    for result, reply in (("18 C, sunny", ANSWER), ("Error: the service is down", SORRY)):
        history = msgs + [message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": message.tool_calls[0].id,
                           "content": result}]
        r2 = client.chat.completions.create(messages=history, **kwargs)
        assert r2.choices[0].message.content == reply and not r2.choices[0].message.tool_calls
        assert streamed(client, messages=history, **kwargs)[:2] == (reply, [])
    # a second user turn: a new question after the answer calls the tool again
    turn2 = history + [{"role": "assistant", "content": SORRY},
                       {"role": "user", "content": "And now? Try again."}]
    r3 = client.chat.completions.create(messages=turn2, **kwargs)
    assert calls_of(r3.choices[0].message) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("script", [JSON_WRAPPED, PRETTY_HELD, PAIR_LT, PY_HELD, PAIR_PY],
                         ids=["compact", "pretty", "doubled-lt", "doubled-py", "doubled-py-args"])
@pytest.mark.parametrize("parallel", [True, False])
def test_server_a_call_in_a_tag_of_its_own(client, qwen_tok, monkeypatch, parallel, script):
    """The pair's `<json>` wrapper around its call, and its doubled-brace calls `<{{name": ...}}}>`
    and `{{'name': ...}}}` (on one tiny model): the call, no content, streamed == non-streamed,
    no delta holding the wrapper or call syntax; with parallel_tool_calls false the turn ends
    after the call (`</json>`, `>` never written) and `<json>`, `<` are dropped the same. The
    pair's Python-dict arguments are held to JSON (the tiny model then picks the city)."""
    scripted(monkeypatch, qwen_tok, lambda prompt: script)
    kwargs = dict(model="asymagent", messages=QUESTION, tools=[WEATHER], tool_choice="auto",
                  parallel_tool_calls=parallel)
    message = client.chat.completions.create(**kwargs).choices[0].message
    want = [("get_weather", {"city": "Paris"})]
    if script == PAIR_PY:  # the city is the random model's, under the schema, and with
        # parallel calls so is the free text after the call (streamed the same, no call syntax)
        want = [("get_weather", {"city": calls_of(message)[0][1].get("city")})]
        assert isinstance(want[0][1]["city"], str)
        assert calls_of(message) == want
        assert not any(s in (message.content or "") for s in CALL_SYNTAX)
        content, calls, deltas = streamed(client, raw=True, **kwargs)
        assert (content, calls) == (message.content or "", [
            (c.function.name, c.function.arguments) for c in message.tool_calls])
        return  # the Responses path of the same call: the cases below
    assert calls_of(message) == want and not message.content
    content, calls, deltas = streamed(client, raw=True, **kwargs)
    assert (content, calls) == ("", [(c.function.name, c.function.arguments)
                                     for c in message.tool_calls]) and deltas == []
    flat = {"type": "function", **WEATHER["function"]}
    rkw = dict(model="asymagent", input=QUESTION[0]["content"], tools=[flat],
               parallel_tool_calls=parallel)
    resp = client.responses.create(**rkw)
    assert [(o.type, getattr(o, "arguments", None)) for o in resp.output] == \
        [("function_call", '{"city": "Paris"}')]  # no message item: the wrapper is no text
    events = list(client.responses.create(stream=True, **rkw))
    assert not [e for e in events if e.type == "response.output_text.delta"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.arguments) for i in done] == [("function_call", '{"city": "Paris"}')]


def test_responses_and_chat_render_the_same_prompt(client, qwen_tok):
    from asymagent.chat.chat_format import ChatFormat
    from asymagent.integrations.server.response_items import ResponseRequest
    from asymagent.integrations.server.schemas import ChatCompletionRequest

    flat = {"type": "function", **WEATHER["function"]}
    chat_tools = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": QUESTION, "tools": [WEATHER]}).tools
    chat_tools = [t.model_dump(exclude_none=True) for t in chat_tools]
    resp_tools = ResponseRequest.model_validate(
        {"model": "m", "input": QUESTION[0]["content"], "tools": [flat]}).chat_tools()
    assert resp_tools == chat_tools  # `strict` and every other field carried over
    fmt = ChatFormat(qwen_tok)
    assert fmt.render_ids(QUESTION, resp_tools) == fmt.render_ids(QUESTION, chat_tools)
    chat = client.chat.completions.create(model="asymagent", messages=QUESTION, tools=[WEATHER])
    resp = client.responses.create(model="asymagent", input=QUESTION[0]["content"], tools=[flat])
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert [(o.name, json.loads(o.arguments)) for o in resp.output if o.type == "function_call"] \
        == calls_of(chat.choices[0].message)


# ------------------------------------------------------------------------------ the streamer

STREAM_CASES = [
    CALL,
    "Sure, let me look.\n" + CALL,
    "```json\n" + CALL + "\n```",
    'Checking.\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    "<tools>\n" + json.dumps(WEATHER) + "\n</tools>\n" + CALL,
    "<tools>\n\n</tools>",
    "Plain answer with <b>tags</b> and a {brace}.",
    "Two lines.\n{not json} here",
    *[text for text, _, _ in WRAPPED],
    "Sure <json>\n" + CALL,
    "Weather:\n<json>\n" + JSON_WRAPPED[7:],
    PAIR_PY,  # Python-dict arguments: no call to the parser (content + invalid), none streamed
    PY_HELD + "\n" + PAIR_LT,
    CALL + "\nAnd:\n" + PAIR_LT,
    '{ "name": "get_weather",  "arguments" :{ "city" :"S\\u00e3o Paulo \\ud83d\\ude00 \\/ \\"x\\"" ,'
    ' "days": 1.50e1, "ok": true, "n": null, "l": [ 1 , -0 ] } }',
]


@pytest.mark.parametrize("text", STREAM_CASES)
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_streamed_deltas_add_up_to_the_parsed_message(text, piece):
    """Fed in pieces, the content deltas hold no call syntax and add up to the parsed content;
    the call deltas to the parsed calls (what the server's streamed response is made of)."""
    from types import SimpleNamespace

    from asymagent.integrations.server.deltas import DeltaStreamer

    parsed = parse_output(text, ["get_weather"])
    s = DeltaStreamer(tools_enabled=True)
    deltas = []
    for i in range(0, len(text), piece):
        deltas += s.push(text[i:i + piece])
    deltas += s.finish(SimpleNamespace(text=parsed.content, tool_calls=parsed.tool_calls))
    content = [d["content"] for d in deltas if "content" in d]
    calls: dict = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            entry = calls.setdefault(tc["index"], ["", ""])
            entry[0] += tc["function"].get("name", "")
            entry[1] += tc["function"].get("arguments", "")
    assert "".join(content) == parsed.content
    if parsed.tool_calls:
        assert not any(sign in c for c in content for sign in CALL_SYNTAX)
    # the arguments exactly as parsed (json.dumps' serialisation), whatever the model's layout
    assert [(n, a) for n, a in calls.values()] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls]


CANON_VALUES = [{"city": "Paris"}, {"a": [1, 2.5, -0.0, 1e20, True, None], "b": {"c": "é\n\"\\/"}},
                {"emoji": "\U0001F600", "ctl": "\u0001\t", "big": 12345678901234567890, "e": []}]


@pytest.mark.parametrize("value", CANON_VALUES)
@pytest.mark.parametrize("layout", [dict(), dict(indent=2), dict(indent="\t", ensure_ascii=True),
                                    dict(separators=(",", ":"), ensure_ascii=True)])
def test_streamed_arguments_are_the_canonical_prefix(value, layout):
    """Every prefix of the model's text of a value maps to a prefix of the parser's string
    (json.dumps, ensure_ascii=False), and the whole text to all of it."""
    from asymagent.integrations.server.json_canon import canonical_prefix

    raw, want = json.dumps(value, **layout), json.dumps(value, ensure_ascii=False)
    for n in range(len(raw) + 1):
        assert want.startswith(canonical_prefix(raw[:n])), raw[:n]
    assert canonical_prefix(raw) == want
    assert canonical_prefix(raw + " ") == want


@pytest.mark.slow
def test_the_embedded_default_under_auto(default_verifier):
    """The embedded SmolLM2 (bare-object calls) through the real server under auto, one and two
    tools: any call it makes names a tool with schema-valid arguments, no content holds call
    syntax, streamed == non-streamed; a second user turn after the tool's result works too."""
    from openai import OpenAI

    from asymagent.engine import Engine
    from asymagent.integrations.server import create_app

    app = create_app(Engine.from_default(), max_queue=4, request_timeout=300,
                     default_max_tokens=48)
    with serving(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key="x")
        for tools in ([WEATHER], [WEATHER, TIME]):
            kwargs = dict(model="asymagent", tools=tools, tool_choice="auto", temperature=0.0)
            r = client.chat.completions.create(messages=QUESTION, **kwargs)
            message = r.choices[0].message
            for name, args in calls_of(message):
                assert name in ("get_weather", "get_time") and set(args) <= {"city", "tz"}
            assert not any(s in (message.content or "") for s in CALL_SYNTAX)
            content, calls, _ = streamed(client, messages=QUESTION, **kwargs)
            assert (content or None, calls) == (message.content or None, calls_of(message))
            history = QUESTION + [{"role": "assistant", "content": message.content or "",
                                   "tool_calls": [c.model_dump() for c in message.tool_calls or []]}]
            history += [{"role": "tool", "tool_call_id": c.id, "content": "18 C, sunny"}
                        for c in message.tool_calls or []]
            history += [{"role": "user", "content": "Thanks. And in Oslo?"}]
            again = client.chat.completions.create(messages=history, **kwargs)
            assert again.choices[0].finish_reason in ("stop", "tool_calls", "length")
