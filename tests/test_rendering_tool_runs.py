"""Runs of tool messages (one turn of parallel calls) render exactly as the chat template does."""

from __future__ import annotations

import copy
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asymagent.chat.chat_format import ChatFormat
from asymagent.context.views import ContextViews
from test_chat_format import HERMES_TEMPLATE
from test_server_responses import QWEN25_TEMPLATE

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def call(i: int, city: str) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def parallel(cities: list, system: bool = True) -> list:
    """An assistant turn with one call per city, their results, then a reply and a new question."""
    head = [{"role": "system", "content": "Be brief."}] if system else []
    results = [{"role": "tool", "tool_call_id": f"call_{i}",
                "content": {"city": c, "temp": 10 + i} if i % 2 else f"{c}: {10 + i} C, clear"}
               for i, c in enumerate(cities)]
    return head + [
        {"role": "user", "content": "Weather in " + " and ".join(cities) + "?"},
        {"role": "assistant", "content": None, "tool_calls": [call(i, c) for i, c in enumerate(cities)]},
        *results,
        {"role": "assistant", "content": "Here you are."},
        {"role": "user", "content": "Thanks."},
    ]


def hf_messages(messages: list) -> list:
    """The conversation as transformers passes it to the template: calls with dict arguments (the
    template JSON-dumps them itself), tool outputs as strings."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m["role"] == "tool" and not isinstance(m["content"], str):
            m["content"] = json.dumps(m["content"], ensure_ascii=False)
    return out


def with_template(tokenizer, template: str):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


# Qwen2's pre-tokenizer split: punctuation takes the newlines after it (`>\n` is one piece).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen_like(tokenizer):
    """SmolLM2's vocabulary with Qwen2's pre-tokenizer and a `>\n` token, as Qwen2.5's vocabulary has
    (there `</tool_response>` is no added token, so the `>` that ends one result and the newline
    that starts the next read as ONE token when the text is tokenised whole)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    d = json.loads(tokenizer.backend_tokenizer.to_str())
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    model = d["model"]
    model["vocab"][">\u010a"] = 1 + max([*model["vocab"].values(), *(t["id"] for t in d["added_tokens"])])
    model["merges"].insert(0, [">", "\u010a"])
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(d)))


@pytest.fixture(scope="module", params=["smollm", "qwen-like"])
def qwen_tok(smollm_tokenizer, request):
    tok = smollm_tokenizer if request.param == "smollm" else qwen_like(smollm_tokenizer)
    return with_template(tok, QWEN25_TEMPLATE)


@pytest.fixture(scope="module")
def qwen(qwen_tok):
    return ChatFormat(qwen_tok)


def tail_len(segments: list) -> int:
    """How many trailing segments are the tail (a trailing run's close, the generation prompt)."""
    n = 0
    while n < len(segments) and segments[len(segments) - 1 - n].source in ("close", "generation"):
        n += 1
    return n


def test_qwen_template_merges_a_run_of_tool_messages(qwen, qwen_tok, smollm_tokenizer):
    assert qwen.tool_runs == "merged" and qwen.tool_run_tokens_exact
    assert ChatFormat(smollm_tokenizer).tool_runs == "separate"
    segs = qwen.rendered(parallel(["Paris", "Oslo", "Rome"]))
    texts = [(s.source, s.text) for s in segs]
    # where `>\n` is one token (Qwen2.5's vocabulary), the `>` that ends a result is written with
    # what follows it (the next result or the close), so no token spans two segments
    joined = len(qwen_tok.encode(">\n", add_special_tokens=False)) == 1
    end, start = ("", ">") if joined else (">", "")
    assert texts[3:7] == [
        (3, '<|im_start|>user\n<tool_response>\nParis: 10 C, clear\n</tool_response' + end),
        (4, start + '\n<tool_response>\n{"city": "Oslo", "temp": 11}\n</tool_response' + end),
        (5, start + '\n<tool_response>\nRome: 12 C, clear\n</tool_response' + end),
        ("close", start + "<|im_end|>\n")]
    assert texts[7] == (6, "<|im_start|>assistant\nHere you are.<|im_end|>\n")


@pytest.mark.parametrize("cities", [["Paris", "Oslo"], ["Paris", "Oslo", "Rome"]])
@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("tools", [None, [WEATHER]])
def test_every_prefix_renders_as_the_template_renders_it(qwen, qwen_tok, cities, system, tools):
    """Each prefix of a conversation with parallel calls, with and without the generation prompt,
    renders to the template's text, and its tokens are those of tokenising that text whole."""
    conv = parallel(cities, system)
    for n in range(1, len(conv) + 1):
        for gen in (True, False):
            theirs = qwen_tok.apply_chat_template(hf_messages(conv[:n]), tools=tools, tokenize=False,
                                                  add_generation_prompt=gen)
            assert qwen.render_text(conv[:n], tools, add_generation_prompt=gen) == theirs, (n, gen)
            assert qwen.render_ids(conv[:n], tools, add_generation_prompt=gen) == \
                qwen_tok.encode(theirs, add_special_tokens=False), (n, gen)
    assert theirs.count("<|im_start|>user\n<tool_response>") == 1
    assert theirs.count("<tool_response>") == len(cities)


@pytest.mark.parametrize("cities", [["Paris", "Oslo"], ["Paris", "Oslo", "Rome"]])
def test_every_prefix_is_append_stable(qwen, cities):
    """The segments of history n without its tail are the first segments of history n+1; the only
    tail is a trailing run's close and the generation prompt, and the close moves only behind a
    tool message appended to its run (where the template itself moves it)."""
    conv = parallel(cities)
    for n in range(1, len(conv)):
        short, long_ = qwen.rendered(conv[:n]), qwen.rendered(conv[: n + 1])
        tail = tail_len(short)
        body = short[: len(short) - tail]
        assert [(s.source, s.ids) for s in long_[: len(body)]] == [(s.source, s.ids) for s in body]
        closes = [s for s in short[len(body):] if s.source == "close"]
        ends_in_run = conv[n - 1]["role"] == "tool"
        assert len(closes) == int(ends_in_run)
        ids_short = qwen.render_ids(conv[:n], add_generation_prompt=False)
        ids_long = qwen.render_ids(conv[: n + 1], add_generation_prompt=False)
        if ends_in_run and conv[n]["role"] == "tool":
            kept = len(ids_short) - len(closes[0].ids)
            assert ids_short[:kept] == ids_long[:kept]
            assert ids_long[: len(ids_short)] != ids_short  # the template's own text is not a prefix there
        else:
            assert ids_long[: len(ids_short)] == ids_short


@pytest.mark.parametrize("template", ["embedded", "hermes"])
def test_templates_that_do_not_merge_keep_their_output(smollm_tokenizer, template):
    """SmolLM2 (each tool message its own `tool` turn) and a Hermes-like template without the merge:
    one segment per message, each what the template writes for it after a system message (the
    segmentation before runs were handled), and the whole equals the template's text."""
    tok = smollm_tokenizer if template == "embedded" else with_template(smollm_tokenizer, HERMES_TEMPLATE)
    cf = ChatFormat(tok)
    assert cf.tool_runs == "separate"
    conv = parallel(["Paris", "Oslo", "Rome"])
    segs = cf.rendered(conv, add_generation_prompt=False)
    assert [s.source for s in segs] == list(range(len(conv)))
    anchor = {"role": "system", "content": "anchor"}
    base = tok.apply_chat_template([anchor], tokenize=False)
    for s, m in zip(segs[1:], conv[1:]):
        both = tok.apply_chat_template([anchor, cf.template_message(m)], tokenize=False)
        assert s.text == both[len(base):]
    plain = [cf.template_message(m) for m in conv]
    assert cf.render_text(conv) == tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert sum(s.text.count("<|im_start|>tool") for s in segs) == 3  # one turn per result


# A template that writes the LAST tool message of a run differently from the others: the text of
# a tool message changes when another one follows it, so no append-stable split exists.
LAST_DIFFERS = (
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<last>{{ m.content }}</last>\n"
    "{% else %}<r>{{ m.content }}</r>{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Merged like Qwen2.5, but the results written back to back with no text between them: the
# boundary is inside content (`...}{...`), which SmolLM2's tokenizer reads as one token `}{`.
BACK_TO_BACK = (
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user\n{% endif %}"
    "{{ m.content }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_run_form_that_cannot_be_split_is_detected_and_said(smollm_tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="asymagent.context.rendering"):
        cf = ChatFormat(with_template(smollm_tokenizer, LAST_DIFFERS))
    assert cf.tool_runs == "unsupported"
    assert any("NOT the template's text" in r.getMessage() for r in caplog.records)
    # documented fallback: each tool message renders as it does alone (one segment per message)
    conv = [{"role": "user", "content": "q"}, {"role": "tool", "content": "a"},
            {"role": "tool", "content": "b"}]
    assert cf.render_text(conv, add_generation_prompt=False) == \
        "<|im_start|>user\nq<|im_end|>\n<last>a</last>\n<last>b</last>\n"


def test_a_tokenizer_merging_across_the_run_boundary_is_detected_and_said(smollm_tokenizer, caplog):
    tok = with_template(smollm_tokenizer, BACK_TO_BACK)
    with caplog.at_level(logging.WARNING, logger="asymagent.context.rendering"):
        cf = ChatFormat(tok)
    assert cf.tool_runs == "merged" and not cf.tool_run_tokens_exact
    assert any("merges tokens across the boundary" in r.getMessage() for r in caplog.records)
    conv = [{"role": "user", "content": "q"}, {"role": "tool", "content": "{\"a\": 1}"},
            {"role": "tool", "content": "{\"b\": 2}"}, {"role": "user", "content": "ok"}]
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert cf.render_text(conv) == text  # the text stays the template's
    # each segment keeps its own tokens (append-stable), which differ from the whole text's here
    segs = cf.rendered(conv)
    assert cf.render_ids(conv) == [t for s in segs for t in cf.encode(s.text)]
    assert cf.render_ids(conv) != tok.encode(text, add_special_tokens=False)


OUTPUT = st.one_of(st.text(alphabet=st.sampled_from(list("abc xyz,.:{}\"019\né東")), max_size=40),
                   st.builds(lambda t, n: (t + "\n") * n, st.text(alphabet="abc 01", max_size=20),
                             st.integers(1, 30)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.lists(OUTPUT, min_size=1, max_size=3), min_size=1, max_size=4),
       config=st.sampled_from([
           {"compressors": [{"type": "tool_output", "head_tokens": 6, "tail_tokens": 3, "min_omitted": 1}]},
           {"compressors": [{"type": "tool_output", "head_tokens": 6, "tail_tokens": 3, "min_omitted": 1},
                            {"type": "recent_turns", "keep_turns": 1, "demote_every": 1}]},
           {"compressors": [{"type": "surprisal", "keep_ratio": 0.5, "min_tokens": 4}]}]))
def test_views_over_parallel_results_match_the_template(qwen, qwen_tok, turns, config):
    """ContextViews on the Qwen2.5 template, one turn of 1-3 parallel calls per step: the full view
    is the template's rendering, the compressed view (text compressors) is the template's
    rendering of the compressed messages, and the compressed body only grows unless a rewrite is
    counted."""
    views = ContextViews(compression=config, chat_format=qwen)
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "start"}]
    prev = None
    for t, outputs in enumerate(turns):
        calls = [call(10 * t + j, f"c{j}") for j in range(len(outputs))]
        messages += [{"role": "assistant", "content": None, "tool_calls": calls}]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": o} for c, o in zip(calls, outputs)]
        pair = views.build(messages, logprob_fn=lambda ids: [-(t_ % 7) / 2.0 for t_ in ids])
        theirs = qwen_tok.apply_chat_template(hf_messages(messages), tokenize=False,
                                              add_generation_prompt=True)
        assert pair.full_ids == qwen_tok.encode(theirs, add_special_tokens=False)
        gen = pair.generation_prompt_len
        assert pair.full_ids[-gen:] == pair.compressed_ids[-gen:]
        if config["compressors"][0]["type"] != "surprisal":
            comp = views.compress_messages(messages).messages
            ctext = qwen_tok.apply_chat_template(hf_messages(comp), tokenize=False,
                                                 add_generation_prompt=True)
            assert pair.compressed_ids == qwen_tok.encode(ctext, add_special_tokens=False)
        else:
            assert len(pair.compressed_ids) <= len(pair.full_ids)
        body = pair.compressed_ids[:-gen]
        if prev is not None:
            assert (body[: len(prev)] == prev) == (pair.rewrites == 0)
        prev = body
        spans = views.message_spans()
        for span, m in zip(spans, messages):
            if m["role"] == "tool" and span.same:
                seg = qwen_tok.decode(pair.full_ids[span.full[0]:span.full[1]])
                assert "<tool_response>" in seg and "<|im_end|>" not in seg


def test_compressed_run_and_a_recall_inside_it_match_the_template(qwen, qwen_tok):
    """Three long parallel results compressed, then the middle one recalled whole: each time the
    compressed view is the template's rendering of the messages as the view holds them."""
    views = ContextViews(compression={"compressors": [{"type": "tool_output", "head_tokens": 6,
                                                       "tail_tokens": 3, "min_omitted": 1}]},
                         chat_format=qwen)
    outputs = [f"row {i}: " + "abc 012 " * 40 for i in range(3)]
    messages = parallel(["Paris", "Oslo", "Rome"])[:3]
    messages += [{"role": "tool", "tool_call_id": f"call_{i}", "content": o} for i, o in enumerate(outputs)]
    messages += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "More?"}]
    pair = views.build(messages)
    comp = views.compress_messages(messages).messages
    assert [m["content"] != o for m, o in zip(comp[3:6], outputs)] == [True, True, True]
    text = qwen_tok.apply_chat_template(hf_messages(comp), tokenize=False, add_generation_prompt=True)
    assert pair.compressed_ids == qwen_tok.encode(text, add_special_tokens=False)
    assert text.count("<|im_start|>user\n<tool_response>") == 1
    middle = views.message_spans()[4]
    assert views.restore([middle.full[0] + 5]) == [4]
    comp[4] = messages[4]
    text = qwen_tok.apply_chat_template(hf_messages(comp), tokenize=False, add_generation_prompt=True)
    assert views.compressed_ids() == qwen_tok.encode(text, add_special_tokens=False)


def _reordered(tool: dict) -> dict:
    """The same tool with its parameters' keys in LangChain's order (properties, required, type)
    instead of openai-agents' (type first): the same schema, a different `tojson` text."""
    fn = tool["function"]
    params = {k: fn["parameters"][k] for k in ("properties", "required", "type")}
    return {"type": "function", "function": {**fn, "parameters": params}}


@pytest.mark.parametrize("system", [True, False])
def test_tools_differing_only_in_key_order_render_each_as_the_template_does(qwen, qwen_tok, system):
    """Two clients sending the same tool with its keys in a different order (openai-agents puts
    `type` first, LangChain last) each get the template's rendering of THEIR request, from one
    renderer and from one conversation's views: the segment cache and the views' identity keep the
    key order (they were keyed on sort_keys JSON, so the first client's order was served to the
    second one: on the pair the framework matrix's LangChain requests were rendered with
    openai-agents' schema text)."""
    conv = parallel(["Paris"], system)[: 4 if system else 3]
    views = ContextViews(chat_format=qwen)
    texts = []
    for tools in ([WEATHER], [_reordered(WEATHER)], [WEATHER]):
        theirs = qwen_tok.apply_chat_template(hf_messages(conv), tools=tools, tokenize=False,
                                              add_generation_prompt=True)
        assert qwen.render_text(conv, tools) == theirs
        assert qwen.render_ids(conv, tools) == qwen_tok.encode(theirs, add_special_tokens=False)
        assert views.build(conv, tools=tools).full_ids == qwen_tok.encode(theirs, add_special_tokens=False)
        texts.append(theirs)
    assert texts[0] != texts[1] and texts[0] == texts[2]  # the template does tell the orders apart
    assert '"parameters": {"properties": {"city"' in texts[1]
