"""Teacher data of the feature head on a tiny random verifier: the chunked LM head gives the
model's own top-k, trace conversations read as the engine renders them (tools in the prompt, a
whole episode), the suites' train split refuses what measures, and held-out windows cover a sequence."""

from __future__ import annotations

import pytest
import torch

from asymagent.context.views import ContextViews
from asymagent.training import feature_data
from asymagent.training.config import TrainConfig
from asymagent.training.feature_data import teacher_forward, trace_sequences
from asymagent.training.feature_train import run, windows

VOCAB = 49152  # the SmolLM2 tokenizer's vocabulary


def _model():
    from conftest import make_tiny_llama

    return make_tiny_llama(vocab_size=VOCAB, layers=4, hidden=64, heads=4, kv_heads=2, seed=0).eval()


def test_chunked_lm_head_matches_the_full_logits(monkeypatch):
    model = _model()
    ids = torch.randint(3, VOCAB, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    monkeypatch.setattr(feature_data, "LOGIT_CHUNK", 8)  # 5 chunks, the last one short
    got = teacher_forward(model, ids, (1, 2), topk=5)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    logits = out.logits[0].float()  # [T, V]
    want_lp, want_ids = torch.log_softmax(logits, -1).topk(5, dim=-1)
    assert got.top_ids.shape == (37, 5) and got.feats.shape == (37, 128)
    assert torch.equal(got.top_ids, want_ids)
    torch.testing.assert_close(got.top_lp, want_lp, atol=1e-4, rtol=1e-4)
    feats = torch.cat([out.hidden_states[2][0], out.hidden_states[3][0]], -1).to(torch.bfloat16)
    assert torch.equal(got.feats, feats)


def _suite_trace_file(tmp_path):
    from asymagent.evals.suites.train_traces import suite_traces
    from asymagent.traces import write_traces

    path = tmp_path / "train.jsonl"
    write_traces(path, suite_traces(["records", "injection_call"], [1, 2]))
    return path


def test_suite_train_split_refuses_what_measures():
    from asymagent.evals.suites.environments import TEST_SEEDS
    from asymagent.evals.suites.train_traces import parse_seeds, suite_traces

    assert parse_seeds("1-3,7") == [1, 2, 3, 7]
    with pytest.raises(ValueError, match="bench"):
        suite_traces(["records"], [0])
    with pytest.raises(ValueError, match="test seed"):
        suite_traces(["records"], [TEST_SEEDS[0]])
    with pytest.raises(ValueError, match="held out"):
        suite_traces(["dispatch"], [1])
    got = suite_traces(["records", "tickets"], [1, 2])
    assert [ex.id for ex in got] == ["records:1", "tickets:1", "records:2", "tickets:2"]
    assert all(ex.tools and ex.expected["role"] == "assistant" for ex in got)


def test_trace_sequences_are_the_engines_full_view(tmp_path, smollm_tokenizer):
    from asymagent.evals.suites.environments import make_env, oracle_episode

    path = _suite_trace_file(tmp_path)
    seqs = trace_sequences(smollm_tokenizer, [str(path)], 100000)
    assert len(seqs) == 4  # one conversation per episode
    task, history = oracle_episode(make_env("records"), 1)
    full = list(ContextViews(smollm_tokenizer).build(history, task.tools).full_ids)
    assert seqs[0] == full and len(full) > 1000  # the whole episode, tools in the prompt
    assert trace_sequences(smollm_tokenizer, [str(path)], 300)[0] == full[:300]  # a prefix


def test_windows_cover_a_sequence():
    seq = feature_data.TeacherSeq(ids=torch.arange(23), feats=torch.zeros(23, 4),
                                  top_ids=torch.zeros(23, 2, dtype=torch.long), top_lp=torch.zeros(23, 2))
    ws = windows(seq, 8)
    assert [w[0].tolist()[0] for w in ws] == [0, 8, 16]
    assert sum(len(w[0]) - 1 for w in ws) == 22  # each position t >= 1 scored once


def test_training_on_suite_traces_without_self_turns(tmp_path, smollm_tokenizer):
    from asymagent.modeling.loading import LoadedModel

    loaded = LoadedModel(_model(), smollm_tokenizer, "tiny-random", "sha-of-tiny")
    cfg = TrainConfig(out=str(tmp_path / "run"), kind="feature", max_steps=3, seq_len=64, batch_size=1,
                      lr=1e-3, self_turns=0, feature_tokens=4000, feature_vocab=3000, ttt_steps=2,
                      feature_intermediate=96, feature_context=1500, no_progress=True, threads=1,
                      traces=[str(_suite_trace_file(tmp_path))])
    card = run(cfg, loaded=loaded)
    # the trace conversations (records: 1500 tokens each) reached the teacher whole, not cut to
    # --seq-len + 1 = 65 (then 4000 tokens would take > 60 sequences), each one beside one synthetic
    assert card["teacher"]["tokens"] >= 4000 and card["teacher"]["sequences"] <= 8
    assert len(card["heldout_agreement_by_step"]) == 2
    assert all(0.0 <= a <= 1.0 for a in card["heldout_agreement_by_step"])
