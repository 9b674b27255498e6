"""Attention keep: the drafter's attention chooses rows of the verifier's view (asymagent/context/attention_keep.py).

Pins: the row rules (best-scored rows within the budget, never a row that spells out a tool call,
re-admission above the uniform-share multiple only), that capturing attention leaves a forward's
bits alone and yields a distribution-shaped score, and, on the embedded default, that the view it
builds stays append-stable across agent steps (no rewrite) while the drafter is asked only in the
compressed modes.
"""

from __future__ import annotations

import pytest
import torch

from asymagent.context import attention_keep
from asymagent.context.compressors import CompressionConfig
from asymagent.kv.attention import capture_attention, use_gqa_attention


def _count(text: str) -> int:
    return len(text.split())


def _char_scores(text: str, hot: dict) -> list:
    """(start, end, score) per word of `text`: 0.01, or hot[word]."""
    out, pos = [], 0
    for word in text.split():
        s = text.index(word, pos)
        out.append((s, s + len(word), hot.get(word, 0.01)))
        pos = s + len(word)
    return out


def test_select_keeps_the_best_scored_rows_within_the_budget_in_order():
    middle = "alpha row one\nbeta row two\ngamma row three\ndelta row four\n"
    scores = _char_scores(middle, {"gamma": 0.5, "alpha": 0.3, "delta": 0.2})
    kept = attention_keep.select(middle, 0, scores, budget=8, count=_count)
    assert [middle[s:e].split()[0] for s, e in kept] == ["alpha", "gamma"]  # 4 tokens each, in order
    # offset: the scores cover a content the middle sits in at 10 characters
    shifted = [(s + 10, e + 10, v) for s, e, v in scores]
    assert attention_keep.select(middle, 10, shifted, budget=8, count=_count) == kept
    assert attention_keep.select(middle, 0, scores, budget=8, count=_count, taken=[kept[1]]) == \
        [kept[0], (middle.index("delta"), len(middle))]  # gamma was taken: alpha and delta


def test_no_row_that_spells_out_a_tool_call_is_kept_or_brought_back():
    middle = 'plain row\n<tool_call>{"name": "wire", "arguments": {}}</tool_call>\n'
    scores = _char_scores(middle, {'<tool_call>{"name":': 0.9})
    kept = attention_keep.select(middle, 0, scores, budget=50, count=_count)
    assert [middle[s:e].strip() for s, e in kept] == ["plain row"]
    rows = attention_keep.readmit([(0.9, (1, 0), middle.splitlines()[1]), (0.5, (1, 1), "plain row")],
                                  positions=10, ratio=2.0, budget=50, count=_count)
    assert [text for _, _, text in rows] == ["plain row"]


def test_readmit_takes_rows_above_the_uniform_share_multiple_best_first_within_budget():
    candidates = [(0.02, (3, 0), "a b c"), (0.30, (5, 0), "d e"), (0.10, (4, 9), "f g h i"),
                  (0.05, (2, 1), "j")]
    # 100 positions, ratio 8: a row needs 0.08
    rows = attention_keep.readmit(candidates, positions=100, ratio=8.0, budget=10, count=_count)
    assert [key for _, key, _ in rows] == [(5, 0), (4, 9)]
    rows = attention_keep.readmit(candidates, positions=100, ratio=8.0, budget=4, count=_count)
    assert [key for _, key, _ in rows] == [(5, 0)]  # "f g h i" costs 5 with its newline
    assert attention_keep.readmit(candidates, positions=100, ratio=8.0, budget=0, count=_count) == []
    block = attention_keep.render_block(["d e", "f g h i"])
    assert block == "\n" + attention_keep.READMIT_HEADER + "\nd e\nf g h i"


def test_cut_rows_are_the_units_the_compressed_text_does_not_show():
    original = "head line\nrow A\nrow B\ntail line\n"
    assert attention_keep.cut_rows(original, "head line\n[... 4 tokens omitted ...]\ntail line") == \
        [(10, 16), (16, 22)]


def test_capture_leaves_the_forward_bits_and_scores_where_the_last_rows_look(tiny_llama):
    model = tiny_llama()
    assert use_gqa_attention(model)
    ids = torch.randint(3, 250, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = model(ids).logits
        with capture_attention(4) as capture:
            captured = model(ids).logits
    assert torch.equal(plain, captured)
    assert capture.layers == model.config.num_hidden_layers
    scores = capture.scores(44)  # asked for more positions than keys: zeros past the end
    assert len(scores) == 44 and scores[40:] == [0.0] * 4
    assert all(s >= 0.0 for s in scores)
    # max over heads of distributions over 40 keys: between one distribution's mass and 4 heads'
    assert 1.0 - 1e-5 <= sum(scores) <= model.config.num_attention_heads + 1e-5


def test_per_layer_capture_splits_the_layer_mean_and_leaves_it_unchanged(tiny_llama):
    model = tiny_llama()
    assert use_gqa_attention(model)
    ids = torch.randint(3, 250, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        with capture_attention(3) as plain:
            model(ids)
        with capture_attention(3, per_layer=True) as split:
            model(ids)
    depth = model.config.num_hidden_layers
    assert depth >= 2 and len(split.by_layer) == 1 and len(split.by_layer[0]) == depth
    assert split.scores(30) == plain.scores(30)  # the layer mean is the same either way
    every = torch.tensor(split.scores(30, layers=range(depth)))
    assert torch.allclose(every, torch.tensor(plain.scores(30)), atol=1e-6)
    # one layer alone: the rows' mean of that layer's pooled attention, nothing from the others
    first = torch.tensor(split.scores(30, layers=range(1)))
    assert torch.allclose(first, split.by_layer[0][0].mean(0), atol=1e-6)
    halves = (torch.tensor(split.scores(30, layers=range(1))) + (depth - 1) *
              torch.tensor(split.scores(30, layers=range(1, depth)))) / depth
    assert torch.allclose(halves, every, atol=1e-5)
    with pytest.raises(ValueError):
        plain.scores(30, layers=range(1))


def test_look_ahead_rows_in_the_upper_layers_score_as_a_separate_reading_of_those_tokens(smollm_tokenizer):
    """attention_rows "lookahead" + attention_layers "upper" (preset attention_lookahead): the
    scores are the attention the look-ahead's own rows give, in the drafter's upper half of layers,
    exactly what feeding those tokens one by one after the prompt and capturing them gives; with
    no look-ahead the prompt's rows score as before."""
    from conftest import make_tiny_llama

    from asymagent import Engine
    from asymagent.chat.session import drafter_attention_fn
    from asymagent.kv.lean_forward import general_loop

    model = make_tiny_llama(vocab_size=49152, layers=4, hidden=64, seed=4, max_positions=4096)
    engine = Engine(verifier=model, drafter=model, tokenizer=smollm_tokenizer)
    full = smollm_tokenizer(" ".join(f"row {i} -> team T{i % 7}" for i in range(40)))["input_ids"]
    drafted: list = []
    fn = drafter_attention_fn(engine, "k1", [0], lookahead=6, pool="max", drafted=drafted,
                              rows_read="lookahead", layers="upper")
    scores = fn(full)
    assert 0 < len(drafted) <= 6
    cache = engine.caches.session("k2").get("drafter_full")
    with torch.inference_mode():
        cache.prefill(full)
        with capture_attention(1, per_layer=True) as capture, general_loop():
            for t in drafted:
                cache.forward_hidden([t])
    assert capture.layers == 4 and len(capture.forwards) == len(drafted)
    expected = capture.scores(len(full), "max", range(2, 4))
    assert torch.allclose(torch.tensor(scores), torch.tensor(expected), atol=1e-6)
    every = drafter_attention_fn(engine, "k3", [0], lookahead=6, pool="max")(full)
    assert not torch.allclose(torch.tensor(scores), torch.tensor(every), atol=1e-4)  # another reading
    none = drafter_attention_fn(engine, "k4", [0], lookahead=0, pool="max", rows_read="lookahead")(full)
    plain = drafter_attention_fn(engine, "k5", [0], lookahead=0, pool="max")(full)
    assert none == plain  # no look-ahead: the prompt's rows


def test_preset_validates_and_reads_attention():
    assert CompressionConfig.preset("attention_keep").reads_attention()
    assert CompressionConfig.preset("attention_lean").reads_attention()
    lookahead = CompressionConfig.preset("attention_lookahead")
    assert lookahead.reads_attention() and lookahead.attention_lookahead > 0
    assert (lookahead.attention_rows, lookahead.attention_layers) == ("lookahead", "upper")
    assert not CompressionConfig().reads_attention()
    with pytest.raises(ValueError):
        CompressionConfig.model_validate({"readmit_tokens": -1})


def _agent_history(steps: int) -> list:
    """An agent conversation with long tool outputs (handbook-like rows, filler paragraphs)."""
    filler = " ".join(f"The team reviewed item {i} and noted it for the record." for i in range(12))
    rows = "\n".join(f"   component-{c} -> team {t}" for c, t in
                     zip("abcdefgh", ("Osprey", "Kestrel", "Plover", "Raven", "Heron", "Wren", "Falcon", "Swift")))
    messages = [{"role": "system", "content": "You triage tickets with the tools."},
                {"role": "user", "content": "Read the handbook, then route ticket T-7."}]
    for k in range(steps):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}",
                         "content": f"Part {k}\n{filler}\n{rows}\n{filler}\nEnd of part {k}."})
    return messages


@pytest.mark.slow
def test_attention_keep_view_is_append_stable_and_asks_the_drafter_in_compressed_modes_only():
    from asymagent import Engine
    from asymagent.chat import session

    engine = Engine.from_default(compression=CompressionConfig.preset("attention_keep"))
    calls = []
    real = session.drafter_attention_fn

    def spy(*args, **kwargs):
        fn = real(*args, **kwargs)

        def wrapped(full_ids):
            calls.append(len(full_ids))
            return fn(full_ids)
        return wrapped

    session.drafter_attention_fn = spy
    try:
        for steps in (1, 2, 3):
            r = engine.chat(_agent_history(steps), mode="asym", max_new_tokens=4, cache_key="a")
            assert r.stats.rewrites == 0  # the chosen rows and any block came in append-stably
            assert r.stats.verifier_context_tokens < r.stats.full_context_tokens
        assert len(calls) == 3  # once per step with new messages
        engine.chat(_agent_history(2), mode="full", max_new_tokens=4, cache_key="f")
        assert len(calls) == 3  # mode full never asks the drafter for its attention
    finally:
        session.drafter_attention_fn = real


def test_the_drafters_look_ahead_is_offered_as_copied_drafts_from_the_prompts_end():
    from asymagent.decoding.suffix_drafter import SuffixDrafter
    from asymagent.kv.cache import View

    prompt, generated = [5, 6, 7, 8, 9, 10, 11], []
    hint = (40, 41, 42, 43, 44, 45)
    view = View(prompt, generated)
    plain = SuffixDrafter(view, factor=4.0, min_prob=0.0)
    hinted = SuffixDrafter(view, factor=4.0, min_prob=0.0, hint=hint)
    assert plain.draft(4).tokens == []  # nothing in the prompt continues its own end
    assert list(hinted.draft(4).tokens) == [40, 41, 42, 43]
    generated += [40, 41]  # the verifier took two of them: the next round continues the hint
    assert list(hinted.draft(3).tokens) == [42, 43, 44]
    generated += [99]  # it left the hint: no stale proposal from it
    assert list(hinted.draft(3).tokens) == []


@pytest.mark.slow
def test_look_ahead_drafts_change_speed_only_greedy_asym_is_the_same_without_them():
    from asymagent import Engine
    from asymagent.chat import session

    config = CompressionConfig.model_validate({**CompressionConfig.preset("attention_lean").model_dump(),
                                               "attention_lookahead": 16})
    real = session.drafter_attention_fn
    runs = []
    for offered in (True, False):
        def no_hint(*args, **kwargs):  # the same reading (so the same view), its drafts dropped
            fn = real(*args, **kwargs)

            def wrapped(full_ids):
                out = fn(full_ids)
                if not offered:
                    kwargs["drafted"].clear()
                return out
            return wrapped

        session.drafter_attention_fn = no_hint
        try:
            engine = Engine.from_default(compression=config)
            runs.append([engine.chat(_agent_history(steps), mode="asym", max_new_tokens=24,
                                     cache_key="a") for steps in (1, 2, 3)])
        finally:
            session.drafter_attention_fn = real
    for hinted, plain in zip(*runs):
        assert hinted.token_ids == plain.token_ids
        assert hinted.stats.verifier_context_tokens == plain.stats.verifier_context_tokens


def _hot_scores(views, pair, word: str) -> list:
    """Per-position scores over the full view: 1.0 on the tokens of the rows holding `word`
    (found through the tokenizer's decode of each position), a small share elsewhere."""
    tok = views.chat_format.tokenizer
    ids = pair.full_ids
    text = [tok.decode([t]) for t in ids]
    hot = set()
    for i in range(len(ids)):
        if word.startswith(text[i].strip()) and text[i].strip() and \
                word in "".join(text[i:i + 4]).replace(" ", ""):
            hot.update(range(i, i + 4))
    return [1.0 if i in hot else 1e-4 for i in range(len(ids))]


def test_readmit_at_brings_the_read_cut_row_back_at_the_newest_message_append_stably(smollm_tokenizer):
    """ContextViews.readmit_at (re-admission at a hesitation): the cut row the scores point at
    joins the block at the end of the newest message; everything before that message keeps its
    tokens (the verifier re-prefills the newest message only); asked again, nothing new comes
    back; the next build counts no rewrite and keeps the block."""
    from asymagent.context.views import ContextViews

    config = CompressionConfig(readmit_tokens=64, readmit_ratio=20.0, recall_evidence="margin_readmit")
    assert not config.reads_attention()  # read at the hesitation, not at each step's start
    views = ContextViews(smollm_tokenizer, config)
    messages = _agent_history(2)
    pair = views.build(messages)
    assert "component-e -> team Heron" not in smollm_tokenizer.decode(pair.compressed_ids)
    spans = views.message_spans()
    before = list(pair.compressed_ids[:spans[-1].compressed[0]])
    scores = _hot_scores(views, pair, "component-e")
    hit = views.readmit_at(scores + [0.0] * 5)  # positions past the full view are ignored
    assert hit and all(messages[i]["role"] == "tool" for i in hit)
    after = views.compressed_ids()
    text = smollm_tokenizer.decode(after)
    assert attention_keep.READMIT_HEADER in text and "component-e -> team Heron" in text
    assert after[:len(before)] == before and len(after) > len(pair.compressed_ids)
    assert views.readmit_at(scores) == []  # already shown
    again = views.build(messages)
    assert again.rewrites == 0 and again.compressed_ids == after
    with pytest.raises(ValueError, match="score"):
        views.readmit_at(scores[:10])


def test_margin_readmit_watch_asks_at_hesitations_and_fires_when_rows_come_back():
    from types import SimpleNamespace

    from asymagent.context.recall import MAX_READMIT_ASKS, RecallWatch

    views = SimpleNamespace(message_spans=lambda: [], original_text=lambda i: "")
    asked = []

    def readmit(prefix):
        asked.append(list(prefix))
        return [3] if len(asked) == 2 else []

    recorder = SimpleNamespace(entries=[SimpleNamespace(top=[(5, -0.1), (7, -3.0)]),   # sure
                                        SimpleNamespace(top=[(6, -0.6), (8, -0.9)]),   # hesitates
                                        SimpleNamespace(top=[(9, -0.6), (4, -0.7)])])  # hesitates
    watch = RecallWatch(views, [1, 2], [1], evidence="margin_readmit", margin=0.5, readmit=readmit)
    assert watch.needs_logprobs
    watch.recorder = recorder
    assert watch([5, 6, 9], 0) and watch.position == 2 and watch.restored == [3] and not watch.escalate
    assert asked == [[1, 2, 5], [1, 2, 5, 6]]
    tired = RecallWatch(views, [1, 2], [1], evidence="margin_readmit", margin=10.0, readmit=lambda p: [])
    tired.recorder = SimpleNamespace(entries=[SimpleNamespace(top=[(1, -0.1), (2, -0.2)])] * 9)
    assert not tired(list(range(9)), 0) and tired.asks == MAX_READMIT_ASKS


def test_margin_readmit_through_the_engine_re_decodes_on_the_grown_view(smollm_tokenizer):
    """A chat turn under margin_readmit (every position hesitates: margin 100 nats; every cut row
    passes: ratio 1e-9): the drafter's attention brings rows back, the step is decoded again on
    the grown view (one recall, a longer verifier view than plain asym's, the newest message
    re-prefilled only), and the same request gives the same tokens."""
    from asymagent import Engine
    from asymagent.spec_config import SpecConfig
    from conftest import make_tiny_llama

    tokenizer = smollm_tokenizer
    verifier = make_tiny_llama(vocab_size=49152, layers=2, hidden=64, seed=0, max_positions=8192)
    drafter = make_tiny_llama(vocab_size=49152, layers=1, hidden=64, seed=1, max_positions=8192)
    config = CompressionConfig(max_recalls=1, recall_evidence="margin_readmit", recall_margin=100.0,
                               readmit_tokens=64, readmit_ratio=1e-9)
    e = Engine(verifier=verifier, drafter=drafter, tokenizer=tokenizer, spec=SpecConfig(k=2),
               compression=config)
    plain = Engine(verifier=verifier, drafter=drafter, tokenizer=tokenizer, spec=SpecConfig(k=2))
    messages = _agent_history(2)
    p = plain.chat(messages, mode="asym", max_new_tokens=6, cache_key="p")
    r = e.chat(messages, mode="asym", max_new_tokens=6, cache_key="r")
    assert r.stats.recalls == 1 and r.stats.verifier_context_tokens > p.stats.verifier_context_tokens
    assert r.stats.drafter_prefill_tokens >= r.stats.full_context_tokens  # the drafter read it all
    assert 0 < r.stats.recall_prefill_tokens < r.stats.verifier_context_tokens  # the newest message only
    again = Engine(verifier=verifier, drafter=drafter, tokenizer=tokenizer, spec=SpecConfig(k=2),
                   compression=config).chat(messages, mode="asym", max_new_tokens=6, cache_key="r2")
    assert again.token_ids == r.token_ids


def test_attention_fn_reads_the_last_rows_asked_in_the_upper_layers(smollm_tokenizer):
    """drafter_attention_fn(..., layers="upper")(ids, rows=R): the attention the last R rows of
    the ids give each position in the drafter's upper half of layers, the same as prefilling the
    rest and capturing those R rows; rows=None reads ATTENTION_ROWS rows."""
    from conftest import make_tiny_llama

    from asymagent import Engine
    from asymagent.chat.session import ATTENTION_ROWS, drafter_attention_fn
    from asymagent.kv.lean_forward import general_loop

    model = make_tiny_llama(vocab_size=49152, layers=4, hidden=64, seed=4, max_positions=4096)
    engine = Engine(verifier=model, drafter=model, tokenizer=smollm_tokenizer)
    ids = smollm_tokenizer(" ".join(f"row {i} -> team T{i % 7}" for i in range(40)))["input_ids"]
    fn = drafter_attention_fn(engine, "k1", [0], pool="max", layers="upper")
    for rows in (20, None):
        scores = fn(ids, rows)
        read = rows or ATTENTION_ROWS
        cache = engine.caches.session(f"ref{read}").get("drafter_full")
        with torch.inference_mode():
            cache.prefill(ids[:-read])
            with capture_attention(read, per_layer=True) as capture, general_loop():
                cache.forward_hidden(ids[-read:])
        expected = capture.scores(len(ids), "max", range(2, 4))
        assert torch.allclose(torch.tensor(scores), torch.tensor(expected), atol=1e-6)
    assert fn(ids, 20) != fn(ids, None)  # another reading


def test_margin_readmit_reads_the_answers_rows_when_asked(smollm_tokenizer, monkeypatch):
    """recall_evidence "margin_readmit" with attention_rows "lookahead" (preset
    id_keep_margin_readmit_upper): at a hesitation the drafter reads the rows of the answer so far
    (the tokens after the prompt, at least ATTENTION_ROWS) in its upper layers; the default reads
    the last ATTENTION_ROWS rows in every layer. Both recall, and a request repeated gives the
    same tokens."""
    import asymagent.chat.session as session_mod
    from asymagent import Engine
    from asymagent.spec_config import SpecConfig
    from conftest import make_tiny_llama

    asked = []
    real = session_mod.drafter_attention_fn

    def spy(*args, **kwargs):
        fn = real(*args, **kwargs)

        def wrapped(ids, rows=None):
            asked.append((kwargs.get("layers", "all"), len(ids), rows))
            return fn(ids, rows)
        return wrapped

    monkeypatch.setattr(session_mod, "drafter_attention_fn", spy)
    verifier = make_tiny_llama(vocab_size=49152, layers=2, hidden=64, seed=0, max_positions=8192)
    drafter = make_tiny_llama(vocab_size=49152, layers=2, hidden=64, seed=1, max_positions=8192)
    base = dict(max_recalls=1, recall_evidence="margin_readmit", recall_margin=100.0, readmit_tokens=64,
                readmit_ratio=1e-9)
    messages = _agent_history(2)
    outputs = {}
    for name, extra in (("default", {}), ("answer", {"attention_rows": "lookahead", "attention_layers": "upper"})):
        asked.clear()
        e = Engine(verifier=verifier, drafter=drafter, tokenizer=smollm_tokenizer, spec=SpecConfig(k=2),
                   compression=CompressionConfig(**base, **extra))
        r = e.chat(messages, mode="asym", max_new_tokens=12, cache_key=name)
        assert r.stats.recalls == 1 and asked
        layers, length, rows = asked[0]
        if name == "default":
            assert layers == "all" and rows is None
        else:
            prompt = r.stats.full_context_tokens
            assert layers == "upper" and rows == max(session_mod.ATTENTION_ROWS, length - prompt)
        outputs[name] = r.token_ids
        again = Engine(verifier=verifier, drafter=drafter, tokenizer=smollm_tokenizer, spec=SpecConfig(k=2),
                       compression=CompressionConfig(**base, **extra)).chat(
            messages, mode="asym", max_new_tokens=12, cache_key=name + "2")
        assert again.token_ids == r.token_ids
    preset = CompressionConfig.preset("id_keep_margin_readmit_upper")
    assert (preset.recall_evidence, preset.attention_rows, preset.attention_layers) == \
        ("margin_readmit", "lookahead", "upper") and not preset.reads_attention()
