"""Chat format: faithful per-message rendering, append-stability, tool rendering, parsing."""

from __future__ import annotations

import copy
import json

import pytest

from asymagent.chat.chat_format import ChatFormat, name_signature, parse_output, tool_prompt

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"]}}}

CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": {"temp": 21, "sky": "clear"}},
    {"role": "assistant", "content": "It is 21 degrees and clear."},
]

# A Hermes-style template that reads `tools` (Qwen2.5-like), to test the tool-aware path.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}{% else %}You are Qwen.{% endif %}\n\n# Tools\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- else %}{% if messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{% else %}<|im_start|>system\nYou are Qwen.<|im_end|>\n"
    "{% endif %}{%- endif %}"
    "{%- for message in messages %}{% if not (loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def cf(smollm_tokenizer):
    return ChatFormat(smollm_tokenizer)


@pytest.fixture(scope="module")
def hermes(smollm_tokenizer):
    tok = copy.deepcopy(smollm_tokenizer)
    tok.chat_template = HERMES_TEMPLATE
    return ChatFormat(tok)


def test_smollm_renders_exactly_as_its_template(cf, smollm_tokenizer):
    plain = [cf.template_message(m) for m in CONVERSATION]
    expected = smollm_tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert cf.render_text(CONVERSATION) == expected
    assert cf.render_ids(CONVERSATION) == smollm_tokenizer.encode(expected, add_special_tokens=False)
    # SmolLM2 injects its default system prompt when the first message is not a system message:
    # that becomes a separate preamble segment, then one segment per message, then the prompt.
    segs = cf.segments(CONVERSATION)
    assert len(segs) == 1 + len(CONVERSATION) + 1
    assert cf.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert cf.generation_prompt_text == "<|im_start|>assistant\n"
    with_system = [{"role": "system", "content": "Be brief."}] + plain
    assert cf.render_text(with_system, add_generation_prompt=False) == \
        smollm_tokenizer.apply_chat_template(with_system, tokenize=False)


def test_append_stable_by_construction(cf):
    for n in range(1, len(CONVERSATION)):
        shorter = cf.render_ids(CONVERSATION[:n], tools=[WEATHER], add_generation_prompt=False)
        longer = cf.render_ids(CONVERSATION[: n + 1], tools=[WEATHER])
        assert longer[: len(shorter)] == shorter


def test_tools_listed_in_system_message_for_smollm(cf):
    assert not cf.template_tools  # SmolLM2's template ignores `tools`
    text = cf.render_text(CONVERSATION, tools=[WEATHER])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    lines = system.split("\n")
    schema_lines = [line for line in lines if line.startswith("{")]
    assert [json.loads(line)["name"] for line in schema_lines] == ["get_weather"]
    # The assistant's call renders exactly as the model is asked to emit it.
    assert '<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}' \
           '<|im_end|>' in text
    # Non-string tool content is JSON-dumped, role stays `tool`.
    assert '<|im_start|>tool\n{"temp": 21, "sky": "clear"}<|im_end|>' in text
    # An explicit system message keeps its content and gets the tool block appended.
    sys_text = cf.render_text([{"role": "system", "content": "Be brief."}] + CONVERSATION,
                              tools=[WEATHER])
    assert sys_text.startswith("<|im_start|>system\nBe brief.\n\nYou can call the tools")


def test_name_sig_tool_prompt():
    assert name_signature(WEATHER) == 'get_weather(city: string, unit?: "c"|"f", days?: array[integer])'
    full, short = tool_prompt([WEATHER], "full"), tool_prompt([WEATHER], "name_sig")
    assert len(short) < len(full)
    assert short.splitlines()[1] == name_signature(WEATHER)
    with pytest.raises(ValueError, match="tool style"):
        tool_prompt([WEATHER], "tiny")


def test_hermes_template_uses_tools_and_tool_call_blocks(hermes):
    assert hermes.template_tools
    text = hermes.render_text(CONVERSATION, tools=[WEATHER])
    # (the template environment trims the newline after each block tag, hence no blank line)
    assert text.startswith("<|im_start|>system\nYou are Qwen.\n# Tools\n<tools>")
    assert '"Current weather in a city."' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    short = hermes.render_text(CONVERSATION, tools=[WEATHER], tool_style="name_sig")
    assert "Current weather" not in short and '"get_weather"' in short
    for n in range(1, len(CONVERSATION)):
        a = hermes.render_ids(CONVERSATION[:n], tools=[WEATHER], add_generation_prompt=False)
        b = hermes.render_ids(CONVERSATION[: n + 1], tools=[WEATHER])
        assert b[: len(a)] == a


def test_bad_messages_raise_value_error(cf):
    with pytest.raises(ValueError, match="role"):
        cf.render_ids([{"content": "x"}])
    with pytest.raises(ValueError, match="unknown message role"):
        cf.render_ids([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="list"):
        cf.render_ids({"role": "user", "content": "x"})
    with pytest.raises(ValueError, match="only assistant"):
        cf.render_ids([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}])


def test_content_parts_and_unicode(cf):
    parts = [{"role": "user", "content": [{"type": "text", "text": "naïve "},
                                          {"type": "text", "text": "日本語 🚀"}]}]
    assert "naïve 日本語 🚀" in cf.render_text(parts)


@pytest.mark.parametrize("text,names,content", [
    ("Just text.", [], "Just text."),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', ["get_weather"], ""),
    ('Checking.\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"x": [1, {"y": 2}]}}',
     ["a", "b"], "Checking."),
    ('<tool_call>\n{"name": "f", "arguments": {"q": "ü"}}\n</tool_call>', ["f"], ""),
    ('{"name": "f", "parameters": {"q": 1}}', ["f"], ""),  # Llama-style key
    ('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]', ["a", "b"], ""),
    ('{"answer": 42}', [], '{"answer": 42}'),  # JSON that is not a call is content
])
def test_parse_output(text, names, content):
    out = parse_output(text)
    assert [c["function"]["name"] for c in out.tool_calls] == names
    assert out.content == content
    assert out.invalid_tool_calls == []
    for call in out.tool_calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Par',
    '{"name": "f", "arguments": "{not json"}',
    '<tool_call>\n{"name": "f", "arguments": {]\n</tool_call>',
    '{"name": "f", "arguments": [1, 2]}',
])
def test_parse_output_malformed_call_is_text_plus_invalid_entry(text):
    out = parse_output(text)
    assert out.tool_calls == []
    assert len(out.invalid_tool_calls) == 1
    bad = out.invalid_tool_calls[0]
    assert set(bad) == {"name", "args", "id", "error"} and bad["name"] in ("f", "get_weather")
    assert out.content  # the text is kept, nothing is lost


def test_parse_output_never_raises_on_garbage():
    for junk in [None, "", "{", "}{", "<tool_call>", "[[[", '{"name": 3}', "\x00\ufffd"]:
        out = parse_output(junk)
        assert isinstance(out.content, str)


def test_call_ids_are_unique():
    ids = {parse_output('{"name": "a", "arguments": {}}').tool_calls[0]["id"] for _ in range(50)}
    assert len(ids) == 50  # fresh uuid4-derived ids, never reused


def test_template_errors_become_value_errors(smollm_tokenizer):
    tok = copy.deepcopy(smollm_tokenizer)
    tok.chat_template = (  # a strict template in the style of Llama-2's: no tool role
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = ChatFormat(tok)
    assert fmt.render_text([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user")
    with pytest.raises(ValueError, match="roles must alternate"):
        fmt.render_ids([{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}])


def test_code_fences_around_tool_calls_are_no_content():
    """Qwen2.5-Coder wraps its Hermes calls in a ```json fence: the calls are parsed and the empty
    fence left behind is not the turn's content; a fence with text in it, or text beside the
    call, stays content."""
    from asymagent.chat.output_parsing import parse_output

    call = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "A-1234"}}\n</tool_call>'
    for text in (f"```json\n{call}\n```", f"```\n{call}\n```", f"```json\n{call}", f"{call}\n{call}"):
        out = parse_output(text)
        assert out.content == "" and out.tool_calls and not out.invalid_tool_calls, text
        assert out.tool_calls[0]["function"]["name"] == "get_order"
    out = parse_output(f"Looking it up.\n```json\n{call}\n```")
    assert out.content.startswith("Looking it up.") and len(out.tool_calls) == 1
    assert parse_output("```json\n{}\n```").content == "```json\n{}\n```"  # no call: untouched


# What Qwen2.5-Coder-1.5B (the reference pair's verifier) wrote, greedy, for the openai-agents
# SDK's default agent after get_weather's result: the call again, in the form its chat template's
# tool instructions show ({{"name": <function-name>, "arguments": <args-json-object>}}).
SEEN_AFTER_TOOL_RESULT = '{{"name": "get_weather", "arguments": {"city": "Oslo"}}}'


@pytest.mark.parametrize("text, content", [
    (SEEN_AFTER_TOOL_RESULT, ""),
    (f"```json\n{SEEN_AFTER_TOOL_RESULT}\n```", ""),
    (f"<tool_call>\n{SEEN_AFTER_TOOL_RESULT}\n</tool_call>", ""),
    (f"Checking.\n{SEEN_AFTER_TOOL_RESULT} \n{SEEN_AFTER_TOOL_RESULT}", "Checking."),
    ('{{"name": "get_weather", "parameters": {"city": "Oslo"}}}', ""),
    # the spellings the pair writes them in (2026-12-07, `serve --pair`, docs/serving.md)
    ("{{'name': 'get_weather', 'arguments': {\"city\": \"Oslo\"}}}", ""),
    ('<{{name": "get_weather", "arguments": {"city": "Oslo"}}}>', ""),
    ('{{name: "get_weather", arguments: {"city": "Oslo"}}}', ""),
    ('{{ name: "get_weather", parameters: {"city": "Oslo"} }}', ""),
    ('Checking: {{"name": "get_weather", "arguments": {"city": "Oslo"}}}', "Checking:"),
])
def test_parse_output_reads_a_call_doubled_in_braces(text, content):
    """Qwen2.5's template shows a call as `{{"name": ..., "arguments": ...}}` and its models copy
    it: that is the call it means, not the turn's final text (it was returned as the openai-agents
    SDK's final output before)."""
    out = parse_output(text)
    assert out.content == content and out.invalid_tool_calls == []
    assert out.tool_calls
    for call in out.tool_calls:
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


@pytest.mark.parametrize("text, invalid", [
    ('{{"name": "get_weather", "arguments": {"city": "Os', 1),  # cut: call-shaped, malformed
    ('{{"name": "f", "arguments": {}, "id": 1}}}', 1),  # more than a call: not read as one
    ("Write {{ name }} in the Jinja template.", 0),  # template code is content
    ('{{"a": 1}}', 0),
    ('{{"name": "f", "arguments": {}}', 1),  # no second brace: malformed
    ("{{'name': 'f', 'arguments': {'x': 1}}}", 1),  # Python-dict arguments: malformed
    ("Write {{name}} or {{ 'name' }} or {{ name|e }}.", 0),
    ("{{name: f}}", 1),  # a doubled call's head (the grammar's trigger): call-shaped, malformed
])
def test_doubled_braces_that_are_no_call_stay_text(text, invalid):
    out = parse_output(text)
    assert out.tool_calls == [] and out.content == text
    assert len(out.invalid_tool_calls) == invalid


def test_chatml_models_stop_at_the_documents_end_too():
    """`<|endoftext|>` beside `<|im_end|>` ends a ChatML model's turn (the pair's GGUF keeps only
    `<|im_end|>` as EOS, and its 1.5B wrote on past `<|endoftext|>` into an invented turn); a
    tokenizer whose unknown token is `<|endoftext|>` (SmolLM2's) keeps its EOS as it was."""
    import torch

    from asymagent.decoding.stopping import eos_ids

    class Tok:  # Qwen2.5's ids; no unknown token
        vocab = {"<|im_end|>": 151645, "<|endoftext|>": 151643}
        eos_token_id, unk_token_id = 151645, None

        def convert_tokens_to_ids(self, token):
            return self.vocab.get(token, self.unk_token_id)

    model = torch.nn.Linear(1, 1)
    model.config = type("C", (), {"eos_token_id": 151645})()
    assert eos_ids(model, Tok()) == {151645, 151643}
    smol = Tok()
    smol.vocab, smol.eos_token_id, smol.unk_token_id = {"<|im_end|>": 2, "<|endoftext|>": 0}, 2, 0
    model.config.eos_token_id = 2
    assert eos_ids(model, smol) == {2}
