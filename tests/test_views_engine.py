"""Views through the engine: a 10-step tool-heavy conversation fed step by step to
`engine.chat(mode="asym")` reuses the KV caches, so prefill totals stay near the final context."""

from __future__ import annotations

import pytest

from asymagent.engine import Engine
from asymagent.spec_config import SpecConfig
from asymagent.context.views import CompressionConfig
from test_views_synthetic import TOOLS, agent_conversation

STEPS = 10
NEW_TOKENS = 6


def run_agent(engine: Engine, cache_key: str) -> list:
    """Feed the synthetic trace step by step: [StepStats] of the 10 generation points.

    The assistant message appended after each call is what the model said (its text) plus the
    trace's tool call, and then the trace's tool output, like an agent loop would.
    """
    trace = agent_conversation(STEPS, seed=2)
    messages = trace[:2]  # system + user
    steps = []
    for i in range(STEPS):
        r = engine.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=NEW_TOKENS,
                        temperature=0.0, cache_key=cache_key)
        steps.append(r.stats)
        call, output = trace[2 + 2 * i], trace[3 + 2 * i]
        messages = messages + [{**call, "content": r.text or None}, output]
    return steps


@pytest.fixture(scope="module")
def engine(smollm_tokenizer, tiny_llama_factory):
    # Tiny random models over the real 49152-token vocabulary: the views are real, the models
    # only have to be cheap. max_positions covers the ~7k-token full view of 10 steps.
    verifier = tiny_llama_factory(vocab_size=49152, layers=2, hidden=64, seed=0, max_positions=16384)
    drafter = tiny_llama_factory(vocab_size=49152, layers=1, hidden=64, seed=1, max_positions=16384)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=smollm_tokenizer,
                  spec=SpecConfig(k=2), compression=CompressionConfig.default())


@pytest.fixture(scope="module")
def tiny_llama_factory():
    from conftest import make_tiny_llama

    return make_tiny_llama


def test_prefill_totals_stay_within_1_3x_of_final_context(engine):
    steps = run_agent(engine, "views-default")
    last = steps[-1]
    generated = sum(s.new_tokens for s in steps)
    ver_prefill = sum(s.verifier_prefill_tokens for s in steps)
    dr_prefill = sum(s.drafter_prefill_tokens for s in steps)
    print(f"\n10 steps: full {last.full_context_tokens}, verifier {last.verifier_context_tokens} "
          f"(ratio {last.compression_ratio:.3f}); verifier prefill {ver_prefill}, drafter "
          f"prefill {dr_prefill}, generated {generated}, rewrites {sum(s.rewrites for s in steps)}")
    assert last.compression_ratio <= 0.5  # tool-output-heavy: the default at least halves it
    assert sum(s.rewrites for s in steps) == 0  # the default view is append-only
    # The bound: prefill summed over steps within 1.3x of the final context plus the
    # generated tokens (measured 0.97x on 2026-12-04: 1754 vs 1754 + 60; 1.22x on 2026-12-02,
    # when step 1 moved the verifier from its full-view cache to its compressed-view cache and
    # prefilled that one from scratch; docs/views.md, docs/log.md).
    assert ver_prefill <= 1.3 * (last.verifier_context_tokens + generated)
    # The drafter keeps its full-view cache, plus the compressed base view when beta > 0, cda or
    # escalate_jsd need it (not with the defaults): the bound covers both.
    assert dr_prefill <= 1.3 * (last.full_context_tokens + last.verifier_context_tokens + 2 * generated)


def test_recent_turns_rewrites_reach_step_stats(engine):
    engine_rt = Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
                       spec=SpecConfig(k=2), compression=CompressionConfig(compressors=[
                           "tool_output", {"type": "recent_turns", "keep_turns": 2,
                                           "demote_every": 3}]))
    steps = run_agent(engine_rt, "views-rt")
    # Step s (0-based) sees s+1 turns (the user message, then one per earlier call), so the
    # frontier floor((T-2)/3)*3 first moves at T=5 (step 4) and again at T=8 (step 7).
    assert [s.rewrites for s in steps] == [0, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    print(f"\nrecent_turns(2, 3): verifier context {steps[-1].verifier_context_tokens}, verifier "
          f"prefill per step {[s.verifier_prefill_tokens for s in steps]}")
    # Between rewrites the verifier prefills only what was appended since the previous step
    # (its context growth, plus at most the previous step's generated tokens re-tokenised and
    # the one re-fed token); a rewrite re-prefills from the first demoted message on, more than
    # that. Step 0 is the first prefill and step 1 the first with a compressed view.
    for prev, step in zip(steps[1:], steps[2:]):
        appended = step.verifier_context_tokens - prev.verifier_context_tokens
        slack = prev.new_tokens + 1
        if step.rewrites:
            assert step.verifier_prefill_tokens > appended + slack
        else:
            assert step.verifier_prefill_tokens <= appended + slack


def test_surprisal_uses_the_drafters_prefill_log_probs(engine):
    """Surprisal pruning through the engine: the log-probs come from the drafter's full-view
    prefill, so the drafter's prefill totals obey the same 1.3x bound (no extra model pass)."""
    engine_s = Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
                      spec=SpecConfig(k=2), compression=CompressionConfig(compressors=[
                          {"type": "surprisal", "keep_ratio": 0.5}]))
    steps = run_agent(engine_s, "views-surprisal")
    last = steps[-1]
    generated = sum(s.new_tokens for s in steps)
    dr_prefill = sum(s.drafter_prefill_tokens for s in steps)
    print(f"surprisal(0.5): ratio {last.compression_ratio:.3f}, drafter prefill {dr_prefill}, "
          f"verifier prefill {sum(s.verifier_prefill_tokens for s in steps)}")
    # Tool outputs are ~88% of this context; dropping half of their tokens (numbers and JSON
    # punctuation stay) lands near 0.12 + 0.88 * 0.5 = 0.56 (0.559 measured).
    assert 0.4 < last.compression_ratio < 0.8
    assert sum(s.rewrites for s in steps) == 0  # decided once per message, append-only
    assert dr_prefill <= 1.3 * (last.full_context_tokens + last.verifier_context_tokens + 2 * generated)


def test_recall_restores_the_output_and_decodes_the_turn_again(engine, monkeypatch):
    """Recall through Engine.chat: evidence during decoding (stubbed to point into the last tool
    output at the first output token) stops the pass, restores that output whole, the turn
    decodes again on the restored view, and StepStats counts it."""
    import numpy as np

    from asymagent.context import recall

    engine_r = Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
                      spec=SpecConfig(k=2), compression=CompressionConfig(max_recalls=1))
    messages = agent_conversation(1, seed=2)[:4]  # system, user, call, a long output: the output is cut
    calls = []

    def evidence(kind, full_ids, compressed_ids, emitted, **kw):
        calls.append(len(full_ids))
        return np.asarray([len(full_ids) - 20])  # a position inside the last output

    monkeypatch.setattr(recall, "evidence_sources", evidence)
    r = engine_r.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=4, cache_key="recall")
    assert r.stats.recalls == 1 and len(calls) == 1  # fired at the first token; the last pass unwatched
    assert r.stats.verifier_context_tokens == r.stats.full_context_tokens  # the output came back whole
    assert 0 < r.stats.recall_prefill_tokens < r.stats.verifier_prefill_tokens
    assert r.finish_reason in ("stop", "length", "tool_calls")
    plain = engine.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=4, cache_key="no-recall")
    assert plain.stats.recalls == 0 and plain.stats.recall_prefill_tokens == 0


def test_recall_during_decoding_is_deterministic_whatever_the_round_layout(engine, monkeypatch):
    """The watch checks every emitted position in order, so where a recall fires depends on the
    tokens only: K=1, 2, 4 (other round layouts, fresh engines) give the same output and the
    same recall."""
    import numpy as np

    from asymagent.context import recall
    from asymagent.context.views import ContextViews

    messages = agent_conversation(1, seed=3)[:4]
    prompt = len(ContextViews(engine.tokenizer, CompressionConfig(), engine.chat_format)
                 .build(messages, TOOLS).full_ids)

    def evidence(kind, full_ids, compressed_ids, emitted, **kw):  # fires at output position 3
        return np.asarray([prompt - 20]) if len(full_ids) - prompt == 3 else np.zeros(0, dtype=np.int64)

    monkeypatch.setattr(recall, "evidence_sources", evidence)
    outs = []
    for k in (1, 2, 4):
        e = Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
                   spec=SpecConfig(k=k, adaptive_k=False),
                   compression=CompressionConfig(max_recalls=1, recall_evidence="copy_any"))
        r = e.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=12, cache_key=f"det{k}")
        outs.append((r.token_ids, r.stats.recalls, r.stats.verifier_context_tokens == r.stats.full_context_tokens))
    assert outs[0] == outs[1] == outs[2]
    assert outs[0][1] == 1 and outs[0][2] and len(outs[0][0]) > 3  # it did fire and restore


def test_margin_escalation_decodes_the_step_again_on_the_full_view(engine):
    """Evidence "margin": where the compressed verifier hesitates (here: any gap, margin 100 nats)
    the step is decoded again on the full view in mode spec, so its output is mode full's; the
    result carries no log-probs (none were asked) and counts one recall; a view that removed
    nothing never escalates."""
    messages = agent_conversation(1, seed=2)[:4]  # the last output is cut
    e = Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
               spec=SpecConfig(k=2), compression=CompressionConfig(
                   max_recalls=1, recall_evidence="margin", recall_margin=100.0))
    r = e.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key="margin")
    full = e.chat(messages, tools=TOOLS, mode="full", max_new_tokens=8, cache_key="margin-full")
    plain = engine.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key="margin-plain")
    assert r.token_ids == full.token_ids and r.stats.recalls == 1 and r.logprobs is None
    assert r.stats.mode == "asym" and r.stats.recall_prefill_tokens >= len(full.token_ids)
    assert plain.stats.recalls == 0
    short = e.chat(messages[:2], tools=TOOLS, mode="asym", max_new_tokens=4, cache_key="margin-short")
    assert short.stats.recalls == 0  # nothing compressed: nothing to escalate for


def test_margin_watch_reads_the_recorders_top_two(smollm_tokenizer):
    from types import SimpleNamespace

    from asymagent.context.recall import RecallWatch

    views = SimpleNamespace(message_spans=lambda: [], original_text=lambda i: "")
    watch = RecallWatch(views, [1, 2, 3], [1, 3], evidence="margin", margin=0.5)
    assert watch.needs_logprobs and not watch([5, 6], 0)  # no recorder: never fires
    watch.recorder = SimpleNamespace(entries=[SimpleNamespace(top=[(5, -0.1), (7, -3.0)]),
                                              SimpleNamespace(top=[(6, -0.6), (8, -0.9)])])
    assert watch([5], 0) is False and watch.checked == 1
    assert watch([5, 6, 9], 1) and watch.position == 1 and watch.escalate  # 0.3 nats < 0.5
    same = RecallWatch(views, [1, 2], [1, 2], evidence="margin")
    same.recorder = watch.recorder
    assert not same([5, 6], 0)  # nothing was removed
    # a compressed output that spells out a tool call: no escalation (injection)
    tool = SimpleNamespace(role="tool", same=False)
    injected = SimpleNamespace(message_spans=lambda: [tool],
                               original_text=lambda i: 'do {"name": "pay", "arguments": {"to": "x"}}')
    guarded = RecallWatch(injected, [1, 2, 3], [1, 3], evidence="margin")
    guarded.recorder = watch.recorder
    assert not guarded([5, 6], 0)


def test_margin_watch_asks_the_drafters_vote_between_emitted_and_runner_up():
    """With a vote, a hesitation escalates only where the vote's score is above vote_min; the
    vote is asked with both views' prefixes and (emitted token, the best other of the top two),
    and every vote asked is kept (position, score)."""
    from types import SimpleNamespace

    from asymagent.context.recall import RecallWatch

    views = SimpleNamespace(message_spans=lambda: [], original_text=lambda i: "")
    asked = []

    def vote(full, compressed, a, b):
        asked.append((list(full), list(compressed), a, b))
        return 0.4 if len(asked) == 1 else 2.0

    recorder = SimpleNamespace(entries=[SimpleNamespace(top=[(5, -0.6), (7, -0.9)]),
                                        SimpleNamespace(top=[(8, -0.6), (6, -0.7)])])
    watch = RecallWatch(views, [1, 2, 3], [1, 3], evidence="margin", margin=0.5, vote=vote, vote_min=1.0)
    watch.recorder = recorder
    assert watch([5, 6], 0) and watch.position == 1 and watch.escalate
    # position 0: vetoed (0.4 <= 1.0); position 1: the emitted 6 is the runner-up, so b is 8
    assert asked == [([1, 2, 3], [1, 3], 5, 7), ([1, 2, 3, 5], [1, 3, 5], 6, 8)]
    assert watch.votes == [(0, 0.4), (1, 2.0)]
    never = RecallWatch(views, [1, 2, 3], [1, 3], evidence="margin", margin=0.5,
                        vote=lambda *a: -1.0, vote_min=0.0)
    never.recorder = recorder
    assert not never([5, 6], 0) and never.position is None and len(never.votes) == 2


def _vote_engine(engine, **config):
    return Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
                  spec=SpecConfig(k=2), compression=CompressionConfig(
                      max_recalls=1, recall_evidence="margin", recall_margin=100.0, **config))


def test_margin_vote_vetoes_keep_asyms_output_and_assents_give_fulls(engine):
    """Every position hesitates (margin 100 nats). A vote that can never pass (vote_min 1e9)
    keeps the step on the compressed view: asym's own output, every vote counted as a veto; one
    that always passes (vote_min -1e9) escalates at the first token: full's output. The vote's
    drafter tokens are counted in the step's drafter prefill; same output on a second run."""
    messages = agent_conversation(1, seed=2)[:4]  # the last output is cut
    plain = engine.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key="vote-plain")
    full = engine.chat(messages, tools=TOOLS, mode="full", max_new_tokens=8, cache_key="vote-full")
    for kind in ("full", "delta"):
        veto = _vote_engine(engine, recall_vote=kind, recall_vote_min=1e9)
        r = veto.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key=f"veto-{kind}")
        assert r.token_ids == plain.token_ids and r.stats.recalls == 0
        assert r.stats.recall_votes == len(r.token_ids) == r.stats.recall_vetoes
        assert r.stats.drafter_prefill_tokens > plain.stats.drafter_prefill_tokens
        again = veto.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key=f"veto2-{kind}")
        assert again.token_ids == r.token_ids
        assent = _vote_engine(engine, recall_vote=kind, recall_vote_min=-1e9)
        a = assent.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key=f"assent-{kind}")
        assert a.token_ids == full.token_ids and a.stats.recalls == 1
        assert a.stats.recall_votes == 1 and a.stats.recall_vetoes == 0


def test_drafter_vote_scores_are_the_drafters_log_prob_differences(engine):
    """drafter_vote_fn: "full" is log p_F(b) - log p_F(a) of a fresh drafter forward over the full
    ids; "delta" subtracts the same on the compressed ids; a later vote on a longer prefix feeds
    only the tokens its caches lack."""
    import torch

    from asymagent.chat.session import drafter_vote_fn

    full_ids = list(range(100, 160))
    compressed_ids = full_ids[:10] + full_ids[40:]

    def fresh(ids):
        with torch.inference_mode():
            logits = engine.drafter(input_ids=torch.tensor([ids])).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)

    counter = [0]
    vote = drafter_vote_fn(engine, "vote-fn", counter, "delta")
    a, b = 7, 11
    lf, lc = fresh(full_ids), fresh(compressed_ids)
    want = float(lf[b] - lf[a]) - float(lc[b] - lc[a])
    assert vote(full_ids, compressed_ids, a, b) == pytest.approx(want, abs=2e-3)
    assert counter[0] == len(full_ids) + len(compressed_ids)
    longer_f, longer_c = full_ids + [5, 6], compressed_ids + [5, 6]
    vote(longer_f, longer_c, a, b)
    assert counter[0] == len(full_ids) + len(compressed_ids) + 4  # only the two new tokens of each
    only_full = drafter_vote_fn(engine, "vote-fn-full", [0], "full")
    assert only_full(full_ids, compressed_ids, a, b) == pytest.approx(float(lf[b] - lf[a]), abs=2e-3)
    with pytest.raises(ValueError, match="recall_vote"):
        drafter_vote_fn(engine, "x", [0], "sometimes")


def test_margin_escalations_full_pass_is_offered_the_first_pass_as_drafts(engine, monkeypatch):
    """The escalated pass (mode spec on the full view) gets the interrupted pass's tokens as
    copied drafts (GenerationRequest.draft_hint); its output is still mode full's."""
    messages = agent_conversation(1, seed=2)[:4]
    e = _vote_engine(engine)  # margin 100 nats, no vote: escalates at its first check
    passes = []
    inner = e._generate

    def spy(prompt_ids, compressed_ids, request, constraint=None, interrupt=None):
        result = inner(prompt_ids, compressed_ids, request, constraint=constraint, interrupt=interrupt)
        passes.append((request.mode, tuple(request.draft_hint), list(result.token_ids)))
        return result

    monkeypatch.setattr(e, "_generate", spy)
    r = e.chat(messages, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key="hint")
    full = engine.chat(messages, tools=TOOLS, mode="full", max_new_tokens=8, cache_key="hint-full")
    assert [p[0] for p in passes] == ["asym", "spec"] and r.stats.recalls == 1
    assert passes[1][1] == tuple(passes[0][2]) and len(passes[0][2]) >= 1
    assert r.token_ids == full.token_ids


def test_margin_restore_brings_every_cut_output_back_into_the_one_cache(engine):
    """recall_escalation "restore": at a hesitation (any gap: margin 100 nats) every cut tool
    output comes back whole into the verifier's one cache and the step is decoded again there:
    the view then equals the full view, so the output is mode full's; no second (full-view)
    verifier cache is filled; the restore is sticky, so the next step prefills only its new
    message and, its new output cut again, a later hesitation restores just that one."""
    trace = agent_conversation(3, seed=2)
    first, second = trace[:4], trace[:6]  # each ends on a cut tool output
    cfg = CompressionConfig(max_recalls=1, recall_evidence="margin", recall_margin=100.0,
                            recall_escalation="restore")
    e = Engine(verifier=engine.verifier, drafter=engine.drafter, tokenizer=engine.tokenizer,
               spec=SpecConfig(k=2), compression=cfg)
    r = e.chat(first, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key="restore")
    full = e.chat(first, tools=TOOLS, mode="full", max_new_tokens=8, cache_key="restore-full")
    assert r.token_ids == full.token_ids and r.stats.recalls == 1
    assert r.stats.verifier_context_tokens == r.stats.full_context_tokens  # the view is whole
    assert "verifier_full" not in e.caches.session("restore").caches
    r2 = e.chat(second, tools=TOOLS, mode="asym", max_new_tokens=8, cache_key="restore")
    full2 = e.chat(second, tools=TOOLS, mode="full", max_new_tokens=8, cache_key="restore-full")
    assert r2.token_ids == full2.token_ids and r2.stats.recalls == 1
    # the first pass prefilled the new messages (their output cut); the restore re-prefilled
    # from that output only: far less than the whole history
    assert r2.stats.verifier_prefill_tokens < r2.stats.full_context_tokens // 2
    with pytest.raises(Exception):
        CompressionConfig(recall_escalation="both")
